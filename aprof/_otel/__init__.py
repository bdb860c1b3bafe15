"""The servers' own request spans over OpenTelemetry.

- ``spans.py``: OTLP trace exports (protobuf, JSON) decoded into plain spans, and the step a
  trace id of the run names;
- ``receiver.py``: :class:`OtelReceiver`, the run's OTLP/HTTP receiver, filing spans by step
  below ``save_path/otel/``;
- ``export.py``: :func:`export_run`, a run's own spans sent to an OTLP/HTTP endpoint
  (``aprof export otlp``);
- ``collected.py``: :func:`collected_spans`, spans a user's own collector wrote to files.
"""

from aprof._otel.collected import Collected, collected_spans
from aprof._otel.export import export_run
from aprof._otel.receiver import FOLDER, OtelReceiver
from aprof._otel.spans import ANOTHER, LATENCIES, NO_STEP, step_of

__all__ = [
    "ANOTHER",
    "FOLDER",
    "LATENCIES",
    "NO_STEP",
    "Collected",
    "OtelReceiver",
    "collected_spans",
    "export_run",
    "step_of",
]
