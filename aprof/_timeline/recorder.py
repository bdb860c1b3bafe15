"""Which recorder runs: the C extension (``_recorder.c``) or its pure-Python twin
(``pyrecorder.py``), both of one contract.

The C one is built at install when a C compiler is there and ``APROF_NO_EXTENSIONS`` is not
set; it runs unless ``APROF_NO_EXTENSIONS`` is set when aprof is imported. Otherwise, or where
it was not built, the twin runs: the same events, at a higher cost per span and request.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

from aprof._timeline.pyrecorder import Requests

Backend = Literal["c", "python"]

NO_EXTENSIONS = os.environ.get("APROF_NO_EXTENSIONS", "") not in ("", "0")
"""``APROF_NO_EXTENSIONS`` is set (to anything but ``0``): the twin runs."""

BACKEND: Backend
if TYPE_CHECKING or NO_EXTENSIONS:
    from aprof._timeline.pyrecorder import (
        NULL_SPAN,
        Gate,
        NullSpan,
        Recorder,
        Request,
        Span,
        Tally,
        requests,
        span_id_of,
    )

    BACKEND = "python"
else:
    try:
        from aprof._timeline._recorder import (
            NULL_SPAN,
            Gate,
            NullSpan,
            Recorder,
            Request,
            Span,
            Tally,
            requests,
            span_id_of,
        )

        BACKEND = "c"
    except ImportError:  # not built: installed without a C compiler, or a bare source tree
        from aprof._timeline.pyrecorder import (
            NULL_SPAN,
            Gate,
            NullSpan,
            Recorder,
            Request,
            Span,
            Tally,
            requests,
            span_id_of,
        )

        BACKEND = "python"


def timeline_backend() -> Backend:
    """Which timeline recorder this process runs: ``"c"``, the compiled extension, or
    ``"python"``, its pure-Python twin (``APROF_NO_EXTENSIONS`` set, or not built)."""
    return BACKEND


__all__ = [
    "BACKEND",
    "NULL_SPAN",
    "Gate",
    "NullSpan",
    "Recorder",
    "Request",
    "Requests",
    "Span",
    "Tally",
    "requests",
    "span_id_of",
]
