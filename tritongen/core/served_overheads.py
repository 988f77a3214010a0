"""Which overheads a simulation uses, and how it says so.

The simulator's `Overheads` are costs outside the profiled curve (client and HTTP path, backend IPC
per execution and per request, batcher hand-offs). They belong to the server being tuned, so:

* by default they come from the profile: a classic profile's `overheads` (fitted from Triton's own
  statistics during its load levels) or a streaming profile's measured request path; the fields a
  profile cannot measure (wake-ups, hand-off losses, execution jitter) stay ideal;
* `embedded` takes the constants fitted on this project's 2-core CPU host (`EMBEDDED_CPU_OVERHEADS`),
  never by default, since on any other host they are simply wrong;
* `none` is an ideal server; `key=value,...` overrides fields of the default.

Every choice comes with one line saying what was used, which the CLI prints.
"""

from __future__ import annotations

from pydantic import ValidationError

from tritongen.core.simulator import EMBEDDED_CPU_OVERHEADS, Overheads, ServiceCurve
from tritongen.errors import BadInput

UNMEASURED = "hand-off and wake-up figures ideal (a profile does not measure them)"


def profile_overheads(profile) -> tuple[Overheads | None, str]:
    """The overheads a profile measured, with where they came from; (None, why) when it has none."""
    if profile is None:
        return None, "no profile"
    measured = getattr(profile, "overheads", None)
    if measured is not None:
        ov = Overheads(request_ms=measured.request_ms, batch_ms=measured.batch_ms, request_exec_ms=measured.request_exec_ms)
        return ov, (
            f"measured by the profile of {profile.model!r} ({profile.server_url}): request {ov.request_ms:g} ms, "
            f"batch {ov.batch_ms:g} ms + {ov.request_exec_ms:g} ms/request; {UNMEASURED}"
        )
    engine = getattr(profile, "engine", None)
    if engine is not None:
        ov = Overheads(request_ms=engine.request_overhead_ms)
        return ov, (
            f"the request path measured by the profile of {profile.model!r}: {ov.request_ms:g} ms; {UNMEASURED}"
        )
    return None, f"the profile of {profile.model!r} measured no overheads (profile it again with this version)"


def choose_overheads(option: str | None, profile=None, stated: Overheads | None = None) -> tuple[Overheads, str]:
    """`--overheads` (None, 'embedded', 'none' or key=value,...) against the profile and a curve
    file's own `overheads:` (`stated`); returns the overheads and the line that says which."""
    if option == "embedded":
        return EMBEDDED_CPU_OVERHEADS, "embedded: the constants fitted on tritongen's 2-core CPU host (--overheads embedded)"
    if option == "none":
        return Overheads(), "none: an ideal server (--overheads none)"
    if stated is not None:
        base, why = stated, "the curve file's overheads"
    else:
        found, why = profile_overheads(profile)
        if found is None:
            base = Overheads()
            why = f"none (ideal server): {why}; pass --overheads embedded or key=value,... to set them"
        else:
            base = found
    if option is None:
        return base, why
    values: dict[str, float] = {}
    for part in option.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise BadInput(f"--overheads: expected embedded, none or key=value pairs, got {part!r}")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            raise BadInput(f"--overheads: {key.strip()} takes a number, got {value!r}") from None
    try:
        chosen = Overheads.model_validate({**base.model_dump(), **values})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise BadInput(f"--overheads: {where}: {first['msg']}") from None
    return chosen, f"{', '.join(f'{k}={v:g}' for k, v in values.items())} over {why}"


def profile_device_curve(profile) -> tuple[ServiceCurve | None, str | None]:
    """The device part of each execution that the instances of a device take in turns, from the
    profile's instance scaling; (None, a note) when it was not measured, (None, None) when it
    showed no shared part or the model streams."""
    scaling = getattr(profile, "scaling", None)
    if scaling is None:
        if profile is not None and getattr(profile, "kind", None) == "classic":
            return None, (
                f"the profile of {profile.model!r} has no instance scaling: instances are simulated as scaling "
                "linearly (profile with --repo, or --allow-reload, to measure 1, 2 and 4 instances)"
            )
        return None, None
    if scaling.device_fixed_ms <= 0 and scaling.device_per_row_ms <= 0:
        return None, None
    return ServiceCurve(fixed_ms=scaling.device_fixed_ms, per_item_ms=scaling.device_per_row_ms), None
