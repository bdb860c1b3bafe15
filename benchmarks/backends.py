"""Run a benchmark once per timeline recorder and collect the results side by side.

The recorder is chosen when aprof is imported (``APROF_NO_EXTENSIONS``), so with
``--recorder both`` the script runs itself once per recorder, each in a child process
(``--recorder c|python --json``), and reads back the JSON each prints on its last line.
Ratios are always taken within one child: each measures its own baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import aprof

BACKENDS = ("c", "python")
NAMES = {"c": "C", "python": "Python"}
T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--recorder`` and ``--json``."""
    parser.add_argument(
        "--recorder",
        choices=(*BACKENDS, "both"),
        default="both",
        help="timeline recorder to measure; both: each in a child process (default)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the results as JSON instead of tables"
    )


def collect(recorder: str, measure: Callable[[], T]) -> dict[str, T]:
    """The results per recorder: measured here for ``c`` or ``python``, for ``both`` by one
    child process per recorder."""
    if recorder == "both":
        return {backend: _child(backend) for backend in BACKENDS}
    running = aprof.timeline_backend()
    if running != recorder:
        why = "APROF_NO_EXTENSIONS is set or the C extension is not built"
        sys.exit(
            f"asked for the {recorder} timeline recorder, but this process runs the {running} "
            f"one ({why if recorder == 'c' else 'set APROF_NO_EXTENSIONS=1'})"
        )
    return {recorder: measure()}


def _child(backend: str) -> Any:
    """Run this script again with ``--recorder backend --json``; its result for ``backend``."""
    env = {k: v for k, v in os.environ.items() if k != "APROF_NO_EXTENSIONS"}
    if backend == "python":
        env["APROF_NO_EXTENSIONS"] = "1"
    argv = [sys.executable, sys.argv[0], *sys.argv[1:], "--recorder", backend, "--json"]
    print(f"[{NAMES[backend]} recorder: running {' '.join(argv[1:])}]", file=sys.stderr)
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True, check=False)
    *other, last = done.stdout.splitlines() or [""]
    if other:  # anything else on stdout (a log line): pass it on
        print("\n".join(other), file=sys.stderr)
    if done.returncode != 0:
        sys.exit(f"the {NAMES[backend]} recorder's run failed (exit status {done.returncode})")
    return json.loads(last)[backend]
