"""The ``nsys`` capture tool: CUDA profiler capture ranges for workers run under Nsight Systems.

The worker process must be launched by ``nsys profile --capture-range=cudaProfilerApi``
(``nsys_command`` builds that line, ``ray_nsight_runtime_env`` the Ray equivalent); the tool
opens and closes capture ranges and marks stages with NVTX ranges.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from aprof._errors import ToolError
from aprof._layout import size_of
from aprof.tools._requires import require_cuda

if TYPE_CHECKING:
    from aprof._config import NsysToolConfig, ProfilerConfig

REPORT_SUFFIX = ".nsys-rep"
REPORT_GLOB = f"*{REPORT_SUFFIX}"
POLL_S = 0.5
"""How often a stop looks at the reports; a report is written once its size holds still."""
_pause = time.sleep  # the wait between two looks (tests gate the looks through it)


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
    The config's other ``options`` follow ``--trace`` as ``--name=value``.
    """
    return [
        "nsys",
        "profile",
        "--capture-range=cudaProfilerApi",
        f"--capture-range-end={capture_range_end}",
        f"--trace={','.join(cfg.trace)}",
        *(f"--{name}={value}" for name, value in cfg.options.items()),
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
    The config's other ``options`` come after aprof's (Ray passes each as ``--name=value``).
    """
    return {
        "capture-range": "cudaProfilerApi",
        "capture-range-end": capture_range_end,
        "t": ",".join(cfg.trace),
        "o": str(Path(output).absolute()),
        **cfg.options,
    }


class NsysTool:
    """Capture ranges by ``cudaProfilerStart``/``cudaProfilerStop``; NVTX ranges for stages.

    nsys names the reports (from ``-o``) and writes them after a range ends, while the
    process goes on, so ``stop`` waits (at most ``finalize_s``) for this process's new
    reports to appear in ``reports`` and stop growing.
    """

    name = "nsys"

    def __init__(self, config: NsysToolConfig, reports: Path) -> None:
        require_cuda(self.name)
        self.config = config
        self.reports = reports
        self.note: str | None = None
        self._before: set[Path] | None = None

    def start(self, dir: Path, stem: str, *, scheduled: bool = False) -> None:
        """Open a capture range (``dir`` and ``stem`` are unused: nsys names its reports).

        nsys has no schedule (the config cannot give one), so ``scheduled`` is never true.
        """
        import torch.cuda

        if self._before is not None:
            raise ToolError("an nsys capture is already active")
        before = set(self.reports.glob(REPORT_GLOB))
        _check("cudaProfilerStart", torch.cuda.cudart().cudaProfilerStart())  # type: ignore[no-untyped-call]
        self._before, self.note = before, None

    def stop(self) -> list[Path]:
        """Close the capture range; this process's reports since ``start``, once written."""
        import torch.cuda

        before = self._before
        if before is None:
            raise ToolError("no nsys capture is active")
        self._before = None
        # Kernels still queued would fall outside the range.
        torch.cuda.synchronize()
        _check("cudaProfilerStop", torch.cuda.cudart().cudaProfilerStop())  # type: ignore[no-untyped-call]
        found, finalised = self._wait_for_reports(before)
        if not finalised:
            what = "no report appeared" if not found else "the report was still growing"
            self.note = (
                f"nsys report not finalised within finalize_s ({self.config.finalize_s:g} s): "
                f"{what} in {self.reports}"
            )
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

    def _wait_for_reports(self, before: set[Path]) -> tuple[list[Path], bool]:
        """This process's new reports once their sizes hold still across a poll; and whether
        they did before ``finalize_s`` ran out (else the reports there are, as they are)."""
        deadline = time.monotonic() + self.config.finalize_s
        pid = os.getpid()
        last: dict[Path, int] | None = None
        while True:
            sizes = {
                path: size
                for path in set(self.reports.glob(REPORT_GLOB)) - before
                if is_report_of(path.name, pid) and (size := size_of(path))
            }
            if sizes and sizes == last:
                return sorted(sizes), True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return sorted(sizes), False
            last = sizes
            _pause(min(POLL_S, remaining))


def is_report_of(name: str, pid: int) -> bool:
    """Whether report ``name`` is process ``pid``'s: its name holds the pid (``%p`` in ``-o``),
    or holds no number long enough to be one (``-o`` without ``%p``: one process per folder)."""
    numbers = re.findall(r"\d+", name.removesuffix(REPORT_SUFFIX))
    return str(pid) in numbers or all(len(n) < 3 for n in numbers)


def _check(call: str, status: int) -> None:
    # cudaError.success is 0; any other value is a CUDA error code.
    if status != 0:
        raise ToolError(f"{call} failed with CUDA error {status}")
