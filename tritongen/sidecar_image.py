"""The sidecar image's contract (Containerfile): its name, its ports, and the environment its
entrypoint turns into `tritongen sidecar` flags.

Why an environment at all: a pod spec states what the container is told in `env`, which
`kubectl describe` shows and a kustomize patch or a Helm value edits one variable at a time, where a
`command` is one list to rewrite whole. `tritongen deploy` writes these variables
(`pod_env`), the image's entrypoint reads them (`sidecar_argv`, `main`), and both take the names from
`VARIABLES` here, so the two cannot drift (tests/unit/test_sidecar_image.py renders a pod and feeds
its env to the entrypoint; tests/integration/test_sidecar_image.py runs the entrypoint).

Each variable is named after its flag: `--grpc-url` is TRITONGEN_SIDECAR_GRPC_URL. Flags given to the
container (`args:`, or after the image in `docker run`) come after the mapped ones, and click takes
an option's last value, so they win.

The entrypoint execs the sidecar (`python3 -m tritongen.cli sidecar ...`): the same PID, so the
SIGTERM Kubernetes sends reaches the sidecar itself, which drains and stops its nginx. Imports
nothing heavy: it runs before every start of the container.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tritongen import __version__
from tritongen.errors import BadInput

IMAGE_NAME = "tritongen-sidecar"  # what the README's `docker build -t` names it; deploy's default
DEFAULT_SIDECAR_IMAGE = f"{IMAGE_NAME}:{__version__}"
# The sidecar's public ports in the image (EXPOSE) and in the pod: HTTP, gRPC, its own metrics.
HTTP_PORT, GRPC_PORT, METRICS_PORT = 9000, 9001, 9002
ENV_PREFIX = "TRITONGEN_SIDECAR_"


@dataclass(frozen=True)
class Variable:
    """One flag of `tritongen sidecar` as the image takes it from the environment."""

    flag: str
    image_default: str | None = None  # what the image runs with when the variable is unset or empty
    required: bool = False  # no default can be right: the pod must say it
    what: str = ""

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.flag.removeprefix("--").upper().replace("-", "_")


# Every option `tritongen sidecar --help` lists (a unit test holds the two equal). The image's
# defaults are what a container needs whatever it serves: listeners on every interface (a Service
# reaches the pod's IP, not its loopback) on the ports the image exposes, and the native front its
# nginx is there for (native, not auto: an image that lost nginx must fail to start, not run slower).
VARIABLES: tuple[Variable, ...] = (
    Variable("--policy", required=True, what="the policy file `tritongen render` wrote (sidecar_policy.json)"),
    Variable("--url", required=True, what="Triton's HTTP endpoint HOST:PORT"),
    Variable("--grpc-url", what="Triton's gRPC endpoint HOST:PORT; unset: no gRPC proxy"),
    Variable("--metrics-url", what="Triton's metrics URL; unset: port 8002 on --url's host"),
    Variable("--listen", f"0.0.0.0:{HTTP_PORT}", what="the sidecar's HTTP listener"),
    Variable("--grpc-listen", f"0.0.0.0:{GRPC_PORT}", what="the sidecar's gRPC listener (with --grpc-url)"),
    Variable("--metrics-listen", f"0.0.0.0:{METRICS_PORT}", what="the sidecar's Prometheus endpoint"),
    Variable("--token-file", what="a file holding the admin token (a mounted Secret); unset: admin APIs shut"),
    Variable("--front", "native", what="who faces clients: native (nginx), python or auto"),
    Variable("--log-level", what="debug, info, warning or error; unset: info"),
)
BY_FLAG = {v.flag: v for v in VARIABLES}


def _given(flag: str, args: Sequence[str]) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def sidecar_argv(environ: Mapping[str, str], args: Sequence[str] = ()) -> list[str]:
    """`sidecar` and its flags from `environ`, then `args` as given. BadInput naming the variable
    when a required one is neither set nor among `args`. An empty value counts as unset (a pod
    that writes `value: ""` means "not this")."""
    missing = [v for v in VARIABLES if v.required and not environ.get(v.env, "").strip() and not _given(v.flag, args)]
    if missing:
        raise BadInput("the sidecar image needs " + "; ".join(f"{v.env} ({v.flag}: {v.what})" for v in missing))
    argv = ["sidecar"]
    for var in VARIABLES:
        value = environ.get(var.env, "").strip() or var.image_default
        if value:
            argv += [var.flag, value]
    return argv + list(args)


def pod_env(values: Mapping[str, str]) -> list[dict[str, str]]:
    """A container's `env` list setting `values` (flag -> value), in VARIABLES' order: what
    `tritongen deploy` writes for the entrypoint to read. An unknown flag is a programming error."""
    unknown = sorted(set(values) - set(BY_FLAG))
    if unknown:
        raise ValueError(f"the sidecar image reads no variable for {unknown}")
    return [{"name": v.env, "value": values[v.flag]} for v in VARIABLES if v.flag in values]


def main() -> None:
    """The image's entrypoint: map the environment, say what runs, and exec the sidecar (same PID)."""
    try:
        argv = sidecar_argv(os.environ, sys.argv[1:])
    except BadInput as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    command = [sys.executable, "-m", "tritongen.cli", *argv]
    print("tritongen sidecar image: exec " + " ".join(command[1:]), file=sys.stderr, flush=True)
    os.execv(sys.executable, command)


if __name__ == "__main__":
    main()
