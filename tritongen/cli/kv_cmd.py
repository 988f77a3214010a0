"""`tritongen kv`: KV-cache bytes per token (and per sequence) from a model's config.json."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from tritongen.cli.app import app
from tritongen.core.kv import kv_bytes_for_sequence, kv_shape
from tritongen.hfconfig import load_architecture


class KVDtypeChoice(str, Enum):
    """Choices for --kv-dtype; an Enum so typer rejects anything else as a usage error (exit 2)."""

    auto = "auto"
    fp16 = "fp16"
    bf16 = "bf16"
    fp32 = "fp32"
    fp8 = "fp8"
    int8 = "int8"


@app.command("kv")
def kv(
    config_json: Annotated[
        Path, typer.Argument(metavar="CONFIG_JSON", help="A Hugging Face model config.json.")
    ],
    kv_dtype: Annotated[
        KVDtypeChoice,
        typer.Option("--kv-dtype", help="KV-cache dtype; auto uses the model's torch_dtype."),
    ] = KVDtypeChoice.auto,
    tp: Annotated[
        int, typer.Option("--tp", min=1, help="Tensor-parallel ranks; bytes are per rank.")
    ] = 1,
    context: Annotated[
        Optional[int],
        typer.Option("--context", min=1, help="Also report the bytes one sequence of this many tokens holds."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """KV-cache bytes per token per rank for a model, from its config.json."""
    arch = load_architecture(config_json)
    shape = kv_shape(arch, kv_dtype=kv_dtype.value, tensor_parallel=tp)
    per_sequence = kv_bytes_for_sequence(arch, shape, context) if context is not None else None

    if as_json:
        out: dict[str, Any] = {
            "family": arch.family,
            "attention": shape.attention,
            "num_layers": shape.num_layers,
            "num_kv_heads": shape.num_kv_heads,
            "head_dim": shape.head_dim,
            "kv_dtype": shape.kv_dtype,
            "kv_dtype_bytes": shape.kv_dtype_bytes,
            "tensor_parallel": shape.tensor_parallel,
            "kv_bytes_per_token": shape.kv_bytes_per_token,
        }
        if shape.latent_dim is not None:
            out["latent_dim"] = shape.latent_dim
        if arch.sliding_window is not None:
            out["sliding_window"] = arch.sliding_window
            out["sliding_window_layers"] = arch.sliding_window_layers
        if context is not None:
            out["context_tokens"] = context
            out["kv_bytes_per_sequence"] = per_sequence
        print(json.dumps(out))
        return

    table = Table(title=f"KV cache: {config_json}", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("family", arch.family)
    table.add_row("attention", shape.attention)
    table.add_row("layers", str(shape.num_layers))
    if shape.latent_dim is not None:
        table.add_row("latent per layer (MLA)", f"{shape.latent_dim} (kv_lora_rank + qk_rope_head_dim)")
    else:
        table.add_row("kv heads per rank", f"{shape.num_kv_heads} (of {arch.num_kv_heads}, tp={tp})")
        table.add_row("head dim", str(shape.head_dim))
    table.add_row("kv dtype", f"{shape.kv_dtype} ({shape.kv_dtype_bytes} bytes)")
    table.add_row(
        "KV bytes per token", f"{shape.kv_bytes_per_token:,} ({shape.kv_bytes_per_token / 1024:,.1f} KiB)"
    )
    if arch.sliding_window is not None:
        table.add_row(
            "sliding window", f"{arch.sliding_window} tokens on {arch.sliding_window_layers} of {arch.num_layers} layers"
        )
    if per_sequence is not None:
        table.add_row(
            f"KV bytes per sequence ({context:,} tokens)",
            f"{per_sequence:,} ({per_sequence / (1 << 20):,.1f} MiB)",
        )
    Console().print(table)
