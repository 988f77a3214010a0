"""What `tritongen check` reports: one `Finding` per broken or suspicious setting.

A finding is a result, not an exception: the CLI exits 1 when any finding is an error and 0 when
there are only warnings. `error` means the real tritonserver refuses the model (or hangs or crashes
on it) when it loads it; `warning` means the server accepts it but the setting is ignored, has no
effect, or only fails under conditions the checker cannot see (host without GPU, rate limiting on);
`note` means nothing is wrong that tritongen can see but something was not checked (a field of a
newer Triton release whose load rules tritongen does not model), said so rather than passed silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["error", "warning", "note"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "note")


@dataclass(frozen=True)
class Finding:
    """One problem in one model's configuration or files.

    `field` is a dotted path into Triton's ModelConfig with indices for repeated messages, e.g.
    `dynamic_batching.preferred_batch_size` or `instance_group[1].gpus`; `""` for the model as a
    whole (a missing file, a directory). `message` names the model, the field and the values
    involved; `fix` says what to change. `path` and `line` locate it in a file when known.
    """

    severity: Severity
    code: str
    model: str
    field: str
    message: str
    fix: str
    path: str | None = None
    line: int | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")
        if not self.code:
            raise ValueError("a finding needs a code")

    def located(self, path: str | None, line: int | None = None) -> "Finding":
        """The same finding with a file location (existing values win)."""
        return dataclasses.replace(
            self,
            path=self.path if self.path is not None else path,
            line=self.line if self.line is not None else line,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def count_errors(findings: Iterable[Finding]) -> int:
    return sum(1 for f in findings if f.severity == "error")


def count_warnings(findings: Iterable[Finding]) -> int:
    return sum(1 for f in findings if f.severity == "warning")


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Stable order for output: by file, line, then code."""
    return sorted(
        findings,
        key=lambda f: (f.path or "", f.model, f.line if f.line is not None else 0, f.code, f.field),
    )
