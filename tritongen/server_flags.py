"""`server_flags.txt`: the tritonserver flags `render` writes beside the models (rate-limiter
resources). One reader, so every command that starts or simulates a server skips the same
comment and blank lines; the Kubernetes pod's `grep -v '^#'` (k8s.py) reads the same file."""

from __future__ import annotations

from pathlib import Path

from tritongen.core.file_names import SERVER_FLAGS_FILE

__all__ = ["SERVER_FLAGS_FILE", "flags_near", "read_flags_file", "server_flags_from"]


def read_flags_file(path: Path) -> list[str]:
    """The flags of a flags file, one a line; blank lines and `#` comments are skipped."""
    lines = (line.strip() for line in Path(path).read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def server_flags_from(repo: Path) -> list[str]:
    """The flags `render` wrote into REPO, or none when it wrote no flags file."""
    path = Path(repo) / SERVER_FLAGS_FILE
    return read_flags_file(path) if path.is_file() else []


def flags_near(config: Path) -> list[str]:
    """The flags of the repository a `<repo>/<model>/config.pbtxt` sits in."""
    return server_flags_from(Path(config).resolve().parent.parent)
