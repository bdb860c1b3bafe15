"""The ``nsys`` capture tool: CUDA profiler capture ranges for workers run under Nsight Systems.

The worker process must be launched by ``nsys profile --capture-range=cudaProfilerApi``
(``nsys_command`` builds that line, ``ray_nsight_runtime_env`` the Ray equivalent); the tool
opens and closes capture ranges and marks stages with NVTX ranges.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from aprof.tools import _require_cuda

if TYPE_CHECKING:
    from aprof._config import NsysToolConfig, ProfilerConfig

REPORT_GLOB = "*.nsys-rep"


def report_dir(config: ProfilerConfig) -> Path:
    """Where nsys reports go: ``tool_config.nsys.output_dir``, else ``<save_path>/nsys``."""
    return config.tool_config.nsys.output_dir or config.global_profiler.save_path / "nsys"


def nsys_command(
    cfg: NsysToolConfig,
    argv: Sequence[str],
    *,
    output: str | Path,
    capture_range_end: str = "repeat",
) -> list[str]:
    """The ``nsys profile`` command line that runs ``argv`` with capture ranges from the tool.

    ``output`` is nsys's ``-o`` (``%p`` expands to the process id); ``capture_range_end``
    says what each range end does (``repeat``: write a report and wait for the next range).
    """
    return [
        "nsys",
        "profile",
        "--capture-range=cudaProfilerApi",
        f"--capture-range-end={capture_range_end}",
        f"--trace={','.join(cfg.trace)}",
        "-o",
        str(output),
        *argv,
    ]


def ray_nsight_runtime_env(
    cfg: NsysToolConfig, output: str | Path, *, capture_range_end: str = "repeat"
) -> dict[str, str]:
    """The options for Ray's ``runtime_env["nsight"]`` equivalent to ``nsys_command``.

    Ray joins ``o`` onto its own log folder; an absolute ``output`` wins that join, so the
    reports land where the user chose. Ray joins the options with spaces: no spaces in paths.
    """
    return {
        "capture-range": "cudaProfilerApi",
        "capture-range-end": capture_range_end,
        "t": ",".join(cfg.trace),
        "o": str(Path(output).absolute()),
    }


class NsysTool:
    """Capture ranges by ``cudaProfilerStart``/``cudaProfilerStop``; NVTX ranges for stages.

    nsys names the reports (from ``-o``) and writes them when a range ends or the process
    exits, so ``stop`` lists the reports that appeared in ``reports`` since ``start``.
    """

    name = "nsys"

    def __init__(self, config: NsysToolConfig, reports: Path) -> None:
        _require_cuda(self.name)
        self.config = config
        self.reports = reports
        self.note: str | None = None
        self._before: set[Path] | None = None

    def start(self, dir: Path, stem: str) -> None:
        """Open a capture range (``dir`` and ``stem`` are unused: nsys names its reports)."""
        import torch.cuda

        if self._before is not None:
            raise RuntimeError("an nsys capture is already active")
        before = set(self.reports.glob(REPORT_GLOB))
        _check("cudaProfilerStart", torch.cuda.cudart().cudaProfilerStart())  # type: ignore[no-untyped-call]
        self._before, self.note = before, None

    def stop(self) -> list[Path]:
        """Close the capture range; the reports that appeared since ``start``."""
        import torch.cuda

        before = self._before
        if before is None:
            raise RuntimeError("no nsys capture is active")
        self._before = None
        # Kernels still queued would fall outside the range.
        torch.cuda.synchronize()
        _check("cudaProfilerStop", torch.cuda.cudart().cudaProfilerStop())  # type: ignore[no-untyped-call]
        found = sorted(set(self.reports.glob(REPORT_GLOB)) - before)
        if not found:
            self.note = f"no new report in {self.reports} yet: nsys writes it at range end or exit"
        return found

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """An NVTX range (``range_push``/``range_pop``) named ``name``."""
        import torch.cuda.nvtx

        torch.cuda.nvtx.range_push(name)  # type: ignore[no-untyped-call]
        try:
            yield
        finally:
            torch.cuda.nvtx.range_pop()  # type: ignore[no-untyped-call]

    def step(self) -> None:
        """No schedule: nothing to advance."""


def _check(call: str, status: int) -> None:
    # cudaError.success is 0; any other value is a CUDA error code.
    if status != 0:
        raise RuntimeError(f"{call} failed with CUDA error {status}")
