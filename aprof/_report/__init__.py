"""``aprof report``: what a run captured, step by step, in the terminal and as report.html.

- ``build.py``: :func:`collect`, a run read back into a :class:`RunReport`;
- ``model.py``: the report's data (steps, windows, distributions, intervals);
- ``requests.py``: what the timelines give (request latency, gated waits);
- ``traces.py``: what the traces give (iterations, stages);
- ``clock.py``: wall-clock intervals shared by both;
- ``text.py``: the terminal report (:func:`render`, :func:`summary`);
- ``html.py``: report.html (plotly, imported when drawn).
"""

from aprof._report.build import collect, report, with_html
from aprof._report.model import RunReport, StepReport
from aprof._report.text import render, summary

__all__ = ["RunReport", "StepReport", "collect", "render", "report", "summary", "with_html"]
