"""``aprof merge``: each profiled step's timelines and traces on one clock.

- ``step_trace.py``: :func:`merge`, one step's inputs placed on one wall clock, written as one
  trace;
- ``flows.py``: flow arrows from each request span to the forward steps that served it;
- ``archive.py``: the Perfetto trace archive beside each merged step.
"""

from aprof._merge.step_trace import MergedStep, merge

__all__ = ["MergedStep", "merge"]
