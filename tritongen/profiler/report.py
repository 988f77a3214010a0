"""A self-contained HTML page of the measured curves: inline SVG, no scripts, no dependencies.

One section per profile: for classic models the compute-time-versus-batch curve with its fit,
throughput and latency percentiles versus concurrency (the knee marked); for streaming models
TTFT, inter-token latency and tokens/s versus concurrency, and the prefill memory peak versus
prompt length. Each chart is followed by the numbers it draws.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tritongen.core import profile_math as pm
from tritongen.core.profile_types import Profile

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf"]


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]
    color: str = PALETTE[0]
    lines: bool = True
    markers: bool = True
    dashed: bool = False


@dataclass
class Chart:
    title: str
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    log2_x: bool = False
    marks: list[tuple[float, str]] = field(default_factory=list)  # vertical markers (x, label)


def _nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 0.5:
        ticks.append(round(v, 10))
        v += step
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.3g}"


def svg_chart(chart: Chart, width: int = 460, height: int = 280) -> str:
    """One chart as an <svg> element; an empty chart says so instead of drawing axes over nothing."""
    left, right, top, bottom = 62, 16, 30, 46
    pw, ph = width - left - right, height - top - bottom
    points = [p for s in chart.series for p in s.points if p[1] is not None and math.isfinite(p[1])]
    esc = html.escape
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(chart.title)}">'
        f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="13" font-weight="bold">{esc(chart.title)}</text>'
    )
    if not points:
        return head + f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" font-size="12" fill="#888">no data</text></svg>'
    xs = [p[0] for p in points]
    if chart.log2_x:
        xs_t = [math.log2(x) for x in xs if x > 0]
        x_lo, x_hi = min(xs_t), max(xs_t)
    else:
        x_lo, x_hi = min(0.0, min(xs)), max(xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    pad = (x_hi - x_lo) * 0.04  # keep the end points off the frame
    x_lo, x_hi = (x_lo - pad if chart.log2_x else x_lo), x_hi + pad
    y_ticks = _nice_ticks(0.0, max(p[1] for p in points) * 1.05 or 1.0)
    y_hi = y_ticks[-1]

    def sx(x: float) -> float:
        v = math.log2(x) if chart.log2_x else x
        return left + (v - x_lo) / (x_hi - x_lo) * pw

    def sy(y: float) -> float:
        return top + ph - (y / y_hi) * ph

    parts = [head]
    parts.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    for t in y_ticks:
        y = sy(t)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="10">{_fmt(t)}</text>')
    if chart.log2_x:
        x_ticks = sorted({x for x in xs if x > 0})
    else:
        x_ticks = [t for t in _nice_ticks(x_lo, x_hi) if x_lo <= t <= x_hi]
    for t in x_ticks:
        x = sx(t)
        parts.append(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 4}" stroke="#999"/>')
        parts.append(f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle" font-size="10">{_fmt(t)}</text>')
    parts.append(
        f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle" font-size="11">{esc(chart.x_label)}</text>'
        f'<text x="14" y="{top + ph / 2}" text-anchor="middle" font-size="11" '
        f'transform="rotate(-90 14 {top + ph / 2})">{esc(chart.y_label)}</text>'
    )
    for x, label in chart.marks:
        if (chart.log2_x and x <= 0) or not math.isfinite(x):
            continue
        px = sx(x)
        parts.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{top + ph}" stroke="#888" stroke-dasharray="3,3"/>')
        parts.append(f'<text x="{px + 3:.1f}" y="{top + 11}" font-size="10" fill="#555">{esc(label)}</text>')
    legend_y = top + 4
    for i, s in enumerate(chart.series):
        pts = [(sx(x), sy(y)) for x, y in s.points if y is not None and math.isfinite(y) and (x > 0 or not chart.log2_x)]
        if s.lines and len(pts) >= 2:
            dash = ' stroke-dasharray="6,4"' if s.dashed else ""
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{s.color}" stroke-width="1.8"{dash}/>')
        if s.markers:
            parts.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{s.color}"/>' for x, y in pts)
        ly = legend_y + 13 * i
        parts.append(f'<rect x="{left + 8}" y="{ly + 3}" width="10" height="3" fill="{s.color}"/>')
        parts.append(f'<text x="{left + 22}" y="{ly + 8}" font-size="10">{esc(s.name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(v: object) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _classic_section(p: Profile) -> str:
    parts = []
    curve = Chart("Compute time per execution vs batch size", "batch size", "compute_infer (ms)")
    curve.series.append(
        Series("measured (Triton batch_stats)", [(c.batch_size, c.compute_infer_ms) for c in p.curve], PALETTE[0], lines=False)
    )
    if p.fit is not None and p.curve:
        top = max(c.batch_size for c in p.curve)
        xs = sorted({1.0, float(top)} | ({p.fit.breakpoint} if p.fit.breakpoint else set()))
        curve.series.append(
            Series(f"fit ({p.fit.kind})", [(x, p.fit.predict(x)) for x in xs], PALETTE[1], markers=False, dashed=True)
        )
    levels = p.load_levels
    knee = [(float(p.knee.concurrency), "knee")] if p.knee and p.knee.concurrency else []
    thr = Chart("Throughput vs concurrency", "concurrent clients", "inferences/s", log2_x=True, marks=knee)
    thr.series.append(Series("throughput", [(lv.concurrency, lv.throughput_per_s) for lv in levels], PALETTE[2]))
    lat = Chart("Client latency vs concurrency", "concurrent clients", "latency (ms)", log2_x=True, marks=knee)
    for i, (name, attr) in enumerate((("P50", "p50_ms"), ("P90", "p90_ms"), ("P99", "p99_ms"))):
        lat.series.append(Series(name, [(lv.concurrency, getattr(lv, attr)) for lv in levels if getattr(lv, attr) is not None], PALETTE[i + 3]))
    charts = [svg_chart(curve), svg_chart(thr), svg_chart(lat)]
    if p.scaling is not None:
        charts.append(svg_chart(_scaling_chart(p)))
    parts.append('<div class="charts">' + "".join(charts) + "</div>")
    if p.scaling is not None:
        parts.append(f"<p><b>Instance scaling on one device:</b> {html.escape(p.scaling.detail)}</p>")
    if p.overheads is not None:
        ov = p.overheads
        parts.append(
            f"<p><b>Overheads</b> (what simulate and tune use): request {ov.request_ms:.2f} ms, batch {ov.batch_ms:.2f} ms "
            f"+ {ov.request_exec_ms:.3f} ms per request; {html.escape(ov.detail)}</p>"
        )
    if p.fit is not None:
        f = p.fit
        bend = f", slope {f.per_item_ms_after:.4f} ms/item above batch {f.breakpoint:g}" if f.kind == "piecewise" else ""
        parts.append(
            f"<p><b>Fit ({f.kind}):</b> {f.overhead_ms:.3f} ms + {f.per_item_ms:.4f} ms x batch{bend}; "
            f"relative error max {f.max_rel_error:.1%}, mean {f.mean_rel_error:.1%} over {f.points} points"
            + (f" (other candidate: {html.escape(f.alternative)})" if f.alternative else "")
            + "</p>"
        )
    parts.append(
        _table(
            ["batch size", "executions", "compute_infer ms", "compute total ms", "fit ms"],
            [(c.batch_size, c.count, c.compute_infer_ms, c.compute_total_ms, p.fit.predict(c.batch_size) if p.fit else None) for c in p.curve],
        )
    )
    parts.append(
        _table(
            ["concurrency", "inf/s", "P50 ms", "P90 ms", "P99 ms", "mean batch", "requests", "errors", "windows", "converged"],
            [
                (lv.concurrency, lv.throughput_per_s, lv.p50_ms, lv.p90_ms, lv.p99_ms, lv.mean_batch_size, lv.requests, lv.errors, lv.windows, lv.converged)
                for lv in levels
            ],
        )
    )
    return "".join(parts)


def _scaling_chart(p: Profile) -> Chart:
    """Executions/s against instances, measured and as the device-part fit predicts, per row count."""
    assert p.scaling is not None
    chart = Chart("Throughput vs instances on one device", "instances", "executions/s")
    for i, part in enumerate(p.scaling.parts):
        levels = [lv for lv in p.scaling.levels if lv.rows == part.rows]
        chart.series.append(Series(f"{part.rows} row(s), measured", [(lv.instances, lv.executions_per_s) for lv in levels], PALETTE[i * 2]))
        fit = [(lv.instances, pm.scaling_prediction(lv.instances, part.one_instance_per_s, part.device_ms)) for lv in levels]
        chart.series.append(Series(f"{part.rows} row(s), fit", fit, PALETTE[i * 2 + 1], markers=False, dashed=True))
    return chart


def _streaming_section(p: Profile) -> str:
    parts = []
    levels = p.streaming.levels if p.streaming else []
    ttft = Chart("Time to first token vs concurrency", "concurrent streams", "TTFT (ms)", log2_x=True)
    itl = Chart("Inter-token latency vs concurrency", "concurrent streams", "ITL (ms)", log2_x=True)
    tps = Chart("Tokens/s vs concurrency", "concurrent streams", "tokens/s", log2_x=True)
    for i, (name, attr) in enumerate((("P50", "ttft_p50_ms"), ("P99", "ttft_p99_ms"))):
        ttft.series.append(Series(name, [(lv.concurrency, getattr(lv, attr)) for lv in levels if getattr(lv, attr) is not None], PALETTE[i + 3]))
    for i, (name, attr) in enumerate((("P50", "itl_p50_ms"), ("P99", "itl_p99_ms"))):
        itl.series.append(Series(name, [(lv.concurrency, getattr(lv, attr)) for lv in levels if getattr(lv, attr) is not None], PALETTE[i + 3]))
    tps.series.append(Series("all streams", [(lv.concurrency, lv.tokens_per_s) for lv in levels], PALETTE[2]))
    charts = [svg_chart(ttft), svg_chart(itl), svg_chart(tps)]
    mem = p.memory
    if mem and mem.prefill:
        pre = Chart("Prefill memory peak vs prompt length", "prompt tokens", "peak over steady (KiB)")
        pre.series.append(Series("peak delta", [(pt.prompt_tokens, pt.peak_delta_bytes / 1024) for pt in mem.prefill], PALETTE[1]))
        charts.append(svg_chart(pre))
    parts.append('<div class="charts">' + "".join(charts) + "</div>")
    if p.streaming:
        parts.append(f"<p>Prompt {p.streaming.prompt_tokens} tokens, max_tokens {p.streaming.max_tokens}.</p>")
    parts.append(
        _table(
            ["streams", "tokens/s", "stream tok/s P50", "TTFT P50 ms", "TTFT P99 ms", "ITL P50 ms", "ITL P99 ms", "requests", "errors"],
            [
                (lv.concurrency, lv.tokens_per_s, lv.stream_tokens_per_s_p50, lv.ttft_p50_ms, lv.ttft_p99_ms, lv.itl_p50_ms, lv.itl_p99_ms, lv.requests, lv.errors)
                for lv in levels
            ],
        )
    )
    if mem and mem.prefill:
        parts.append(
            _table(
                ["prompt tokens", "steady bytes", "peak bytes", "peak delta KiB", "samples", "method"],
                [(pt.prompt_tokens, pt.steady_bytes, pt.peak_bytes, pt.peak_delta_bytes / 1024, pt.samples, pt.method) for pt in mem.prefill],
            )
        )
    return "".join(parts)


def _memory_section(p: Profile) -> str:
    mem = p.memory
    if mem is None:
        return ""
    rows = [
        ("probe", mem.probe),
        ("instances", mem.instances),
        ("base memory (bytes)", mem.base_bytes),
        ("weights, analytic (bytes)", mem.weights_bytes_analytic),
        ("KV bytes/token, analytic", mem.kv_bytes_per_token_analytic),
        ("KV bytes/token, measured", mem.kv_bytes_per_token_measured),
        ("relative difference", f"{mem.kv_relative_difference:+.2%}" if mem.kv_relative_difference is not None else None),
        ("recommended kv_safety_pad_mb", mem.recommended_kv_safety_pad_mb),
    ]
    out = "<h3>Memory</h3>" + _table(["", "value"], [r for r in rows if r[1] is not None])
    if mem.kv_measurements:
        out += _table(
            ["source", "bytes/token", "vs analytic", "how"],
            [
                (m.source, m.bytes_per_token, f"{m.relative_difference:+.2%}" if m.relative_difference is not None else None, m.detail)
                for m in mem.kv_measurements
            ],
        )
    if mem.notes:
        out += "<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in mem.notes) + "</ul>"
    return out


def _unary_llm_section(p: Profile) -> str:
    """An LLM that is not decoupled: its end-to-end time by budget and the static batch its memory holds."""
    u = p.llm
    if u is None:
        return ""
    fits = ", ".join(f"{b}{'' if ok else ' out of memory'}" for b, ok in u.batch_fits) or "-"
    rows = [
        ("interface", u.interface),
        ("end-to-end ms by budget", ", ".join(f"{b}: {ms:.1f}" for b, ms in u.latency_ms_by_budget) or "-"),
        ("budget honoured", "-" if u.budget_honoured is None else ("yes" if u.budget_honoured else "no")),
        (f"static batches of {u.probe_prompt_tokens} + {u.probe_max_tokens} tokens", fits),
        ("KV capacity", "-" if u.kv_capacity_tokens is None else f"{u.kv_capacity_tokens:,} tokens"),
    ]
    out = "<h3>LLM, not decoupled (one response per request)</h3>" + _table(("", ""), rows)
    if u.failure_sample:
        out += f"<p>The model's own error for the batch that failed: <code>{html.escape(u.failure_sample)}</code></p>"
    return out


def _gaps_section(p: Profile) -> str:
    """What the model did not show, what the profile took instead, and the profile's notes: a reader
    of the report sees the assumptions beside the figures they shaped."""
    out = ""
    if p.gaps:
        out += ("<h3>What the model did not show (optional measurements), and what was taken instead</h3>"
                + _table(("measurement", "not seen", "taken instead"), [(g.measurement, g.unseen, g.inferred) for g in p.gaps]))
    if p.notes:
        out += "<h3>Notes</h3><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in p.notes) + "</ul>"
    return out


def render_html(profiles: Sequence[Profile], title: str = "tritongen profile") -> str:
    sections = []
    for p in profiles:
        status = "complete" if p.complete else f'<span class="bad">INCOMPLETE: {html.escape(p.error or "")}</span>'
        body = _classic_section(p) if p.kind == "classic" else _streaming_section(p)
        sections.append(
            f'<section><h2>{html.escape(p.model)} <small>({p.kind})</small></h2>'
            f"<p>Triton {html.escape(p.server_version)} at {html.escape(p.server_url)}, "
            f"{p.created_at:%Y-%m-%d %H:%M:%S %Z}, {p.duration_s:.1f} s, {status}.</p>"
            f"{body}{_unary_llm_section(p)}{_memory_section(p)}{_gaps_section(p)}</section>"
        )
    style = (
        "body{font-family:system-ui,sans-serif;margin:24px;color:#222}"
        ".charts{display:flex;flex-wrap:wrap;gap:12px}svg{border:1px solid #ddd;background:#fff}"
        "table{border-collapse:collapse;margin:10px 0;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f4f4f4}"
        ".bad{color:#b00}small{color:#666;font-weight:normal}section{margin-bottom:36px}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>{''.join(sections)}</body></html>\n"
    )


def write_report(profiles: Sequence[Profile], out_dir: Path, name: str = "report.html") -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    tmp = out_dir / f".{name}.tmp-{os.getpid()}"
    tmp.write_text(render_html(profiles))
    os.replace(tmp, path)
    return path
