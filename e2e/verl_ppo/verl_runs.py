"""Runs of ``examples/verl_ppo.py`` and what the tests read of them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aprof import WindowRecord, load_manifest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "verl_ppo.py"
RUN_S = 900.0
"""The longest one run may take (the example kills its process group past it)."""


@dataclass
class Run:
    """One finished run of the example."""

    out: Path
    code: int
    printed: str

    @property
    def save_path(self) -> Path:
        return self.out / "profile"

    @property
    def log(self) -> str:
        return (self.out / "verl.log").read_text(errors="replace")

    def logged(self) -> list[tuple[int, dict[str, Any]]]:
        """What verl's file logger wrote: (global step, metrics) per log call."""
        with (self.out / "verl_metrics.jsonl").open() as lines:
            return [(entry["step"], entry["data"]) for entry in map(json.loads, lines)]

    def report(self) -> dict[str, Any]:
        """``aprof report --json`` of the run."""
        done = subprocess.run(
            [sys.executable, "-m", "aprof", "report", "--json", str(self.save_path)],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        report: dict[str, Any] = json.loads(done.stdout)
        return report


def run_example(
    out: Path, mode: str, *args: str, during: Callable[[Path], None] | None = None
) -> Run:
    """``examples/verl_ppo.py --mode MODE --out OUT ARGS``; ``during(save_path)`` runs
    while it goes on (in this process), and the run is waited for afterwards."""
    command = [sys.executable, str(EXAMPLE), "--mode", mode, "--out", str(out), *args]
    command += ["--timeout", str(RUN_S)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if during is not None:
            during(out / "profile")
        printed, _ = proc.communicate(timeout=RUN_S + 300)
    finally:
        if proc.poll() is None:
            proc.kill()  # the example's own timeout failed: its group is killed by it
            proc.wait()
    return Run(out, proc.returncode, printed)


def steps_of(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The report's step accounts, by step."""
    return {s["step"]: s for s in report["steps"]}


def windows(save_path: Path, step: int) -> list[WindowRecord]:
    """The manifest's windows of ``step``."""
    return [w for w in load_manifest(save_path).windows if w.step == step]
