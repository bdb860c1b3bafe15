"""The profiler's core: the :class:`Profiler` of one run and the collaborators it composes
(``profiler.py`` lists them), and the :class:`BlockingProfiler` for synchronous code."""

from aprof._core.blocking import BlockingProfiler
from aprof._core.profiler import Profiler

__all__ = ["BlockingProfiler", "Profiler"]
