"""perf_analyzer, the C++ load generator users run against Triton: found or unpacked from the
tritonclient wheel (nvidia-pytriton bundles the libraries it links), and one closed-loop measurement
read from its CSV. Shared by bench_vs_model_analyzer (Model Analyzer drives it) and bench_sidecar (the
pass-through goals are judged with it, as the issue that set them measured them).
"""

from __future__ import annotations

import csv
import glob
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from bench.rig import ROOT
from tritongen.server import TritonInstall

PA_CACHE = ROOT / "bench" / ".perf-analyzer"
PA_WHEEL = "tritonclient==2.51.0"  # the last wheel with perf_analyzer built for glibc < 2.38; the server is 2.51


def venv_bin() -> Path:
    return Path(sys.executable).parent


def run_cmd(cmd: list[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _pa_runs(path: str) -> str | None:
    """perf_analyzer's version line, or None if this one does not run here."""
    try:
        r = run_cmd([path, "--version"], timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    out = (r.stdout + r.stderr).strip()
    return out.splitlines()[-1] if r.returncode == 0 and "Perf Analyzer" in out else None


def _link_missing_libs(binary: Path, libdir: Path) -> list[str]:
    """Symlink into `libdir` every library `binary` lacks that nvidia-pytriton bundles under a hashed
    name (libb64.so.0d -> libb64-98cb6333.so.0d, libcudart.so.12 -> libcudart-09529672.so.12.6.77).
    Returns the libraries still missing."""
    bundled = TritonInstall.locate().libs
    libdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, LD_LIBRARY_PATH=str(libdir))
    missing = [ln.split("=>")[0].strip() for ln in run_cmd(["ldd", str(binary)], 30, env=env).stdout.splitlines()
               if "not found" in ln]
    still = []
    for soname in missing:
        stem, _, version = soname.partition(".so")
        found = sorted(glob.glob(str(bundled / f"{stem}-*.so{version}*")))
        if found:
            (libdir / soname).unlink(missing_ok=True)
            (libdir / soname).symlink_to(found[0])
        else:
            still.append(soname)
    return still


def install_perf_analyzer() -> tuple[str | None, str]:
    """The tritonclient 2.51.0 wheel's perf_analyzer, unpacked into bench/.perf-analyzer (not installed:
    the project keeps tritonclient 2.73), with a wrapper that sets LD_LIBRARY_PATH."""
    wrapper = PA_CACHE / "perf_analyzer"
    if wrapper.exists() and _pa_runs(str(wrapper)):
        return str(wrapper), "cached"
    wheels = PA_CACHE / "wheel"
    r = run_cmd([str(venv_bin() / "pip"), "download", "--no-deps", "--only-binary=:all:", "--quiet",
                 "-d", str(wheels), PA_WHEEL], timeout=600)
    found = sorted(wheels.glob("tritonclient-*.whl"))
    if r.returncode != 0 or not found:
        return None, f"pip download {PA_WHEEL} failed: {tail(r.stderr, 1)[:300]}"
    with zipfile.ZipFile(found[0]) as wheel:
        member = next((n for n in wheel.namelist() if n.endswith("/data/bin/perf_analyzer")), None)
        if member is None:
            return None, f"{found[0].name} holds no bin/perf_analyzer"
        binary = PA_CACHE / "bin" / "perf_analyzer"
        binary.parent.mkdir(parents=True, exist_ok=True)
        binary.write_bytes(wheel.read(member))
        binary.chmod(0o755)
    shutil.rmtree(wheels, ignore_errors=True)
    still = _link_missing_libs(binary, PA_CACHE / "lib")
    if still:
        return None, (f"perf_analyzer of {PA_WHEEL} needs {', '.join(still)}, which nvidia-pytriton does not bundle "
                      "(Debian/Ubuntu: apt-get install libb64-0d)")
    wrapper.write_text("#!/bin/sh\n# perf_analyzer of the " + PA_WHEEL + " wheel; its missing libraries linked from "
                       "nvidia-pytriton's\n"
                       f"export LD_LIBRARY_PATH={shlex.quote(str(PA_CACHE / 'lib'))}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n"
                       f"exec {shlex.quote(str(binary))} \"$@\"\n")
    wrapper.chmod(0o755)
    if not _pa_runs(str(wrapper)):
        out = run_cmd([str(wrapper), "--version"], 30)
        return None, f"perf_analyzer of {PA_WHEEL} does not run here: {tail(out.stdout + out.stderr, 3)}"
    return str(wrapper), "installed"


def find_perf_analyzer() -> tuple[str | None, str]:
    """(path, how it was found) or (None, why not)."""
    tried = []
    for path in (os.environ.get("PERF_ANALYZER"), shutil.which("perf_analyzer"), str(venv_bin() / "perf_analyzer")):
        if path and path not in tried and os.access(path, os.X_OK):
            tried.append(path)
            version = _pa_runs(path)
            if version:
                return path, f"{path} ({version})"
    path, how = install_perf_analyzer()
    if path is None:
        note = f"; tried {', '.join(tried)} (do not run here)" if tried else ""
        return None, how + note
    return path, f"{_pa_runs(path)}, from the {PA_WHEEL} wheel's data, unpacked into {PA_CACHE.relative_to(ROOT)} ({how})"


def measure(perf_analyzer: str, url: str, protocol: str, model: str, shape: str, concurrency: int,
            window_ms: int, windows: int = 3) -> dict[str, Any]:
    """One closed loop of `concurrency` clients for `windows` windows of `window_ms`, reported as
    perf_analyzer reports it (its last `windows` windows merged): throughput, client-side P50 and P99
    in ms. Stability is not asked for (`-s 1000`): the caller rotates paths and takes medians, so a
    drift of the shared host weighs on every path alike instead of one run retrying until it settles.
    Raises RuntimeError with perf_analyzer's own words when it fails."""
    with tempfile.TemporaryDirectory(prefix="pa-") as tmp:
        out = Path(tmp) / "pa.csv"
        cmd = [perf_analyzer, "-m", model, "-u", url, "-i", protocol, "--concurrency-range", f"{concurrency}:{concurrency}",
               "-p", str(window_ms), "-r", str(windows), "-s", "1000", "--shape", shape, "-f", str(out)]
        r = run_cmd(cmd, timeout=60 + 5 * windows * window_ms / 1000)
        if r.returncode != 0 or not out.exists():
            raise RuntimeError(f"perf_analyzer exited {r.returncode}: {tail(r.stdout + r.stderr, 4)}")
        row = next(csv.DictReader(out.open()))
    return {"throughput": float(row["Inferences/Second"]), "p50_ms": float(row["p50 latency"]) / 1000,
            "p99_ms": float(row["p99 latency"]) / 1000}
