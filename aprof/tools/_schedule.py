"""Mini-batch schedules of the torch and npu tools: where a mini-batch falls, what a stop cut."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from aprof._config import ScheduleConfig

Phase = Literal["skip", "wait", "warmup", "active", "done"]


class MiniBatches:
    """The mini-batch count of one scheduled capture, placed in its schedule.

    Mini-batches are numbered from 0 in each capture; ``wp.step()`` ends the current one.
    The phases follow ``torch.profiler.schedule`` (torch_npu's is the same).
    """

    def __init__(self, schedule: ScheduleConfig) -> None:
        self.schedule = schedule
        self.current = 0
        """The mini-batch in progress."""

    def native(self) -> dict[str, int]:
        """Keyword arguments of ``torch.profiler.schedule`` and ``torch_npu.profiler.schedule``."""
        s = self.schedule
        return {
            "skip_first": s.skip_first,
            "wait": s.wait,
            "warmup": s.warmup,
            "active": s.active,
            "repeat": s.repeat,
        }

    def phase(self, mini_batch: int) -> Phase:
        """What the schedule does in ``mini_batch``."""
        s = self.schedule
        if mini_batch < s.skip_first:
            return "skip"
        since = mini_batch - s.skip_first
        length = s.wait + s.warmup + s.active
        if s.repeat and since // length >= s.repeat:
            return "done"
        position = since % length
        if position < s.wait:
            return "wait"
        return "warmup" if position < s.wait + s.warmup else "active"

    def cycle(self) -> tuple[int, int]:
        """The recorded mini-batches of the cycle that ends in the current one (first, last)."""
        s = self.schedule
        position = (self.current - s.skip_first) % (s.wait + s.warmup + s.active)
        return self.current - (position - s.wait - s.warmup), self.current

    def end_note(self, written: int) -> str | None:
        """What the reader should know when the capture ends inside the current mini-batch."""
        k = self.current
        if self.phase(k) == "active":
            first = self.cycle()[0]
            return (
                f"schedule cycle cut at mini-batch {k}: the window ended inside it "
                f"(mini-batches {first}-{k} written)"
            )
        if not written:
            return (
                f"the window ended at mini-batch {k}, before any active mini-batch of the "
                "schedule: no trace written"
            )
        return None


def cycle_stem(stem: str, first: int, last: int) -> str:
    """The file stem of one cycle's trace."""
    return f"{stem}-mb{first}-{last}"
