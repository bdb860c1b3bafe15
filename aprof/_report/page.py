"""The frame of ``report.html``: its sections, the document around them, and what every plot
of it shares (escaping, durations, the figure, the ids a section is linked by)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the data model only as types
    import plotly.graph_objects as go

    from aprof._report.model import RunReport


MS = 1000.0
"""Milliseconds per second."""


class Page:
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
        head = f'<section id="{plot_id}-section"><h{level}>{escape(title)}</h{level}>'
        head += "".join(f'<p class="caption">{escape(caption)}</p>' for caption in captions)
        if isinstance(made, str):
            self.parts.append(
                f'{head}<p class="empty">nothing to show: {escape(made)}</p></section>'
            )
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


def document(report: RunReport, sections: Sequence[str]) -> str:
    problems = [*report.problems, *(p for s in report.steps for p in s.problems)]
    if problems:
        items = "".join(f"<li>{escape(p)}</li>" for p in problems)
        box = f'<div class="problems" id="problems"><h2>Problems ({len(problems)})</h2>'
        box += f"<ul>{items}</ul></div>"
    else:
        box = '<div class="ok" id="problems">No problems: every window did what was asked.</div>'
    notes = ""
    if report.notes:
        notes = '<div class="notes"><h2>Notes</h2><ul>'
        notes += "".join(f"<li>{escape(n)}</li>" for n in report.notes) + "</ul></div>"
    steps = ", ".join(str(s.step) for s in report.steps) or "none"
    hosts = _hosts(report)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>aprof report: {escape(report.run_id)}</title>
<style>{_STYLE}</style>
</head>
<body>
<header>
<h1>aprof report</h1>
<dl>
<dt>run</dt><dd>{escape(report.run_id)}</dd>
<dt>save_path</dt><dd>{escape(str(report.save_path))}</dd>
<dt>steps profiled</dt><dd>{escape(steps)}</dd>
</dl>
</header>
<main>
{box}
{notes}
{hosts}
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


def _hosts(report: RunReport) -> str:
    """The hosts of a run over several nodes: each one's clock against the driver's."""
    if len(report.hosts) < 2:
        return ""
    rows = "".join(
        f"<tr><td>{escape(h.host)}</td><td>{h.offset_ns / 1e6:+.3f}</td>"
        f"<td>{h.uncertainty_ns / 1e6:.3f}</td><td>{h.drift_ns / 1e6:.3f}</td>"
        f"<td>{h.measurements}</td></tr>"
        for h in report.hosts
    )
    return (
        '<div id="hosts"><h2>Hosts</h2><p class="caption">Each host\'s wall clock against '
        "the driver's, measured over Ray: what is added to its clock to read the driver's "
        "(merged traces move its files by it), known to within the uncertainty.</p>"
        '<table class="steps"><tr><th>host</th><th>offset (ms)</th><th>± (ms)</th>'
        f"<th>drift (ms)</th><th>measurements</th></tr>{rows}</table></div>"
    )


def escape(text: str) -> str:
    """``text`` escaped for HTML, and for Plotly's text (which reads tags and entities)."""
    return html.escape(text, quote=True)


def duration(seconds: float) -> str:
    """``seconds`` as people read a duration: seconds from 1 s, else milliseconds."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    ms = seconds * MS
    return f"{ms:.1f} ms" if ms >= 1 else f"{ms:.3f} ms"


def figure() -> go.Figure:
    """An empty Plotly figure (plotly imported here, when a page is drawn)."""
    import plotly.graph_objects as go

    return go.Figure()


def step_plot_id(step: int) -> str:
    """The id of the div of step ``step``'s picture on one clock."""
    return f"plot-step-{step}-clock"
