"""``SAVE_PATH/report.html``: a run's report as plots, in one file that opens from disk.

Each plot is a Plotly figure (``plotly.graph_objects``, no pandas); plotly.js is embedded once,
inline, so the page loads nothing from the network. Every string taken from the report (target
names, errors, problems: they come from files) is escaped before it reaches the page, and
Plotly's JSON escapes ``<``, ``>`` and ``/`` inside the scripts.

The page (its frame: ``page.py``) opens with the run across all its steps (``run_plots.py``),
then the plots of the profiled steps (``PLOTS``) and each profiled step on one clock (here).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from aprof._report.page import MS, Page, document, duration, escape, figure, step_plot_id
from aprof._report.run_plots import run_sections
from aprof._report.server_plot import server_side
from aprof._safe_files import open_folder, replace_file

if TYPE_CHECKING:  # the data model only as types
    import plotly.graph_objects as go

    from aprof._report.model import Distribution, Interval, Row, RunReport, StepReport, WindowRow


FILE_NAME = "report.html"
_STATE_COLOURS = {
    "done": "#2ca02c",
    "running": "#1f77b4",
    "failed": "#d62728",
    "timeout": "#ff7f0e",
    "skipped": "#7f7f7f",
}
_PROFILED, _UNPROFILED = "#1f77b4", "#ff7f0e"
_CAPTURED, _UNCAPTURED = "#d62728", "#2ca02c"
_UNCAPTURED_REQUEST = "#98df8a"
"""Lighter than a done window's green, beside which it is drawn."""
_ROW_PX = 34
_ALL_POINTS = 300
"""A box plot with at most this many values shows each one beside its box."""
MAX_LANES = 8
"""The most sub-rows a replica's overlapping requests are spread over; the rest are drawn in
the last."""
STEP_CAPTION = (
    "What the merged trace of this step shows (aprof merge), drawn on one wall clock (UTC): the "
    "step, each capture window (coloured by state, to where its capture ended: an "
    "auto-stopped one's last forward step), per replica its request spans (red: went "
    "ahead while the replica captured, light green: did not; overlapping requests on sub-rows) "
    "over its forward steps, and per trainer rank its stage ranges (else its top-level "
    "record_function ranges). Hover a bar for its name and duration; drag to zoom in."
)
_STEP_KINDS = {
    "step": ("step", "#7f7f7f", 0.5),
    "iterations": ("forward step", "#17becf", 0.7),
    "ranges": ("trainer range", "#8c564b", 0.6),
}
"""Per row kind: its legend entry, colour and bar width (windows and requests: by state)."""


@dataclass(frozen=True)
class Plot:
    """One section of the page: its div's id, title and one line on how to read it."""

    id: str
    title: str
    caption: str
    make: Callable[[RunReport], go.Figure | str]
    """The figure, or why there is nothing to show."""


def render(report: RunReport) -> str:
    """The whole HTML document for ``report``; a plot without data is a line saying so."""
    page = Page()
    run_sections(page, report)
    for plot in PLOTS:
        page.section(plot.id, plot.title, [plot.caption], plot.make(report))
    for step in report.steps:
        made, lines = step_on_one_clock(step)
        title = f"Step {step.step} on one clock"
        page.section(step_plot_id(step.step), title, [STEP_CAPTION, *lines], made)
    return document(report, page.parts)


def write(report: RunReport, save_path: str | os.PathLike[str]) -> Path:
    """Write ``report.html`` directly below ``save_path`` (replacing one already there,
    atomically, following no link at that name) and return its path."""
    root = os.fspath(save_path)
    text = render(report).encode("utf-8")
    folder = open_folder(root, (), create=True)
    try:
        replace_file(folder, FILE_NAME, (text,))
    finally:
        os.close(folder)
    return Path(root) / FILE_NAME


def _ms(values: Iterable[float]) -> list[float]:
    return [v * MS for v in values]


