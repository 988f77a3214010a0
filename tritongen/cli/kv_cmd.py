"""`tritongen kv`: KV-cache bytes per token, per layer kind and per sequence from a model's config.json."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from tritongen.cli.app import app
from tritongen.core.kv import kv_footprint, kv_shape, kv_summary
from tritongen.hfconfig import load_architecture


class KVDtypeChoice(str, Enum):
    """Choices for --kv-dtype; an Enum so typer rejects anything else as a usage error (exit 2)."""

    auto = "auto"
    fp16 = "fp16"
    bf16 = "bf16"
    fp32 = "fp32"
    fp8 = "fp8"
    int8 = "int8"


def _bytes(n: int) -> str:
    """Bytes with a unit a reader can take in: KiB below a MiB, MiB above."""
    if n >= 1 << 20:
        return f"{n:,} ({n / (1 << 20):,.1f} MiB)"
    return f"{n:,} ({n / 1024:,.1f} KiB)"


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
        typer.Option("--context", min=1, help="Also report the exact bytes one sequence of this many tokens holds."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """KV-cache bytes per rank for a model, from its config.json: per token of the layers that grow,
    the window- or chunk-capped layers with their caps, the fixed state of linear-attention and
    Mamba layers, and with --context the bytes one sequence of that length holds."""
    arch = load_architecture(config_json)
    shape = kv_shape(arch, kv_dtype=kv_dtype.value, tensor_parallel=tp)
    summary = kv_summary(arch, shape, context)
    if as_json:
        print(json.dumps(summary))
        return

    fp = kv_footprint(arch, shape)
    heads = (f"latent {shape.latent_dim} (kv_lora_rank + qk_rope_head_dim)" if shape.latent_dim is not None
             else f"{shape.num_kv_heads} kv heads per rank (of {arch.num_kv_heads}, tp={tp}) x head dim {shape.head_dim}")
    table = Table(
        title=f"KV cache: {config_json}",
        caption=f"{arch.family}, {shape.attention}, {heads}, kv dtype {shape.kv_dtype} ({shape.kv_dtype_bytes} bytes)",
        title_justify="left",
        caption_justify="left",
    )
    # Numbers never wrap (they are read and copied); the prose column takes what width is left.
    table.add_column("layers", no_wrap=True)
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("bytes per token", justify="right", no_wrap=True)
    table.add_column("keeps per sequence")
    if context is not None:
        table.add_column(f"bytes at {context:,} tokens", justify="right", no_wrap=True)

    def row(name: str, count: int, per_token: str, keeps: str, at: int) -> None:
        cells = [name, str(count), per_token, keeps]
        table.add_row(*cells, *([_bytes(at)] if context is not None else []))

    tokens = context or 0
    if fp.growing_layers:
        row("full attention" + (" (MLA)" if shape.latent_dim is not None else ""), fp.growing_layers,
            _bytes(fp.growing_bytes_per_token), "every token", fp.growing_bytes_per_token * tokens)
    for capped in fp.capped:
        name = "sliding window" if capped.kind == "sliding_attention" else "chunked attention"
        keeps = f"the last {capped.cap_tokens:,} tokens" if capped.kind == "sliding_attention" else (
            f"its chunk, {capped.cap_tokens:,} tokens at most")
        row(name, capped.layers, _bytes(capped.bytes_per_token), keeps,
            capped.bytes_per_token * min(tokens, capped.cap_tokens))
    if fp.state_layers:
        row(f"{fp.state_kind} state", fp.state_layers, "-",
            f"fixed: conv {fp.state_conv_bytes:,} + ssm {fp.state_ssm_bytes:,} B per layer",
            fp.state_bytes if tokens else 0)
    mlp = arch.layer_count("mlp")
    if mlp:
        row("MLP / MoE only", mlp, "-", "nothing", 0)
    table.add_section()
    total_keeps = "every token" if fp.uniform else "the rows above together"
    row("total", arch.num_layers, _bytes(shape.kv_bytes_per_token), total_keeps,
        summary.get("kv_bytes_per_sequence", 0))  # type: ignore[arg-type]
    Console().print(table)
