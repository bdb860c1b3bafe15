"""``SAVE_PATH/report.html``: a run's report as plots, in one file that opens from disk.

Each plot is a Plotly figure (``plotly.graph_objects``, no pandas); plotly.js is embedded once,
inline, so the page loads nothing from the network. Every string taken from the report (target
names, errors, problems: they come from files) is escaped before it reaches the page, and
Plotly's JSON escapes ``<``, ``>`` and ``/`` inside the scripts.

The page opens with the run across all its steps (``RunReport.accounts``: phase time per step,
busy time per replica, the tail of the slowest steps; at most ``MAX_STEPS_DRAWN`` steps drawn),
then the plots of the profiled steps (``PLOTS``) and each profiled step on one clock.
"""

from __future__ import annotations

import heapq
import html
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from aprof._safe_files import open_folder, replace_file

if TYPE_CHECKING:  # the data model only as types
    import plotly.graph_objects as go

    from aprof._accounting import Anomaly, ReplicaAccount, StepAccount
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
_MS = 1000.0
_ROW_PX = 34
_ALL_POINTS = 300
"""A box plot with at most this many values shows each one beside its box."""
MAX_LANES = 8
"""The most sub-rows a replica's overlapping requests are spread over; the rest are drawn in
the last."""
STEP_CAPTION = (
    "What the merged trace of this step shows (aprof merge), drawn on one wall clock (UTC): the "
    "step, each capture window (coloured by state), per replica its request spans (red: went "
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


RUN_TITLE = "The run across all its steps"
RUN_ID = "run"
PHASES_ID = "plot-run-phases"
REPLICAS_ID = "plot-run-replicas"
TAIL_ID = "run-tail"
PROFILED_LINKS_ID = "run-profiled"
RUN_PLOT_IDS = (PHASES_ID, REPLICAS_ID)
"""The plots of the run across all its steps (when it has any step accounts)."""
MAX_STEPS_DRAWN = 2000
"""The most steps a per-step plot of the whole run draws; beyond, an even sample of them with
every anomalous and profiled step."""
SLOWEST_STEPS = 10
"""The steps the tail table lists: those with the longest wall time."""
PHASES_CAPTION = (
    "Every step of the run, profiled or not, as one bar as tall as its wall time, split into "
    "where that time went: only requests in flight (rollout only), requests and a trainer "
    "stage at once (overlap), only a trainer stage (train only), neither (idle). Hatched bars "
    "are the profiled steps (links to their pictures below the plot). A red triangle above a "
    "bar marks an anomalous step: \u00d7factor its wall time over the median of the unprofiled "
    "steps before it, and the phase that grew most. Hover a bar for its seconds."
)
REPLICAS_CAPTION = (
    "One row per replica, one column per step: how long at least one of the replica's "
    "requests was in flight within the step (its busy time; yellow is longest, dark purple "
    "shortest, blank: no request in flight). A dark cell beside bright ones in the same column "
    "is a replica left idle while others worked. Hover a cell for its busy time, the step's "
    "requests to it and their tokens per busy second."
)
TAIL_CAPTION = (
    f"The (at most {SLOWEST_STEPS}) steps with the longest wall time, longest first: their "
    "tail (from the moment 90% of the step's requests had ended to the end of the last), the "
    "tail's share of the step's rollout time, the p99 request latency and the slowest request. "
    "A long tail with a short p99 is one straggler; a long p99 is many slow requests."
)


class _Page:
    """The page's sections, in the order they are added; plotly.js goes in with the first
    plot."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self._plotly_js_in = False

    def section(
        self,
        plot_id: str,
        title: str,
        captions: Sequence[str],
        made: go.Figure | str,
        *,
        level: int = 2,
        after: str = "",
    ) -> None:
        """A section titled ``title``: its captions, then the figure (or why there is none),
        then ``after`` (HTML, escaped already)."""
        head = f'<section id="{plot_id}-section"><h{level}>{_e(title)}</h{level}>'
        head += "".join(f'<p class="caption">{_e(caption)}</p>' for caption in captions)
        if isinstance(made, str):
            self.parts.append(f'{head}<p class="empty">nothing to show: {_e(made)}</p></section>')
            return
        self.parts.append(
            f'{head}<div class="plot">{self._div(plot_id, made)}</div>{after}</section>'
        )

    def _div(self, plot_id: str, made: go.Figure) -> str:
        import plotly.io as pio

        made.update_layout(
            template="plotly_white", margin={"l": 60, "r": 20, "t": 30, "b": 50}, title=None
        )
        div = pio.to_html(
            made,
            full_html=False,
            include_plotlyjs=not self._plotly_js_in,
            div_id=plot_id,
            config={"displaylogo": False, "responsive": True},
        )
        self._plotly_js_in = True
        return str(div)


def render(report: RunReport) -> str:
    """The whole HTML document for ``report``; a plot without data is a line saying so."""
    page = _Page()
    _run_sections(page, report)
    for plot in PLOTS:
        page.section(plot.id, plot.title, [plot.caption], plot.make(report))
    for step in report.steps:
        made, lines = step_on_one_clock(step)
        title = f"Step {step.step} on one clock"
        page.section(step_plot_id(step.step), title, [STEP_CAPTION, *lines], made)
    return _document(report, page.parts)


def _run_sections(page: _Page, report: RunReport) -> None:
    """The run across all its steps: phase time per step, busy time per replica, the tail of
    the slowest steps; one line when the run has no step accounts."""
    accounts = report.accounts
    head = f'<section id="{RUN_ID}-section"><h2>{_e(RUN_TITLE)}</h2>'
    if not accounts:
        why = "no step span on the driver's timeline (a run without timeline)"
        page.parts.append(f'{head}<p class="empty">nothing to show: {_e(why)}</p></section>')
        return
    page.parts.append(f'{head}<p class="caption">{_e(run_summary(accounts))}</p>')
    drawn = drawn_steps(accounts)
    lines = drawn_lines(drawn, accounts)
    detailed = {s.step for s in report.steps}
    links = _profiled_links(accounts, detailed)
    title = "Phase time per step"
    page.section(
        PHASES_ID, title, [PHASES_CAPTION, *lines], phase_time(drawn), level=3, after=links
    )
    title = "Busy time per replica and step"
    page.section(REPLICAS_ID, title, [REPLICAS_CAPTION, *lines], replica_busy(drawn), level=3)
    page.parts.append(_tail_section(accounts, detailed) + "</section>")


def run_summary(accounts: Sequence[StepAccount]) -> str:
    """One line: how many steps, profiled and anomalous, and their wall time in all."""
    profiled = sum(a.profiled for a in accounts)
    anomalous = sum(a.anomaly is not None for a in accounts)
    wall = sum(a.wall_s for a in accounts)
    return (
        f"{len(accounts)} steps on the driver's timeline ({profiled} profiled, {anomalous} "
        f"anomalous), {_duration(wall)} of wall time in all."
    )


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


def _document(report: RunReport, sections: Sequence[str]) -> str:
    problems = [*report.problems, *(p for s in report.steps for p in s.problems)]
    if problems:
        items = "".join(f"<li>{_e(p)}</li>" for p in problems)
        box = f'<div class="problems" id="problems"><h2>Problems ({len(problems)})</h2>'
        box += f"<ul>{items}</ul></div>"
    else:
        box = '<div class="ok" id="problems">No problems: every window did what was asked.</div>'
    notes = ""
    if report.notes:
        notes = '<div class="notes"><h2>Notes</h2><ul>'
        notes += "".join(f"<li>{_e(n)}</li>" for n in report.notes) + "</ul></div>"
    steps = ", ".join(str(s.step) for s in report.steps) or "none"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>aprof report: {_e(report.run_id)}</title>
<style>{_STYLE}</style>
</head>
<body>
<header>
<h1>aprof report</h1>
<dl>
<dt>run</dt><dd>{_e(report.run_id)}</dd>
<dt>save_path</dt><dd>{_e(str(report.save_path))}</dd>
<dt>steps profiled</dt><dd>{_e(steps)}</dd>
</dl>
</header>
<main>
{box}
{notes}
{"".join(sections)}
</main>
</body>
</html>
"""


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px;
  padding: 0 1em; color: #222; }
h1 { margin-bottom: .2em; }
h2 { font-size: 1.15em; margin: 1.6em 0 .2em; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .1em 1em; margin: 0; }
dt { font-weight: 600; } dd { margin: 0; font-family: monospace; word-break: break-all; }
.problems { border: 2px solid #d62728; background: #fdecea; padding: .2em 1em; margin: 1em 0; }
.problems h2 { margin-top: .4em; color: #a31515; }
.ok { border: 2px solid #2ca02c; background: #eaf6ea; padding: .6em 1em; margin: 1em 0; }
.notes { border: 1px solid #bbb; background: #f6f6f6; padding: .2em 1em; margin: 1em 0; }
li { font-family: monospace; white-space: pre-wrap; word-break: break-word; }
.caption { color: #555; margin: 0 0 .4em; }
.empty { font-style: italic; color: #777; }
h3 { font-size: 1.05em; margin: 1.2em 0 .2em; }
table.steps { border-collapse: collapse; font-size: .92em; }
table.steps th, table.steps td { padding: .2em .7em; border-bottom: 1px solid #ddd;
  text-align: right; }
table.steps th { background: #f3f3f3; }
table.steps td:nth-child(6), table.steps td:last-child { text-align: left;
  font-family: monospace; word-break: break-all; }
"""


def _e(text: str) -> str:
    """``text`` escaped for HTML, and for Plotly's text (which reads tags and entities)."""
    return html.escape(text, quote=True)


def _ms(values: Iterable[float]) -> list[float]:
    return [v * _MS for v in values]


def _p50(dist: Distribution) -> str:
    return "p50 -" if dist.p50 is None else f"p50 {_duration(dist.p50)}"


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    ms = seconds * _MS
    return f"{ms:.1f} ms" if ms >= 1 else f"{ms:.3f} ms"


def _label(name: str, dist: Distribution) -> str:
    return f"{_e(name)} (n={dist.count}, {_p50(dist)})"


def _wall(ns: int) -> str:
    """A wall-clock instant as Plotly's date axis reads it (UTC, µs)."""
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _figure() -> go.Figure:
    import plotly.graph_objects as go

    return go.Figure()


def _boxes(
    traces: Sequence[tuple[str, str | None, Sequence[tuple[str, Distribution]]]],
    *,
    y_title: str,
    x_title: str,
) -> go.Figure | None:
    """Grouped box plots: one trace per ``(name, colour, [(x, distribution)])``; ``None`` when
    no distribution holds a sample."""
    import plotly.graph_objects as go

    fig = _figure()
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
    """Each window a bar from its start to its stop, one row per target, coloured by state."""
    import plotly.graph_objects as go

    rows = [w for s in report.steps for w in s.windows]
    drawn = [w for w in rows if w.started_ns is not None and w.stopped_ns is not None]
    if not drawn:
        return f"no window with a start and a stop time ({len(rows)} windows in all)"
    fig = _figure()
    for state in sorted({w.state for w in drawn}):
        mine = [w for w in drawn if w.state == state]
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=[_wall(w.started_ns or 0) for w in mine],
                x=[((w.stopped_ns or 0) - (w.started_ns or 0)) / 1e6 for w in mine],
                y=[_e(w.target) for w in mine],
                text=[f"step {w.step}" for w in mine],
                textposition="inside",
                insidetextanchor="middle",
                name=_e(state),
                marker_color=_STATE_COLOURS.get(state, "#9467bd"),
                hovertext=[_window_hover(w) for w in mine],
                hoverinfo="text",
            )
        )
    targets = sorted({_e(w.target) for w in drawn})
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
        f"<b>{_e(w.target)}</b> · step {w.step}",
        f"{_e(w.kind)} · {_e(w.tool)} · state {_e(w.state)}",
        f"stop reason: {_e(w.stop_reason or '-')}",
        f"duration: {_duration(((w.stopped_ns or 0) - (w.started_ns or 0)) / 1e9)}",
    ]
    if w.requested is not None or w.observed is not None:
        lines.append(f"forward steps: requested {w.requested}, observed {w.observed}")
    lines.append(f"requests: admitted {w.admitted}, gated {w.gated}")
    lines.append(f"files: {w.files}, {_size(w.bytes)}")
    if w.error:
        lines.append(f"error: {_e(_clip(w.error))}")
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

    fig = _figure()
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
    x = [f"step {w.step} · {_e(w.target)}" for w in rows]
    fig = _figure()
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
            (f"step {s.step}", None, [(_e(t), d) for t, d in sorted(s.iterations.items())])
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
            (f"step {s.step}", None, [(_e(k), d) for k, d in sorted(s.stages.items())])
            for s in report.steps
        ],
        y_title="stage (ms)",
        x_title="role · stage",
    )
    return fig if fig is not None else "no trainer stage read from the traces"


def _marked(account: StepAccount) -> bool:
    return account.profiled or account.anomaly is not None


def drawn_steps(accounts: Sequence[StepAccount], limit: int = MAX_STEPS_DRAWN) -> list[StepAccount]:
    """At most ``limit`` of ``accounts``, in step order: all of them when they fit, else every
    anomalous, then every profiled step (an even sample of them if even they do not fit) and an
    even sample of the rest."""
    if len(accounts) <= limit:
        return list(accounts)
    anomalous = [a for a in accounts if a.anomaly is not None]
    profiled = [a for a in accounts if a.profiled and a.anomaly is None]
    rest = [a for a in accounts if not _marked(a)]
    kept = _even(anomalous, limit)
    kept += _even(profiled, limit - len(kept))
    kept += _even(rest, limit - len(kept))
    return sorted(kept, key=lambda a: a.step)


def _even(items: Sequence[StepAccount], count: int) -> list[StepAccount]:
    """``count`` of ``items`` spread evenly over them, the first and the last among them."""
    n = len(items)
    if count >= n:
        return list(items)
    if count <= 0:
        return []
    if count == 1:
        return [items[n // 2]]
    return [items[round(i * (n - 1) / (count - 1))] for i in range(count)]


def drawn_lines(drawn: Sequence[StepAccount], accounts: Sequence[StepAccount]) -> list[str]:
    """The caption line that says how many steps a plot draws, when not all."""
    if len(drawn) == len(accounts):
        return []
    marked = sum(_marked(a) for a in accounts)
    kept = sum(_marked(a) for a in drawn)
    which = "every anomalous and profiled step"
    if kept < marked:
        which = f"{kept} of the {marked} anomalous and profiled steps"
    return [f"{len(drawn)} of {len(accounts)} steps drawn: {which} and an even sample of the rest."]


_PHASES: tuple[tuple[str, str, Callable[[StepAccount], float]], ...] = (
    ("rollout only", "#1f77b4", lambda a: a.rollout_s - a.overlap_s),
    ("overlap", "#9467bd", lambda a: a.overlap_s),
    ("train only", "#ff7f0e", lambda a: a.train_s - a.overlap_s),
    ("idle", "#c7c7c7", lambda a: a.idle_s),
)
"""The stacked parts of a step's wall time: its name, colour and seconds; they add up to
``wall_s`` (``rollout + train - overlap + idle``)."""
_ANOMALY = "#d62728"
_TIMES = "\u00d7"
"""The multiplication sign of an anomaly's factor."""
_ANOMALY_TEXT = 60
"""More anomalous steps drawn than this: their marks without the text (hover for it)."""


def anomaly_mark(anomaly: Anomaly) -> str:
    """The text above an anomalous step's bar."""
    return f"{_TIMES}{anomaly.factor:.1f} {_e(anomaly.phase)}"


def phase_time(drawn: Sequence[StepAccount]) -> go.Figure:
    """One stacked bar per step: its wall time split into rollout only, overlap, train only
    and idle; profiled steps hatched, anomalous ones marked above their bar."""
    import plotly.graph_objects as go

    fig = _figure()
    steps = [a.step for a in drawn]
    hatch = ["/" if a.profiled else "" for a in drawn]
    more = [[a.wall_s, " · profiled" if a.profiled else ""] for a in drawn]
    for name, colour, part in _PHASES:
        fig.add_trace(
            go.Bar(
                x=steps,
                y=[part(a) for a in drawn],
                name=name,
                legendgroup=name,
                showlegend=False,
                marker={"color": colour, "pattern": {"shape": hatch, "fillmode": "overlay"}},
                customdata=more,
                hovertemplate=f"step %{{x}}%{{customdata[1]}}<br>{name}: %{{y:.3f}} s<br>"
                "wall: %{customdata[0]:.3f} s<extra></extra>",
            )
        )
    _add_legend(fig, any(a.profiled for a in drawn))
    _add_anomalies(fig, [a for a in drawn if a.anomaly is not None])
    fig.update_layout(
        barmode="stack", bargap=0.15, height=420, legend={"orientation": "h", "y": 1.12}
    )
    top = max((a.wall_s for a in drawn), default=0.0)
    fig.update_yaxes(title_text="time in the step (s)", range=[0, top * 1.15 or 1])
    _step_axis(fig, steps)
    return fig


def _add_legend(fig: go.Figure, profiled: bool) -> None:
    """The legend of the phases, in plain colours (each toggles its phase), and of the
    profiled steps' hatching: entries of no bar."""
    import plotly.graph_objects as go

    entries: list[tuple[str, dict[str, object]]] = [
        (name, {"color": colour}) for name, colour, _ in _PHASES
    ]
    if profiled:
        hatch = {"shape": "/", "fgcolor": "#555", "fillmode": "overlay"}
        outline = {"color": "#555", "width": 1}
        entries.append(("profiled step", {"color": "#fff", "pattern": hatch, "line": outline}))
    for name, marker in entries:
        fig.add_trace(
            go.Bar(x=[None], y=[None], name=name, legendgroup=name, marker=marker, hoverinfo="skip")
        )


def _add_anomalies(fig: go.Figure, anomalous: Sequence[StepAccount]) -> None:
    """A red triangle (and its text) above each of ``anomalous``' bars."""
    import plotly.graph_objects as go

    if not anomalous:
        return
    marks = [anomaly_mark(a.anomaly) for a in anomalous if a.anomaly is not None]
    fig.add_trace(
        go.Scatter(
            x=[a.step for a in anomalous],
            y=[a.wall_s for a in anomalous],
            mode="markers+text" if len(anomalous) <= _ANOMALY_TEXT else "markers",
            text=marks,
            textposition="top center",
            cliponaxis=False,
            name=f"anomaly ({_TIMES} median wall time, phase that grew)",
            marker={"symbol": "triangle-down", "size": 11, "color": _ANOMALY},
            textfont={"color": _ANOMALY},
            hovertemplate="step %{x}: anomalous, %{text}<br>wall: %{y:.3f} s<extra></extra>",
        )
    )


def _step_axis(fig: go.Figure, steps: Sequence[int]) -> None:
    """The x axis of a per-step plot: one tick per step when there are few."""
    fig.update_xaxes(title_text="step")
    if len(steps) <= 30:
        fig.update_xaxes(tickmode="array", tickvals=list(steps))


def replica_busy(drawn: Sequence[StepAccount]) -> go.Figure | str:
    """A heat map: per replica (row) and step (column), the replica's busy time in the step."""
    import plotly.graph_objects as go

    replicas = sorted({r.replica for a in drawn for r in a.replicas})
    if not replicas:
        return "no replica had a request in flight in any step"
    row = {r: i for i, r in enumerate(replicas)}
    busy: list[list[float | None]] = [[None] * len(drawn) for _ in replicas]
    text = [[""] * len(drawn) for _ in replicas]
    for column, account in enumerate(drawn):
        for replica in account.replicas:
            busy[row[replica.replica]][column] = replica.busy_s
            text[row[replica.replica]][column] = _busy_hover(replica)
    names = [f"replica_{r}" for r in replicas]
    fig = _figure()
    fig.add_trace(
        go.Heatmap(
            x=[a.step for a in drawn],
            y=names,
            z=busy,
            text=text,
            colorscale="Viridis",
            hoverongaps=False,
            colorbar={"title": {"text": "busy (s)"}},
            hovertemplate="step %{x} · %{y}<br>busy: %{z:.3f} s<br>%{text}<extra></extra>",
        )
    )
    fig.update_layout(height=min(900, max(240, 140 + 28 * len(replicas))))
    # replica_0 on top by reversing the axis: a heat map's text does not follow a categoryarray
    fig.update_yaxes(type="category", autorange="reversed", title_text="replica")
    _step_axis(fig, [a.step for a in drawn])
    return fig


def _busy_hover(replica: ReplicaAccount) -> str:
    rate = "-" if replica.tokens_per_s is None else f"{replica.tokens_per_s:.1f}"
    return (
        f"requests: {replica.requests}<br>tokens: {replica.tokens} generated, "
        f"{replica.prompt_tokens} of prompts<br>tokens/s: {rate}"
    )


def _profiled_links(accounts: Sequence[StepAccount], detailed: set[int]) -> str:
    """A line of links to each profiled step's picture on one clock (further down)."""
    profiled = [a.step for a in accounts if a.profiled]
    if not profiled:
        return ""
    links = ", ".join(_step_link(step, detailed) for step in profiled)
    return f'<p class="links" id="{PROFILED_LINKS_ID}">Profiled steps, in detail: {links}</p>'


def _step_link(step: int, detailed: set[int]) -> str:
    """``step n``, a link to its section when the page has one."""
    if step not in detailed:
        return f"step {step}"
    return f'<a href="#{step_plot_id(step)}-section">step {step}</a>'


def slowest_steps(accounts: Sequence[StepAccount]) -> list[StepAccount]:
    """The (at most ``SLOWEST_STEPS``) steps with the longest wall time, longest first."""
    return heapq.nlargest(SLOWEST_STEPS, accounts, key=lambda a: (a.wall_s, -a.step))


def _tail_section(accounts: Sequence[StepAccount], detailed: set[int]) -> str:
    """The table of the slowest steps' tails, as a section."""
    head = ("step", "wall", "tail", "tail share", "p99", "slowest request", "")
    cells = "".join(f"<th>{_e(h)}</th>" for h in head)
    rows = "".join(_tail_row(a, detailed) for a in slowest_steps(accounts))
    table = f'<table class="steps" id="{TAIL_ID}"><tr>{cells}</tr>{rows}</table>'
    title = "The tail of the slowest steps"
    caption = f'<p class="caption">{_e(TAIL_CAPTION)}</p>'
    return f'<section id="{TAIL_ID}-section"><h3>{_e(title)}</h3>{caption}{table}</section>'


def _tail_row(account: StepAccount, detailed: set[int]) -> str:
    """One step's row of the tail table (every string escaped)."""
    share = _share(account.tail_share)
    slowest = "-"
    if account.slowest:
        s = account.slowest[0]
        slowest = f"{_e(s.request_id or '-')} · replica_{s.replica} · {_duration(s.latency_s)}"
        if s.trajectory is not None:
            turn = "" if s.turn is None else f" turn {s.turn}"
            slowest += f" · trajectory {_e(s.trajectory)}{turn}"
    note = "profiled" if account.profiled else ""
    if account.anomaly is not None:
        note = f"anomalous: {anomaly_mark(account.anomaly)}"
    cells = (
        _step_link(account.step, detailed),
        _duration(account.wall_s),
        _maybe(account.tail_s),
        share,
        _maybe(account.p99_s),
        slowest,
        note,
    )
    return "<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


def _share(share: float | None) -> str:
    """A share as a percentage, small ones with two significant digits."""
    if share is None:
        return "-"
    return f"{share:.1%}" if share >= 0.01 else f"{share * 100:.2g}%"


def _maybe(seconds: float | None) -> str:
    return "-" if seconds is None else _duration(seconds)


def step_plot_id(step: int) -> str:
    """The id of the div of step ``step``'s picture on one clock."""
    return f"plot-step-{step}-clock"


def lanes(items: Sequence[Interval]) -> tuple[list[int], int]:
    """A lane (sub-row) for each of ``items`` such that no two in a lane overlap, as few lanes
    as there can be (greedy, by begin), and how many lanes that is. An item may start when the
    one before it in its lane ends."""
    import heapq

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
        name = _e(row.name)
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
    fig = _figure()
    for (legend, colour, width), drawn in bars.items():
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=[_wall(item.begin_ns) for item, _, _ in drawn],
                x=[(item.end_ns - item.begin_ns) / 1e6 for item, _, _ in drawn],
                y=[y for _, y, _ in drawn],
                width=width,
                name=_e(legend),
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
        f"<b>{_e(item.label)}</b>",
        f"{row}",  # escaped already
        f"duration: {_duration((item.end_ns - item.begin_ns) / 1e9)}",
        f"from {_clock(item.begin_ns)} to {_clock(item.end_ns)} UTC",
    ]
    if item.state:
        lines.append(f"state: {_e(item.state)}")
    if note:
        lines.append(_e(note))
    return "<br>".join(lines)


def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%H:%M:%S.%f")[:-3]


PLOTS: tuple[Plot, ...] = (
    Plot(
        "plot-windows",
        "Capture windows",
        "One row per target, one bar per window from its start to its stop on the wall clock, "
        "labelled with its step and coloured by state; hover for stop reason, forward steps, "
        "files and error.",
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
)
"""The page's plots, in order."""