def _p50(dist: Distribution) -> str:
    return "p50 -" if dist.p50 is None else f"p50 {duration(dist.p50)}"


def _label(name: str, dist: Distribution) -> str:
    return f"{escape(name)} (n={dist.count}, {_p50(dist)})"


def _wall(ns: int) -> str:
    """A wall-clock instant as Plotly's date axis reads it (UTC, µs)."""
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _boxes(
    traces: Sequence[tuple[str, str | None, Sequence[tuple[str, Distribution]]]],
    *,
    y_title: str,
    x_title: str,
) -> go.Figure | None:
    """Grouped box plots: one trace per ``(name, colour, [(x, distribution)])``; ``None`` when
    no distribution holds a sample."""
    import plotly.graph_objects as go

    fig = figure()
    for name, colour, groups in traces:
        xs: list[str] = []
        ys: list[float] = []
        for x, dist in groups:
            xs += [x] * len(dist.sample)
            ys += _ms(dist.sample)
        if not ys:
            continue
        fig.add_trace(
            go.Box(
                x=xs,
                y=ys,
                name=name,
                marker_color=colour,
                boxpoints="all" if len(ys) <= _ALL_POINTS else "outliers",
                jitter=0.4,
                pointpos=0,
                marker_size=4,
                hovertemplate=f"{name}<br>%{{x}}: %{{y:.3f}} ms<extra></extra>",
            )
        )
    if not fig.data:
        return None
    fig.update_layout(
        boxmode="group", height=420, showlegend=True, legend={"orientation": "h", "y": 1.12}
    )
    fig.update_yaxes(title_text=y_title, rangemode="tozero")
    fig.update_xaxes(title_text=x_title, type="category")
    return fig


def windows_gantt(report: RunReport) -> go.Figure | str:
    """Each window a bar from its start to where its capture ended (an auto-stopped one: its
    last forward step), one row per target, coloured by state."""
    import plotly.graph_objects as go

    rows = [w for s in report.steps for w in s.windows]
    drawn = [w for w in rows if w.started_ns is not None and w.capture_end_ns is not None]
    if not drawn:
        return f"no window with a start and a stop time ({len(rows)} windows in all)"
    fig = figure()
    for state in sorted({w.state for w in drawn}):
        mine = [w for w in drawn if w.state == state]
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=[_wall(w.started_ns or 0) for w in mine],
                x=[((w.capture_end_ns or 0) - (w.started_ns or 0)) / 1e6 for w in mine],
                y=[escape(w.target) for w in mine],
                text=[f"step {w.step}" for w in mine],
                textposition="inside",
                insidetextanchor="middle",
                name=escape(state),
                marker_color=_STATE_COLOURS.get(state, "#9467bd"),
                hovertext=[_window_hover(w) for w in mine],
                hoverinfo="text",
            )
        )
    targets = sorted({escape(w.target) for w in drawn})
    fig.update_layout(
        barmode="overlay",
        showlegend=True,
        height=max(220, 120 + _ROW_PX * len(targets)),
        legend={"title": {"text": "state"}},
    )
    fig.update_xaxes(type="date", title_text="wall clock (UTC)")
    fig.update_yaxes(
        type="category", categoryorder="array", categoryarray=targets[::-1], title_text="target"
    )
    left_out = len(rows) - len(drawn)
    if left_out:
        fig.add_annotation(
            text=f"{left_out} window(s) without a start or stop time not drawn",
            xref="paper",
            yref="paper",
            x=0,
            y=-0.25,
            showarrow=False,
            font={"size": 11, "color": "#777"},
        )
    return fig


