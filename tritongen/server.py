"""Launch the `tritonserver` that ships in the nvidia-pytriton wheel, on 127.0.0.1, no Docker.

The launcher is shared by `tritongen serve`, the demo and the tests' session fixture. It owns the
process it starts (stopped by its own PID) and turns a failed start into the server's own reason
taken from its log, instead of a timeout. See shared/docs/triton-facts.md for the environment traps
(symlinked backend directory, libpython on LD_LIBRARY_PATH, the venv's python3 first on PATH).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tritongen.errors import BadInput, RunFailed
from tritongen.shared.processes import free_port, kill_group, port_free, tied_to_parent


PORT_FIELDS = ("http_port", "grpc_port", "metrics_port")
# Where the Python backend keeps each stub's shared-memory regions (POSIX shm on Linux). A stub that
# is killed, not stopped (a server past its exit timeout, a crash), leaves its 1 MiB regions there,
# in RAM, until the host reboots: about 90 MiB per run of this project's suite, 1.6 GiB over a day of
# runs here (2026-12-05). Each server gets a prefix of its own (the backend's shm-region-prefix-name)
# and its stop() removes what is left under it.
SHM_DIR = Path("/dev/shm")
SHM_PREFIX_FLAG = "shm-region-prefix-name"
PORT_CLASH = "already in use"  # tritonserver's words when an endpoint cannot bind its port
PORT_ATTEMPTS = 3


@dataclass(frozen=True)
class TritonInstall:
    """Where the wheel put the server binary, the Python backend and its stubs."""

    binary: Path
    python_backend: Path
    stub: Path
    libs: Path

    @classmethod
    def locate(cls) -> "TritonInstall":
        try:
            import pytriton
        except ImportError as err:  # pragma: no cover - the package is a hard dependency
            raise RunFailed(
                "nvidia-pytriton is not installed; it ships the tritonserver binary. "
                "Run `make test` or `pip install nvidia-pytriton==0.7.0`."
            ) from err
        root = Path(pytriton.__file__).parent / "tritonserver"
        pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
        install = cls(
            binary=root / "bin" / "tritonserver",
            python_backend=root / "backends" / "python",
            stub=root / "python_backend_stubs" / pyver / "triton_python_backend_stub",
            libs=Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs",
        )
        for path in (install.binary, install.python_backend, install.stub):
            if not path.exists():
                raise RunFailed(f"tritonserver install is incomplete: {path} is missing")
        return install

    def backend_dir(self, into: Path, python_backends: Mapping[str, Path] | None = None) -> Path:
        """BACKENDS/python/ of symlinks, so the stub's $ORIGIN RPATH keeps working.

        `python_backends` (name -> directory holding that backend's model.py) adds Triton's
        Python-based backends: BACKENDS/<name>/ holds a symlink to every entry of the directory
        (model.py and its helper modules or packages; not __pycache__ nor hidden names), so a model
        whose config says `backend: "<name>"` runs that model.py in the Python backend's stub
        (libtriton_python.so stays in BACKENDS/python/). The model.py sees the link as its
        __file__: to import a sibling module it should resolve it with os.path.realpath.

        With Python-based backends, BACKENDS/python/libtriton_python.so is a copy, not a link: the
        server resolves links before it checks that the library lies inside BACKENDS/python/, and
        refuses a link for such a model ("backend library name 'libtriton_python.so' escapes
        backend directory"). The copy finds its libraries through LD_LIBRARY_PATH (environment()).
        """
        python_dir = into / "python"
        python_dir.mkdir(parents=True, exist_ok=True)
        sources = python_backend_sources(python_backends or {})
        library = python_dir / "libtriton_python.so"
        if sources and (library.is_symlink() or not library.exists()):
            library.unlink(missing_ok=True)
            shutil.copy2(self.python_backend / "libtriton_python.so", library)
        links = {
            "libtriton_python.so": self.python_backend / "libtriton_python.so",
            "triton_python_backend_utils.py": self.python_backend / "triton_python_backend_utils.py",
            "triton_python_backend_stub": self.stub,
        }
        for name, target in links.items():
            link = python_dir / name
            if not link.exists():
                link.symlink_to(target)
        for name, source in sources.items():
            backend = into / name
            backend.mkdir(parents=True, exist_ok=True)
            for entry in sorted(source.iterdir()):
                link = backend / entry.name
                if entry.name != "__pycache__" and not entry.name.startswith(".") and not link.is_symlink():
                    link.symlink_to(entry)
        return into


def python_backend_sources(python_backends: Mapping[str, Path]) -> dict[str, Path]:
    """The Python-based backends checked: plain names (not "python"), directories holding model.py."""
    sources = {}
    for name, source in python_backends.items():
        if not name or name in (".", "..", "python") or "/" in name or os.sep in name:
            raise BadInput(f"python backend name {name!r} must be a plain directory name other than 'python'")
        resolved = Path(source).resolve()
        if not (resolved / "model.py").is_file():
            raise BadInput(f"python backend {name!r}: {resolved} holds no model.py")
        sources[name] = resolved
    return sources


VLLM_BACKEND_DIR = Path(__file__).parent / "triton_backends" / "vllm"


def _config_backend(config: Path) -> str | None:
    """The `backend:` a config.pbtxt names; None where it cannot be read or parsed (the server
    then reports that config in its own words, as before)."""
    from tritongen.pbtxt import ConfigSyntaxError, parse_model_config

    try:
        return parse_model_config(config.read_text(errors="replace"), str(config)).backend or None
    except (OSError, ConfigSyntaxError):
        return None


def repository_python_backends(repository: Path) -> dict[str, Path]:
    """The Python-based backends a repository needs that tritongen ships: "vllm" (its own backend
    hosting a real vLLM engine) when a model's config says `backend: "vllm"`."""
    root = Path(repository)
    configs = root.glob("*/config.pbtxt") if root.is_dir() else []
    if any(_config_backend(c) == "vllm" for c in configs):
        return {"vllm": VLLM_BACKEND_DIR}
    return {}


START_TIMEOUT_S = 60.0
"""How long a server of classic models may take to become ready (the embedded server: a few seconds)."""
ENGINE_START_TIMEOUT_S = 900.0
"""... and one that hosts an LLM engine (Triton's vLLM backend): the engine loads its weights and sizes
its KV cache before the model is ready, 25-65 s for a 6M-parameter model on this 2-core host and
minutes for a large model's weights. A server that fails is still told at once: the process exiting
or "failed to load" in its log ends the wait."""


def start_timeout(opts: "ServerOptions") -> float:
    """The options' start timeout, else one for what the repository serves (after its Python-based
    backends were resolved)."""
    if opts.start_timeout_s is not None:
        return opts.start_timeout_s
    return ENGINE_START_TIMEOUT_S if "vllm" in opts.python_backends else START_TIMEOUT_S


def describe_exit(pid: int, returncode: int, log: str, log_path: Path | None) -> str:
    """How a server ended, and its log's last lines. The exit code alone hides the fact that says
    whose fault it was: a signal (SIGSEGV: the server's own crash, which it prints as "Signal (11)
    received" above its stack; SIGKILL: another process, or the kernel out of memory) or its own
    exit."""
    tail = "\n".join(log.splitlines()[-20:]).strip() or "(the server printed nothing)"
    return f"tritonserver (pid {pid}) {ended_how(returncode)}; its log ({log_path}) ends:\n{tail}"


def ended_how(returncode: int) -> str:
    """'was killed by SIGABRT' or 'exited with code 1': Popen gives a signal as a negative code."""
    return f"was killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exited with code {returncode}"


@dataclass
class ServerOptions:
    """What the launcher passes to tritonserver; ports of 0 are picked free at start."""

    repository: Path
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    model_control: str = "none"  # "none" | "explicit"
    load_models: Sequence[str] = ()
    extra_args: Sequence[str] = ()
    log_verbose: int = 0
    exit_timeout_s: int = 3
    # None: by what the repository serves (`start_timeout`): an LLM engine loads its weights and sizes
    # its KV cache before the model is ready, which takes far longer than a classic model.
    start_timeout_s: float | None = None
    # Python-based backends: backend name -> directory holding its model.py (see
    # TritonInstall.backend_dir); empty serves only the plain Python backend.
    python_backends: Mapping[str, Path] = field(default_factory=dict)
    # Extra environment for the server and its backends' stubs (e.g. an LLM engine's settings).
    environment: Mapping[str, str] = field(default_factory=dict)
    # CPUs the server and its stubs run on (None: all). With `engine_cpus`, a CPU LLM engine (vLLM's
    # OpenMP threads) gets cores of its own, as a GPU engine has its device to itself.
    cpus: frozenset[int] | None = None
    engine_cpus: str | None = None  # vLLM's VLLM_CPU_OMP_THREADS_BIND, e.g. "1" or "2-3"


@dataclass
class TritonServer:
    """A running tritonserver child process. Use as a context manager or call stop()."""

    options: ServerOptions
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _workdir: Path | None = field(default=None, init=False)
    _log_handle: object | None = field(default=None, init=False)
    _stop_asked: bool = field(default=False, init=False)  # stop() ran: an exit from here on is ours
    shm_prefix: str | None = field(default=None, init=False)  # the Python backend's regions, ours to remove

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.options.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.options.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.options.metrics_port}/metrics"

    def command(self, backend_dir: Path, install: TritonInstall) -> list[str]:
        opts = self.options
        cmd = [
            str(install.binary),
            f"--model-repository={Path(opts.repository).resolve()}",  # Triton runs in another directory
            f"--backend-directory={backend_dir}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
            f"--http-port={opts.http_port}",
            f"--grpc-port={opts.grpc_port}",
            f"--metrics-port={opts.metrics_port}",
            f"--exit-timeout-secs={opts.exit_timeout_s}",
            f"--log-verbose={opts.log_verbose}",
            "--allow-cpu-metrics=true",
            "--strict-readiness=true",
        ]
        if self.shm_prefix is not None:
            # Python-based backends (vllm, ...) read a section of their own, and each needs a prefix
            # of its own: two backends under one prefix collide (tritonserver aborted at start with
            # boost::interprocess::lock_exception, python and tinyllm models loading together).
            cmd.extend(f"--backend-config={name},{SHM_PREFIX_FLAG}={self.shm_prefix}{name}_"
                       for name in dict.fromkeys(("python", *sorted(opts.python_backends))))
        if opts.model_control == "explicit":
            cmd.append("--model-control-mode=explicit")
            cmd.extend(f"--load-model={name}" for name in opts.load_models)
        cmd.extend(opts.extra_args)
        return cmd

    def environment(self, install: TritonInstall) -> dict[str, str]:
        env = dict(os.environ)
        venv_bin = str(Path(sys.executable).parent)
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        parts = [p for p in (libdir, str(install.libs), env.get("LD_LIBRARY_PATH", "")) if p]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(parts)
        # numpy's OpenBLAS starts a worker thread per core in every Python-backend stub, and idle
        # workers spin before they sleep: on a small host a numpy model's stub then holds every
        # core and starves Triton's own threads, a sidecar and the clients (measured: interactive
        # first-token P99 at the client 0.4-1.5 s with two workers, 55-116 ms with one, same burst).
        # One BLAS thread per stub unless the user chose otherwise; models scale with instances.
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        env.update(self.options.environment)
        return env

    def start(self) -> "TritonServer":
        opts = self.options
        if not Path(opts.repository).is_dir():
            raise BadInput(f"model repository {opts.repository} is not a directory")
        chosen = [name for name in PORT_FIELDS if getattr(opts, name) == 0]  # ours to choose, at each start
        for name in PORT_FIELDS:
            port = getattr(opts, name)
            if port and not port_free(port):
                raise RunFailed(
                    f"port {port} ({name.replace('_', ' ')}) on 127.0.0.1 is already in use; "
                    "pick another or omit it to choose a free one"
                )
        if not opts.python_backends:
            opts.python_backends = repository_python_backends(Path(opts.repository))
        if "vllm" in opts.python_backends:
            from tritongen.local_llm import vllm_cpu_environment

            opts.environment = {**vllm_cpu_environment(opts.engine_cpus), **opts.environment}
        python_backend_sources(opts.python_backends)  # a bad entry fails before anything starts
        install = TritonInstall.locate()
        # the user's own prefix (in extra_args) is theirs: other servers may share it
        stated = any(SHM_PREFIX_FLAG in arg for arg in opts.extra_args)
        self.shm_prefix = None if stated else f"tritongen_{uuid.uuid4().hex[:12]}_"
        self._workdir = Path(tempfile.mkdtemp(prefix="tritongen-server-"))
        if self.log_path is None:
            self.log_path = self._workdir / "tritonserver.log"
        for attempt in range(1, PORT_ATTEMPTS + 1):
            for name in chosen:
                setattr(opts, name, free_port())
            backend_dir = install.backend_dir(self._workdir / "backends", opts.python_backends)  # stop() removes it
            self._log_handle = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
            self._stop_asked = False
            self.process = subprocess.Popen(
                tied_to_parent(self.command(backend_dir, install), signal.SIGKILL, opts.cpus),
                stdout=self._log_handle,
                stderr=subprocess.STDOUT,
                env=self.environment(install),
                cwd=self._workdir,
                start_new_session=True,
            )
            try:
                self.wait_ready(start_timeout(opts))
                return self
            except BaseException as err:
                self.stop()
                # A port we chose was free when chosen and taken before the server bound it (the
                # server binds after loading its models): choose again. A port the user named is
                # checked before start, and its clash is theirs to resolve.
                lost_port = isinstance(err, RunFailed) and PORT_CLASH in str(err)
                if not (chosen and lost_port and attempt < PORT_ATTEMPTS):
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def log_text(self) -> str:
        if self.log_path is None or not Path(self.log_path).exists():
            return ""
        return Path(self.log_path).read_text(errors="replace")

    def failure_reason(self) -> str:
        """The server's own words: error lines of its log, the load failures first."""
        lines = self.log_text().splitlines()
        # a refused command line prints the whole usage text; the line that says why comes first
        usage = [ln for ln in lines if "unrecognized option" in ln or "Invalid option value" in ln]
        if usage:
            return "\n".join(usage) + f"\n(command line: {' '.join(self.process.args) if self.process else '?'})"
        errors = [ln for ln in lines if ln.startswith("E") or "failed to load" in ln or "error" in ln.lower()]
        picked = errors[-12:] if errors else lines[-12:]
        return "\n".join(picked).strip() or "(the server printed nothing)"

    def exit_report(self) -> str | None:
        """None while the server runs or after stop(); else `describe_exit` of how it ended."""
        proc = self.process
        if proc is None or self._stop_asked or proc.poll() is None:
            return None
        return describe_exit(proc.pid, proc.returncode, self.log_text(), self.log_path)

    def wait_ready(self, timeout_s: float) -> None:
        """Ready means the server and every model it was asked to load are ready (strict readiness)."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        url = f"http://{self.http_url}/v2/health/ready"
        with httpx.Client(timeout=1.0) as client:
            while time.monotonic() < deadline:
                code = self.process.poll()
                if code is not None:
                    raise RunFailed(
                        f"tritonserver {ended_how(code)} during start-up:\n{self.failure_reason()}"
                    )
                try:
                    if client.get(url).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if "failed to load" in self.log_text():
                    time.sleep(0.3)  # let the server finish its log before quoting it
                    raise RunFailed(f"a model failed to load:\n{self.failure_reason()}")
                time.sleep(0.1)
        raise RunFailed(f"tritonserver was not ready after {timeout_s:.0f} s:\n{self.failure_reason()}")

    def stop(self) -> None:
        """SIGINT to tritonserver alone, then SIGKILL of the whole process group (the Python stubs
        and what they started are its children). A group-wide SIGINT would reach an engine's own
        child processes (vLLM's EngineCore) before the backend's finalize() could stop them."""
        proc = self.process
        self._stop_asked = True
        if proc is not None and proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            try:
                # A server still up a couple of seconds past its own exit timeout is hung (a load that
                # never finishes, a stub that ignores the signal): waiting longer only delays the kill.
                proc.wait(timeout=self.options.exit_timeout_s + 2)
            except subprocess.TimeoutExpired:
                pass
        if proc is not None:
            kill_group(proc)  # stubs left behind by a hung shutdown
            proc.wait()
            self._remove_shm_regions()
        if self._log_handle is not None:
            self._log_handle.close()  # type: ignore[attr-defined]
            self._log_handle = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir / "backends", ignore_errors=True)

    def _remove_shm_regions(self) -> None:
        """What a killed stub left in shared memory under this server's prefix (a clean shutdown
        leaves nothing). Called once the whole process group is gone, so no region is in use."""
        if self.shm_prefix is None or not SHM_DIR.is_dir():
            return
        for region in SHM_DIR.glob(f"{self.shm_prefix}*"):
            region.unlink(missing_ok=True)

    def __enter__(self) -> "TritonServer":
        if self.process is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
