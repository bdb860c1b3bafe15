"""Where each step's time went: phases as unions of intervals on one clock, the requests' long
tail, each replica's busy time, and the steps that grew.

A :class:`Ledger` takes a run's spans from any number of processes' timelines, in any order:
the driver's steps, every request, every trainer stage. Time is never summed across concurrent
spans: a phase is the union of its spans' intervals, clipped to the step's own span, so 64
requests in flight together count once. Per step ``n`` (``[begin, end]`` of its ``step`` span):

- ``rollout_s``: time with at least one request in flight (any process, any step's request);
  ``train_s``: at least one trainer stage open; ``overlap_s``: both; ``idle_s``: neither.
  ``rollout_s + train_s - overlap_s + idle_s == wall_s``.
- requests: those the step admitted (a request keeps the step it was admitted in, also when
  it ends in a later one): their count, latency percentiles (nearest rank: the p-th of ``n``
  sorted values is the ``ceil(p/100 * n)``-th), ``tail_s`` (from the moment ``ceil(0.9 n)`` of
  them had ended to the end of the last), ``tail_share`` (``tail_s / rollout_s``), the slowest.
- per replica: ``busy_s`` (the union of its requests in flight within the step's span), the
  step's requests to it, their tokens and tokens per busy second, and the gated requests'
  wait for their capture.
- anomaly: an unprofiled step whose wall time is above ``factor`` x the median of up to the
  ``baseline`` previous unprofiled steps (at least 3): the same rule as the ``slow_step``
  trigger, naming the phase that grew most over its own median.

Memory: the unions are merged as each input is taken (concurrent spans become one interval);
per step, at most ``MAX_VALUES`` latencies are kept (8 bytes each; beyond, a uniform sample and
the percentiles are marked ``estimated``). Standard library only.

- ``intervals.py``: unions of intervals, percentiles, the rolling median;
- ``account.py``: what a step's account says (:class:`StepAccount`) and the run's summary;
- ``ledger.py``: the :class:`Ledger` that takes spans and gives accounts.
"""

from aprof._accounting.account import (
    Anomaly,
    ReplicaAccount,
    Slow,
    StepAccount,
    summary,
)
from aprof._accounting.intervals import RollingMedian, Union, nearest_rank
from aprof._accounting.ledger import (
    BASELINE,
    FACTOR,
    MAX_VALUES,
    STAGE,
    Ledger,
    combined,
    ledger_file,
)

__all__ = [
    "BASELINE",
    "FACTOR",
    "MAX_VALUES",
    "STAGE",
    "Anomaly",
    "Ledger",
    "ReplicaAccount",
    "RollingMedian",
    "Slow",
    "StepAccount",
    "Union",
    "combined",
    "ledger_file",
    "nearest_rank",
    "summary",
]