def _window_hover(w: WindowRow) -> str:
    lines = [
        f"<b>{escape(w.target)}</b> · step {w.step}",
        f"{escape(w.kind)} · {escape(w.tool)} · state {escape(w.state)}",
        f"stop reason: {escape(w.stop_reason or '-')}",
        f"duration: {duration(((w.capture_end_ns or 0) - (w.started_ns or 0)) / 1e9)}",
    ]
    if w.ended_ns is not None and w.stopped_ns is not None:
        after = duration((w.stopped_ns - w.ended_ns) / 1e9)
        lines.append(f"capture ended at its last forward step; stop recorded {after} later")
    if w.requested is not None or w.observed is not None:
        lines.append(f"forward steps: requested {w.requested}, observed {w.observed}")
    lines.append(f"requests: admitted {w.admitted}, gated {w.gated}")
    lines.append(f"files: {w.files}, {_size(w.bytes)}")
    if w.error:
        lines.append(f"error: {escape(_clip(w.error))}")
    return "<br>".join(lines)


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def observer_effect(report: RunReport) -> go.Figure | str:
    """Latency of every request of the profiled steps beside that of the unprofiled ones."""
    import plotly.graph_objects as go

    fig = figure()
    for name, dist, colour in (
        ("profiled steps", report.latency_profiled, _PROFILED),
        ("unprofiled steps", report.latency_unprofiled, _UNPROFILED),
    ):
        if not dist.sample:
            continue
        label = _label(name, dist)
        fig.add_trace(
            go.Violin(
                x=[name] * len(dist.sample),
                y=_ms(dist.sample),
                name=label,
                line_color=colour,
                box_visible=True,
                meanline_visible=True,
                spanmode="hard",
                points="outliers",
                hoveron="violins+points",
                hovertemplate=f"{label}<br>%{{y:.3f}} ms<extra></extra>",
            )
        )
    if not fig.data:
        return "no request latencies recorded"
    fig.update_layout(height=420, legend={"orientation": "h", "y": 1.12}, violinmode="group")
    fig.update_yaxes(title_text="request latency (ms)", rangemode="tozero")
    return fig


def captured_latency(report: RunReport) -> go.Figure | str:
    """Per step: requests served while their replica captured vs those that were not."""
    steps = report.steps
    fig = _boxes(
        [
            (
                "captured",
                _CAPTURED,
                [(f"step {s.step}", s.latency_captured) for s in steps],
            ),
            (
                "uncaptured",
                _UNCAPTURED,
                [(f"step {s.step}", s.latency_uncaptured) for s in steps],
            ),
        ],
        y_title="request latency (ms)",
        x_title="step",
    )
    return fig if fig is not None else "no request latencies in the profiled steps"


def gated_wait(report: RunReport) -> go.Figure | str:
    """Per step: how long gated requests waited for their replica's capture."""
    fig = _boxes(
        [("gated wait", "#9467bd", [(f"step {s.step}", s.gated_wait) for s in report.steps])],
        y_title="wait (ms)",
        x_title="step",
    )
    return fig if fig is not None else "no request was gated"


def forward_steps(report: RunReport) -> go.Figure | str:
    """Per rollout window: the forward steps asked for beside those the capture saw."""
    import plotly.graph_objects as go

    rows = [
        w
        for s in report.steps
        for w in s.windows
        if w.requested is not None or w.observed is not None
    ]
    if not rows:
        return "no rollout window asked for or counted forward steps"
    x = [f"step {w.step} · {escape(w.target)}" for w in rows]
    fig = figure()
    for name, values, colour in (
        ("requested", [w.requested for w in rows], "#aec7e8"),
        ("observed", [w.observed for w in rows], "#1f77b4"),
    ):
        fig.add_trace(
            go.Bar(
                x=x,
                y=values,
                name=name,
                marker_color=colour,
                hovertemplate=f"%{{x}}<br>{name}: %{{y}}<extra></extra>",
            )
        )
    fig.update_layout(barmode="group", height=380, legend={"orientation": "h", "y": 1.12})
    fig.update_xaxes(type="category", title_text="window (step · target)")
    fig.update_yaxes(title_text="forward steps", rangemode="tozero")
    return fig


