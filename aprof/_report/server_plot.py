"""The servers' side of the requests in ``report.html``: per step and replica, the median time
a request spent queued, prefilling and decoding on its server (its OpenTelemetry spans)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aprof._otel import PHASES
from aprof._report.page import MS, figure

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from aprof._report.model import RunReport

MAX_BARS = 120
"""The most (step, replica) bars drawn: an even sample of the steps beyond."""
COLOURS = {"queued": "#c7c7c7", "prefill": "#ff7f0e", "decode": "#1f77b4"}


def server_side(report: RunReport) -> go.Figure | str:
    """Stacked bars, one per step and replica: the median of each phase of its requests."""
    import plotly.graph_objects as go

    bars = _bars(report.server)
    if not bars:
        return "no server sent spans of the run's requests (otel.receive, docs/otel.md)"
    fig = figure()
    for phase in PHASES:
        key = f"{phase}_s"
        fig.add_trace(
            go.Bar(
                x=[label for label, _ in bars],
                y=[_p50(side, key) for _, side in bars],
                customdata=[_hover(side, key) for _, side in bars],
                name=phase,
                marker_color=COLOURS[phase],
                hovertemplate=f"%{{x}}<br>{phase}: %{{customdata}}<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack", height=400, legend={"orientation": "h", "y": 1.12})
    fig.update_xaxes(type="category", title_text="step · replica")
    fig.update_yaxes(title_text="median per request (ms)", rangemode="tozero")
    return fig


def _bars(server: dict[int, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(label, summaries)`` per step and replica (per step where no request said its
    replica), at most ``MAX_BARS``."""
    per_step = []
    for step, side in sorted(server.items()):
        if not side["spans"]:
            continue
        replicas = side["replicas"] or [side]
        per_step.append(
            [
                (f"step {step}" + ("" if r is side else f" · replica_{r['replica']}"), r)
                for r in replicas
            ]
        )
    widest = max((len(bars) for bars in per_step), default=1)
    keep = max(1, MAX_BARS // widest)
    if len(per_step) > keep:
        last = len(per_step) - 1
        per_step = [per_step[round(i * last / max(1, keep - 1))] for i in range(keep)]
    return [bar for bars in per_step for bar in bars][:MAX_BARS]


def _p50(side: dict[str, Any], key: str) -> float | None:
    found = side.get(key)
    return None if found is None else found["p50"] * MS


def _hover(side: dict[str, Any], key: str) -> str:
    found = side.get(key)
    if found is None:
        return "not given"
    return (
        f"p50 {found['p50'] * MS:.2f} ms, p99 {found['p99'] * MS:.2f} ms, "
        f"max {found['max'] * MS:.2f} ms (n={side['spans']})"
    )
