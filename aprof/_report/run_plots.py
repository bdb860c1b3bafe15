"""The run across all its steps, at the top of ``report.html``: phase time per step, busy time
per replica, the tail of the slowest steps (``RunReport.accounts``; at most
``MAX_STEPS_DRAWN`` steps drawn)."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from aprof._report.page import Page, duration, escape, figure, step_plot_id

if TYPE_CHECKING:  # the data model only as types
    import plotly.graph_objects as go

    from aprof._accounting import Anomaly, ReplicaAccount, StepAccount
    from aprof._report.model import RunReport


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


def run_sections(page: Page, report: RunReport) -> None:
    """The run across all its steps: phase time per step, busy time per replica, the tail of
    the slowest steps; one line when the run has no step accounts."""
    accounts = report.accounts
    head = f'<section id="{RUN_ID}-section"><h2>{escape(RUN_TITLE)}</h2>'
    if not accounts:
        why = "no step span on the driver's timeline (a run without timeline)"
        page.parts.append(f'{head}<p class="empty">nothing to show: {escape(why)}</p></section>')
        return
    page.parts.append(f'{head}<p class="caption">{escape(run_summary(accounts))}</p>')
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
        f"anomalous), {duration(wall)} of wall time in all."
    )


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
    return f"{_TIMES}{anomaly.factor:.1f} {escape(anomaly.phase)}"


def phase_time(drawn: Sequence[StepAccount]) -> go.Figure:
    """One stacked bar per step: its wall time split into rollout only, overlap, train only
    and idle; profiled steps hatched, anomalous ones marked above their bar."""
    import plotly.graph_objects as go

    fig = figure()
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
    fig = figure()
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
    cells = "".join(f"<th>{escape(h)}</th>" for h in head)
    rows = "".join(_tail_row(a, detailed) for a in slowest_steps(accounts))
    table = f'<table class="steps" id="{TAIL_ID}"><tr>{cells}</tr>{rows}</table>'
    title = "The tail of the slowest steps"
    caption = f'<p class="caption">{escape(TAIL_CAPTION)}</p>'
    return f'<section id="{TAIL_ID}-section"><h3>{escape(title)}</h3>{caption}{table}</section>'


def _tail_row(account: StepAccount, detailed: set[int]) -> str:
    """One step's row of the tail table (every string escaped)."""
    share = _share(account.tail_share)
    slowest = "-"
    if account.slowest:
        s = account.slowest[0]
        slowest = f"{escape(s.request_id or '-')} · replica_{s.replica} · {duration(s.latency_s)}"
        if s.trajectory is not None:
            turn = "" if s.turn is None else f" turn {s.turn}"
            slowest += f" · trajectory {escape(s.trajectory)}{turn}"
    note = "profiled" if account.profiled else ""
    if account.anomaly is not None:
        note = f"anomalous: {anomaly_mark(account.anomaly)}"
    cells = (
        _step_link(account.step, detailed),
        duration(account.wall_s),
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
    return "-" if seconds is None else duration(seconds)
