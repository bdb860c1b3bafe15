"""``aprof merge``: each profiled step's timelines and traces on one clock; and a step's
per-rank traces as Holistic Trace Analysis reads them.

- ``step_trace.py``: :func:`merge`, one step's inputs placed on one wall clock, written as one
  trace;
- ``placing.py``: one input placed on the merged clock, batch by batch;
- ``parallel.py``: a step's captures placed by worker processes;
- ``scratch.py``: a merge's own folder for what it writes before it is whole, locked while the
  merge lives, removed by the next merge when it was killed;
- ``gzip_stream.py``: the merged file's gzip stream, made of parts compressed apart;
- ``flows.py``: flow arrows from each request span to the forward steps that served it;
- ``archive.py``: the Perfetto trace archive beside each merged step;
- ``hta.py``: :func:`hta_trace_files` and :func:`export_hta` (``aprof export hta``).
"""

from aprof._merge.hta import export_hta, hta_trace_files
from aprof._merge.step_trace import MergedStep, merge

__all__ = ["MergedStep", "export_hta", "hta_trace_files", "merge"]
