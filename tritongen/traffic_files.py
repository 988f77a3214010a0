"""Traffic files (examples/traffic/*.yaml) read into the core's `TrafficSpec` and turned into
arrivals, with every problem as one `BadInput` naming the file. `simulate`, `tune`, the showcase
and the benchmarks read traffic through here."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from tritongen.core.traffic import Arrivals, TraceError, TrafficSpec, generate_arrivals
from tritongen.errors import BadInput
from tritongen.specio import format_loc


def read_traffic(path: Path) -> tuple[TrafficSpec, str | None]:
    """A traffic file and, for a trace, the CSV text it names (relative to the traffic file)."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"--traffic {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise BadInput(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: a traffic file is a mapping with `shape`, `rate_per_s`, `classes`, ...")
    if "shape" not in data and "hourly" in data:
        raise BadInput(f"{path}: this is a daily load curve for `tritongen plan`, not a traffic shape (no `shape:`)")
    try:
        spec = TrafficSpec.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(f"{format_loc(tuple(e['loc']))}: {e['msg'].removeprefix('Value error, ')}" for e in err.errors())
        raise BadInput(f"{path}: {problems}") from None
    text = None
    if spec.trace is not None:
        csv_path = Path(spec.trace.path)
        if not csv_path.is_absolute():
            csv_path = path.parent / csv_path
        try:
            text = csv_path.read_text()
        except OSError as err:
            raise BadInput(f"{path}: trace {csv_path}: {err}") from None
    return spec, text


def arrivals_from(spec: TrafficSpec, trace_text: str | None, seed: int, requests: int | None, source: str = "traffic") -> Arrivals:
    """The arrivals of a traffic spec; a bad trace or shape is a `BadInput` naming SOURCE."""
    try:
        return generate_arrivals(spec, seed=seed, trace_text=trace_text, requests=requests)
    except TraceError as err:
        raise BadInput(str(err)) from None
    except ValueError as err:
        raise BadInput(f"{source}: {err}") from None
