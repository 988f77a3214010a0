"""Read a directory of `tritongen profile` JSON files: the measurements render, tune and plan use."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from tritongen.core.profile_types import Profile, read_profile
from tritongen.errors import BadInput
from tritongen.specio import format_loc


def read_profiles(directory: Path) -> dict[str, Profile]:
    """Every `*.json` profile in DIR by model entry name; other JSON files (no schema_version) are skipped."""
    return {model: profile for model, (_path, profile) in read_profile_files(directory).items()}


def read_profile_files(directory: Path) -> dict[str, tuple[Path, Profile]]:
    """`read_profiles` with the file each profile came from, for messages that name it."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BadInput(f"--profiles {directory}: not a directory (write one with `tritongen profile ... -o DIR`)")
    profiles: dict[str, tuple[Path, Profile]] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            text = path.read_text()
            raw = json.loads(text)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise BadInput(f"{path}: not a readable JSON file: {err}") from None
        if not isinstance(raw, dict) or "schema_version" not in raw:
            continue
        try:
            profile = read_profile(text)
        except ValidationError as err:
            problems = "; ".join(f"{format_loc(tuple(e['loc']))}: {e['msg']}" for e in err.errors()[:5])
            raise BadInput(f"{path}: not a tritongen profile this version reads: {problems}") from None
        if profile.model in profiles:
            raise BadInput(f"{path}: a second profile for model {profile.model!r}; keep one per model")
        profiles[profile.model] = (path, profile)
    if not profiles:
        raise BadInput(f"--profiles {directory}: no profile JSON files (run `tritongen profile SPEC -o {directory}`)")
    return profiles


def measured_pads_mb(profiles: dict[str, Profile]) -> dict[str, float]:
    """Per spec model: the safety pad derived from the measured prefill peak at the longest context."""
    pads: dict[str, float] = {}
    for profile in profiles.values():
        memory = profile.memory
        if memory is None or memory.recommended_kv_safety_pad_mb is None or not profile.complete:
            continue
        model = profile.spec_model or profile.model
        pads[model] = max(pads.get(model, 0.0), memory.recommended_kv_safety_pad_mb)
    return pads
