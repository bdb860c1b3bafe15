"""Triggers: a run that asks for its own captures when a step is slower than its recent past.

A trigger keeps the durations of the last ``baseline_steps`` unprofiled steps in order
(:class:`aprof._accounting.RollingMedian`, which the report's anomalies use too). Once its
baseline is full, a step above ``factor`` x the baseline's median is slow; ``confirm`` slow
steps in a row fire it: it asks for the next ``capture`` steps, then stays quiet for
``cooldown_steps``.
Profiled steps are neither measured nor counted: a capture's own cost must not fire it.
"""

from __future__ import annotations

from typing import Literal

from aprof._accounting import RollingMedian
from aprof._config import SlowTriggerConfig
from aprof._control import TriggerStatus

TriggerName = Literal["slow_step", "slow_rollout"]


class SlowTrigger:
    """One slow-step trigger over one measure (a step's wall time, or its rollout's)."""

    def __init__(self, name: TriggerName, config: SlowTriggerConfig) -> None:
        self.name: TriggerName = name
        self.config = config
        self._baseline = RollingMedian(config.baseline_steps)
        self._streak = 0
        self._fired = 0
        self._quiet_until: int | None = None
        self._last: float | None = None

    def median(self) -> float | None:
        """The baseline's median, once it is full."""
        if len(self._baseline) < self.config.baseline_steps:
            return None
        return self._baseline.median()

    def observe(self, step: int, seconds: float | None, *, profiled: bool) -> str | None:
        """Step ``step`` took ``seconds`` (``None``: nothing to measure); why it fires now, if
        it does (the caller asks for the next ``config.capture`` steps)."""
        if seconds is None or profiled:
            return None
        self._last = seconds
        cfg = self.config
        median = self.median()
        fired: str | None = None
        if median is not None and (self._quiet_until is None or step >= self._quiet_until):
            if seconds > cfg.factor * median:
                self._streak += 1
                if self._streak >= cfg.confirm:
                    fired = (
                        f"{self.name}: step {step} took {seconds:.3g} s, above {cfg.factor:g} x "
                        f"the median {median:.3g} s of the last {cfg.baseline_steps} unprofiled "
                        f"steps" + (f" ({self._streak} in a row)" if cfg.confirm > 1 else "")
                    )
                    self._streak = 0
                    self._fired += 1
                    self._quiet_until = step + 1 + cfg.capture + cfg.cooldown_steps
            else:
                self._streak = 0
        self._baseline.add(seconds)
        return fired

    def status(self) -> TriggerStatus:
        """Where the trigger stands, for ``aprof status``."""
        median = self.median()
        return TriggerStatus(
            name=self.name,
            baseline=len(self._baseline),
            baseline_steps=self.config.baseline_steps,
            median_s=median,
            threshold_s=None if median is None else self.config.factor * median,
            last_s=self._last,
            streak=self._streak,
            fired=self._fired,
            quiet_until=self._quiet_until,
        )
