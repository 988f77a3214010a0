"""Who faces the sidecar's clients (`tritongen sidecar --front`): the choices, the default, and
the one check of a choice.

Its own module, importing nothing heavy, because three places need these facts and must not
disagree: the CLI's option (whose module is imported on every `tritongen` start, so it cannot pull
in aiohttp), `SidecarConfig` (the sidecar's API, which tests and embedders build directly), and
`tritongen.sidecar_process` (the demo's and the benches' child sidecar). A default kept in each
once drifted: the CLI said "auto" while `SidecarConfig` said "python". In the shared layer, not in
sidecar/, because tritongen outside its CLI may not import the sidecar.
"""

from __future__ import annotations

from tritongen.errors import BadInput

# "python": the sidecar's own listeners face clients; "native": nginx does (sidecar/nginx_front.py)
# with the fast lane, the Python listeners on private ports; "auto": native where nginx with Lua
# is installed, else python.
FRONTS: tuple[str, ...] = ("auto", "native", "python")
DEFAULT_FRONT = "auto"


def checked_front(kind: str) -> str:
    """`kind` if it is one of FRONTS; else BadInput (exit 2) naming the option and the choices."""
    if kind not in FRONTS:
        raise BadInput(f"--front {kind!r}: use {', '.join(FRONTS[:-1])} or {FRONTS[-1]}")
    return kind
