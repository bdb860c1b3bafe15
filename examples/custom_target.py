"""Write your own capture target: Python heap allocations of the trainer, per profiled step.

Run: python examples/custom_target.py --out outputs/custom
"""

from __future__ import annotations

import argparse
import asyncio
import tracemalloc
from pathlib import Path

import aprof


class HeapTarget:
    """A role target that records where the trainer allocates memory during a window."""

    name = "trainer"
    kind: aprof.TargetKind = "role"
    replica = None
    enforces_window = False
    tool = "tracemalloc"

    async def start(self, window: aprof.Window) -> None:
        tracemalloc.start(16)

    async def stop(self, window: aprof.Window) -> aprof.CaptureResult:
        snapshot = tracemalloc.take_snapshot()
        tracemalloc.stop()
        report = window.dir / f"{window.prefix}.heap.txt"
        top = snapshot.statistics("lineno")[:20]
        report.write_text("\n".join(str(stat) for stat in top) + "\n")
        return aprof.CaptureResult(files=(report,), note=f"{len(top)} allocation sites")

    async def forward_steps(self) -> int | None:
        return None


async def train(out: Path) -> aprof.Manifest:
    config = {
        "global_profiler": {"steps": [2, 3], "save_path": str(out)},
        "roles": {"trainer": {}},
    }
    async with aprof.Profiler(config) as prof:
        prof.add_target(HeapTarget())
        for step in range(1, 5):
            async with prof.step(step):
                batch = [list(range(1000)) for _ in range(200)]  # the "training" work
                del batch
    return prof.manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/custom"))
    manifest = asyncio.run(train(parser.parse_args().out))
    for window in manifest.windows:
        print(window.step, window.target, window.state, [f.path for f in window.files])


if __name__ == "__main__":
    main()
