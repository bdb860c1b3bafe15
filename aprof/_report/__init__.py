"""``aprof report``: what a run captured, step by step, in the terminal and as report.html.

- ``build.py``: :func:`collect`, a run read back into a :class:`RunReport`;
  :func:`accounting`, every step's accounting alone (``aprof status``, ``--json``);
- ``ledgers.py``: the timeline writers' ledgers read back (the accounting without the JSON),
  and the writes of a timeline they point to;
- ``model.py``: the report's data (steps, windows, distributions, intervals);
- ``requests.py``: what the timelines give (request latency, gated waits, and every step's
  spans for the accounting of :mod:`aprof._accounting`);
- ``traces.py``: what the traces give (iterations, stages);
- ``clock.py``: wall-clock intervals shared by both;
- ``text.py``: the terminal report (:func:`render`, :func:`summary`);
- ``document.py``: the accounting of every step as one JSON object (:func:`dumps`);
- ``html.py``: report.html (plotly, imported when drawn): the profiled steps' plots;
  ``run_plots.py``, the run across all its steps at its top; ``page.py``, its frame.
"""

from aprof._report.build import Accounting, accounting, collect, report, with_html
from aprof._report.document import dumps
from aprof._report.model import RunReport, StepReport
from aprof._report.text import render, summary

__all__ = [
    "Accounting",
    "RunReport",
    "StepReport",
    "accounting",
    "collect",
    "dumps",
    "render",
    "report",
    "summary",
    "with_html",
]
