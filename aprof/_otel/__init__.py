"""The servers' own request spans over OpenTelemetry.

- ``spans.py``: OTLP trace exports (protobuf, JSON) decoded into plain spans, and the step a
  trace id of the run names;
- ``receiver.py``: :class:`OtelReceiver`, the run's OTLP/HTTP receiver, filing spans by step
  below ``save_path/otel/``.
"""

from aprof._otel.receiver import FOLDER, OtelReceiver
from aprof._otel.spans import ANOTHER, NO_STEP, step_of

__all__ = ["ANOTHER", "FOLDER", "NO_STEP", "OtelReceiver", "step_of"]