def iterations(report: RunReport) -> go.Figure | str:
    """Per target and step: the server's iteration (forward step) durations."""
    fig = _boxes(
        [
            (f"step {s.step}", None, [(escape(t), d) for t, d in sorted(s.iterations.items())])
            for s in report.steps
        ],
        y_title="iteration (ms)",
        x_title="target",
    )
    return fig if fig is not None else "no server iteration read from the traces"


def stages(report: RunReport) -> go.Figure | str:
    """Per ``role · stage`` and step: the trainer stage durations."""
    fig = _boxes(
        [
            (f"step {s.step}", None, [(escape(k), d) for k, d in sorted(s.stages.items())])
            for s in report.steps
        ],
        y_title="stage (ms)",
        x_title="role · stage",
    )
    return fig if fig is not None else "no trainer stage read from the traces"


def lanes(items: Sequence[Interval]) -> tuple[list[int], int]:
    """A lane (sub-row) for each of ``items`` such that no two in a lane overlap, as few lanes
    as there can be (greedy, by begin), and how many lanes that is. An item may start when the
    one before it in its lane ends."""

    order = sorted(range(len(items)), key=lambda i: (items[i].begin_ns, items[i].end_ns))
    lane_of = [0] * len(items)
    free: list[tuple[int, int]] = []  # (end of its last item, lane)
    count = 0
    for i in order:
        if free and free[0][0] <= items[i].begin_ns:
            _, lane = heapq.heappop(free)
        else:
            lane, count = count, count + 1
        lane_of[i] = lane
        heapq.heappush(free, (items[i].end_ns, lane))
    return lane_of, count


def step_on_one_clock(step: StepReport) -> tuple[go.Figure | str, list[str]]:
    """The step's timeline rows as bars on the wall clock, one (categorical) row each, top to
    bottom; requests spread over at most ``MAX_LANES`` sub-rows; with the caption lines that
    say what is folded or left out."""
    import plotly.graph_objects as go

    rows = [row for row in step.timeline if row.items]
    left_out = sum(row.left_out for row in step.timeline)
    lines: list[str] = []
    if not rows:
        why = "no window, request or forward step of this step on a known clock"
        return why, [f"{left_out} more not drawn"] if left_out else []
    categories: list[str] = []
    bars: dict[tuple[str, str, float], list[tuple[Interval, str, str]]] = {}
    for row in rows:
        name = escape(row.name)
        if row.kind != "requests":
            categories.append(name)
            for item in row.items:
                bars.setdefault(_legend(row, item), []).append((item, name, ""))
            continue
        lane_of, count = lanes(row.items)
        shown = min(count, MAX_LANES)
        names = [name] + [f"{name} · {k + 1}" for k in range(1, shown)]
        categories += names
        note = ""
        if count > MAX_LANES:
            note = f"lanes {MAX_LANES}-{count} drawn in lane {MAX_LANES}, overlapping"
            lines.append(f"{row.name}: {len(row.items)} requests overlap {count} deep; {note}")
        for item, lane in zip(row.items, lane_of, strict=True):
            y = names[min(lane, shown - 1)]
            bars.setdefault(_legend(row, item), []).append(
                (item, y, note if y == names[-1] else "")
            )
    if left_out:
        lines.append(
            f"{left_out} more not drawn: a step keeps its earliest requests, forward steps "
            "and ranges only (aprof._report.clock.TIMELINE_ITEMS)"
        )
    fig = figure()
    for (legend, colour, width), drawn in bars.items():
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=[_wall(item.begin_ns) for item, _, _ in drawn],
                x=[(item.end_ns - item.begin_ns) / 1e6 for item, _, _ in drawn],
                y=[y for _, y, _ in drawn],
                width=width,
                name=escape(legend),
                marker={"color": colour, "line": {"width": 0}},
                hovertext=[_item_hover(item, y, note) for item, y, note in drawn],
                hoverinfo="text",
            )
        )
    fig.update_layout(
        barmode="overlay",
        showlegend=True,
        height=max(260, 130 + 24 * len(categories)),
        legend={"orientation": "h", "x": 0, "y": 1, "yanchor": "bottom"},
        bargap=0.1,
    )
    fig.update_xaxes(type="date", title_text="wall clock (UTC)", hoverformat="%H:%M:%S.%L")
    fig.update_yaxes(
        type="category", categoryorder="array", categoryarray=categories[::-1], automargin=True
    )
    return fig, lines


