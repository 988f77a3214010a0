"""A Triton model's tensors as its config declares them, for the LLM interface readers
(`llm_interface`, `llm_token_ids`): the config's type names, one-element shapes, wire datatypes,
and the integers requests state in whatever form a client sent them.

Pure: no I/O, no numpy.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator

from tritongen.core.strict import Strict


class StrictRead(Strict):
    """Strict, and no coercion: these types are read from a server's config."""

    model_config = ConfigDict(strict=True)


class TensorInfo(StrictRead):
    """One input or output as the model's config declares it (without the batch dimension)."""

    name: str = Field(min_length=1, description="Tensor name.")
    data_type: str = Field(
        description="Config type name, 'TYPE_STRING' style; 'STRING', 'BYTES' and 'INT32' style are "
        "accepted and given the prefix (BYTES is the wire name of TYPE_STRING)."
    )
    dims: list[int] = Field(description="Shape without the batch dimension; -1 = variable.")
    optional: bool = Field(default=False, description="Inputs: the request may leave it out.")

    @field_validator("data_type", mode="before")
    @classmethod
    def _config_type_name(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        name = value.upper().removeprefix("TYPE_")
        return "TYPE_STRING" if name == "BYTES" else f"TYPE_{name}"

    @property
    def one_element(self) -> bool:
        """dims [1] or [-1]: one prompt, one count, one flag fits, sent with shape [1] (or [1, 1] batched)."""
        return len(self.dims) == 1 and self.dims[0] in (1, -1)

    def label(self) -> str:
        """'max_tokens INT32 [1] optional', for messages."""
        dims = ",".join(str(d) for d in self.dims)
        return f"{self.name} {self.data_type.removeprefix('TYPE_')} [{dims}]" + (" optional" if self.optional else "")


def wire_datatype(data_type: str) -> str:
    """TYPE_INT32 -> INT32, TYPE_STRING -> BYTES: the inference protocol's name for a config type."""
    name = data_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def int_or_none(value: Any) -> int | None:
    """An integer from an int, an integral float or a numeric string (vLLM's own sample client sends
    "max_tokens": "100" and the backend casts it with int()); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (str, bytes)):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None
