"""Deciding at run time what a run captures: the control channel's messages, its folder below
``save_path``, the run's status, and the HTTP endpoint.

- ``messages.py``: :class:`CaptureRequest` and :class:`CaptureAnswer`;
- ``folder.py``: ``save_path/control/``, as the run reads it and the command line writes it;
- ``status.py``: :class:`RunStatus`, the run as ``aprof status`` shows it;
- ``http.py``: the token-guarded endpoint on 127.0.0.1 (imported when a run turns it on).
"""

from aprof._control.folder import ControlFolder, Incoming
from aprof._control.messages import (
    CaptureAnswer,
    CaptureRequest,
    bad_field,
    new_request_id,
    refusal,
)
from aprof._control.status import (
    PlannedStep,
    RunStatus,
    TriggerStatus,
    WindowStatus,
    process_gone,
)
from aprof._manifest import RequestedBy

__all__ = [
    "CaptureAnswer",
    "CaptureRequest",
    "ControlFolder",
    "Incoming",
    "PlannedStep",
    "RequestedBy",
    "RunStatus",
    "TriggerStatus",
    "WindowStatus",
    "bad_field",
    "new_request_id",
    "process_gone",
    "refusal",
]
