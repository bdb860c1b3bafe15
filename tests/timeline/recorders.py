"""The two recorders, the C extension and its pure-Python twin, for tests that run once with
each (``@both``) and hold them to the same behaviour."""

from __future__ import annotations

from typing import Any

import pytest

from aprof._timeline import pyrecorder

Impl = Any
"""A recorder module: ``aprof._timeline._recorder`` or ``aprof._timeline.pyrecorder``."""

try:
    from aprof._timeline import _recorder as c_recorder
except ImportError:  # installed without the C extension
    c_recorder = None

needs_c = pytest.mark.skipif(c_recorder is None, reason="the C recorder is not built")

both = pytest.mark.parametrize(
    "impl",
    [pytest.param(c_recorder, id="c", marks=needs_c), pytest.param(pyrecorder, id="python")],
)
"""Run the test once with each recorder."""
