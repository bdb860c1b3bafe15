"""The fault suite: broad, generated fault injection against aprof's first promise.

Profiling never hurts training: nothing escapes ``prof.step`` / ``prof.request``, nothing is
written outside ``save_path``, every wait and every byte read is bounded, and nothing is lost.
Run it alone with ``python -m pytest -m faults`` or ``nox -s faults``; it prints a tally.
"""
