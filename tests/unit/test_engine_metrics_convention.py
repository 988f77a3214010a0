"""tritongen's `llm_engine_*` convention for a Python backend's engine metrics: the example model
spells the names out (it runs in Triton's Python stub, without tritongen), so hold them here to
the one list in `tritongen.core.engine_metrics`, and the docstring users read to that list."""

from __future__ import annotations

import ast
from pathlib import Path

from tritongen.core import engine_metrics
from tritongen.core.engine_window import engine_windows
from tritongen.doctor import parse_metrics

TINYLLM_MODEL = Path(__file__).resolve().parents[2] / "model_repository" / "tinyllm" / "1" / "model.py"


def _exported_by_tinyllm() -> set[str]:
    """The keys of model.py's `METRICS` dict, read without importing it (it needs Triton)."""
    for node in ast.parse(TINYLLM_MODEL.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "METRICS" for t in node.targets):
            assert isinstance(node.value, ast.Dict)
            return {ast.literal_eval(k) for k in node.value.keys if k is not None}
    raise AssertionError("model.py has no METRICS dict")


def test_the_example_model_exports_exactly_the_convention() -> None:
    assert _exported_by_tinyllm() == set(engine_metrics.PY_ENGINE_METRICS)


def test_every_name_has_the_prefix_and_is_documented() -> None:
    doc = engine_metrics.__doc__ or ""
    for name in engine_metrics.PY_ENGINE_METRICS:
        assert name.startswith(engine_metrics.PY_ENGINE_PREFIX)
        assert f"\n    {name} " in doc, f"{name} is not described in engine_metrics' docstring"


def test_any_model_that_follows_it_is_read_as_a_python_backend() -> None:
    text = "\n".join(f'{name}{{model="my_llm",version="1"}} 4' for name in engine_metrics.PY_ENGINE_METRICS)
    window = engine_windows([parse_metrics(text)], 1.0)["my_llm"]
    assert window.family == engine_metrics.PY_ENGINE_FAMILY and "tinyllm" not in window.family
    assert window.running is not None and window.waiting is not None and window.kv_used is not None
    assert window.oom_kills == 0
