"""The servers' own request spans over OpenTelemetry.

- ``spans.py``: OTLP trace exports (protobuf, JSON) decoded into plain spans, and the step a
  trace id of the run names;
- ``receiver.py``: :class:`OtelReceiver`, the run's OTLP/HTTP receiver, filing spans by step
  below ``save_path/otel/``;
- ``files.py``: the names of those files, and the one reader of a step's spans
  (:func:`otel_folder`, :func:`read_step`);
- ``served.py``: :func:`served`, each request's server span and its phases among a step's;
- ``export.py``: :func:`export_run`, a run's own spans sent to an OTLP/HTTP endpoint
  (``aprof export otlp``);
- ``collected.py``: :func:`collected_spans`, spans a user's own collector wrote to files.
"""

from aprof._otel.collected import Collected, collected_spans
from aprof._otel.export import export_run
from aprof._otel.files import FOLDER, StepSpans, otel_folder, read_step, step_file
from aprof._otel.receiver import OtelReceiver
from aprof._otel.served import PHASES, Served, served
from aprof._otel.spans import ANOTHER, NO_STEP, step_of

__all__ = [
    "ANOTHER",
    "FOLDER",
    "NO_STEP",
    "PHASES",
    "Collected",
    "OtelReceiver",
    "Served",
    "StepSpans",
    "collected_spans",
    "export_run",
    "otel_folder",
    "read_step",
    "served",
    "step_file",
    "step_of",
]