def _legend(row: Row, item: Interval) -> tuple[str, str, float]:
    """What the legend calls a bar of ``row``, its colour and its width (of its row's)."""
    if row.kind == "window":
        state = item.state or "unknown"
        return f"window {state}", _STATE_COLOURS.get(state, "#9467bd"), 0.8
    if row.kind == "requests":
        captured = item.state == "captured"
        colour = _CAPTURED if captured else _UNCAPTURED_REQUEST
        return f"request {item.state or ''}".strip(), colour, 0.5
    return _STEP_KINDS.get(row.kind, _STEP_KINDS["ranges"])


def _item_hover(item: Interval, row: str, note: str) -> str:
    lines = [
        f"<b>{escape(item.label)}</b>",
        f"{row}",  # escaped already
        f"duration: {duration((item.end_ns - item.begin_ns) / 1e9)}",
        f"from {_clock(item.begin_ns)} to {_clock(item.end_ns)} UTC",
    ]
    if item.state:
        lines.append(f"state: {escape(item.state)}")
    if note:
        lines.append(escape(note))
    return "<br>".join(lines)


def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%H:%M:%S.%f")[:-3]


PLOTS: tuple[Plot, ...] = (
    Plot(
        "plot-windows",
        "Capture windows",
        "One row per target, one bar per window from its start to where its capture ended "
        "on the wall clock (an auto-stopped window: its last forward step), labelled with its "
        "step and coloured by state; hover for stop reason, forward steps, files and error.",
        windows_gantt,
    ),
    Plot(
        "plot-observer-effect",
        "Request latency: profiled vs unprofiled steps",
        "The observer effect: if the profiled steps' violin sits well above the unprofiled "
        "one, profiling slowed requests down (n and p50 over all requests in the legend).",
        observer_effect,
    ),
    Plot(
        "plot-captured",
        "Request latency per step: captured vs uncaptured",
        "Per profiled step, requests that ran while their replica captured beside those that "
        "did not; a gap between the two boxes is the capture's own cost.",
        captured_latency,
    ),
    Plot(
        "plot-gated-wait",
        "Gated wait per step",
        "How long each gated request waited for its replica's capture to become active; "
        "long waits delay the rollout.",
        gated_wait,
    ),
    Plot(
        "plot-forward-steps",
        "Forward steps per window",
        "Forward steps each rollout window asked for beside those its capture saw; an "
        "observed bar short of its requested one means the window stopped early.",
        forward_steps,
    ),
    Plot(
        "plot-iterations",
        "Server iteration durations",
        "Per target, the duration of each forward step read from its server's trace, one box "
        "per profiled step; compare replicas and steps.",
        iterations,
    ),
    Plot(
        "plot-stages",
        "Trainer stages",
        "Per role and stage, the stage durations read from the trainer ranks' traces, one box "
        "per profiled step; the tallest box is where the trainer spends its time.",
        stages,
    ),
    Plot(
        "plot-server-side",
        "Requests on their servers",
        "Per step and replica, from the servers' own request spans (OpenTelemetry): the median "
        "time a request waited in the server's queue, prefilled and decoded. Hover a bar for "
        "p99 and max; the report's text and --json name the slowest requests and the time "
        "they spent outside the server.",
        server_side,
    ),
)
"""The page's plots, in order."""
