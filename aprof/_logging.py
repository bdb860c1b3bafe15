"""aprof's structlog set-up: console lines by default, JSON lines on request."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

logger = structlog.get_logger("aprof")


class _StderrLogger:
    """Writes each rendered line to the ``sys.stderr`` of the moment (tests swap it)."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    debug = info = warning = error = critical = exception = log = msg


def _stderr_logger(*_args: object) -> _StderrLogger:
    return _StderrLogger()


def configure_logging(
    format: Literal["console", "json"] = "console",
    level: Literal["debug", "info", "warning", "error"] = "info",
) -> None:
    """Route structlog output to stderr as console or JSON lines at ``level`` and above."""
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if format == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
