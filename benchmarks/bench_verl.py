"""What aprof costs a real verl run when it profiles no step: verl 0.9.1's ``main_ppo``
(``examples/verl_ppo.py``), the same run with aprof on (``global_profiler.steps`` empty, so
no capture: the hook, the trainer's stages, the requests through aprof's client, the
timelines and the figures in verl's metrics) and off, side by side.

The two variants alternate, ``--rounds`` times each, and each run trains ``--num-steps``
steps; a step's time is verl's own ``timing_s/step`` from its file logger. The first step of
each run is left out (it holds the first generation's warm-up). Reported: the median step of
each variant over all its runs and their ratio. Needs verl, TransferQueue and vLLM beside aprof:

    nox -s verl_bench            # or, in that environment: python benchmarks/bench_verl.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "verl_ppo.py"


def one_run(out: Path, mode: str, aprof: str, num_steps: int, timeout_s: float) -> list[float]:
    """The step times (s) of one run, its first step left out."""
    command = [sys.executable, str(EXAMPLE), "--mode", mode, "--out", str(out)]
    command += ["--aprof", aprof, "--steps", "none", "--num-steps", str(num_steps)]
    command += ["--timeout", str(timeout_s)]
    subprocess.run(command, check=True, capture_output=True, timeout=timeout_s + 120)
    steps: dict[int, float] = {}
    with (out / "verl_metrics.jsonl").open() as lines:
        for line in lines:
            entry = json.loads(line)
            if "timing_s/step" in entry["data"]:
                steps[entry["step"]] = entry["data"]["timing_s/step"]
    if sorted(steps) != list(range(1, num_steps + 1)):
        raise RuntimeError(f"{out}: verl logged steps {sorted(steps)}")
    return [steps[n] for n in range(2, num_steps + 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="sync", help="verl's trainer mode (default sync)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each variant (2)")
    parser.add_argument("--num-steps", type=int, default=8, help="steps per run (8)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run (900)")
    args = parser.parse_args()
    times: dict[str, list[float]] = {"off": [], "on": []}
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="aprof-bench-verl-") as tmp:
        for round_ in range(args.rounds):
            for variant in ("off", "on"):
                out = Path(tmp) / f"{variant}-{round_}"
                times[variant] += one_run(out, args.mode, variant, args.num_steps, args.timeout)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(f"verl {args.mode}, {args.rounds} runs x {args.num_steps - 1} steps per variant")
    print("| aprof | median step (s) | steps | ratio |")
    print("|---|---:|---:|---:|")
    print(f"| off | {off:.3f} | {len(times['off'])} | 1.00x |")
    print(f"| on, no step profiled | {on:.3f} | {len(times['on'])} | {on / off:.3f}x |")
    print(f"(whole benchmark: {time.monotonic() - began:.0f} s)")


if __name__ == "__main__":
    main()
