"""Which global (RL) steps are profiled: the value of `global_profiler.steps`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TypeGuard

from aprof._errors import ConfigError

MAX_SELECTED = 100_000
"""Most steps one explicit selection may hold (beyond that, `every: k` is the tool)."""

MAX_INT = 2**63 - 1
"""Largest integer a config value may hold: a signed 64-bit one, what torch's APIs take."""

# At most 18 digits: int() of a longer digit string can hit Python's int-string limit.
_ITEM = re.compile(r"([0-9]{1,18})(?:\s*-\s*([0-9]{1,18}))?", re.ASCII)
_FORMS = "null, a step, a list of steps, a range string like '1-3,5' or {every: k}"


@dataclass(frozen=True, slots=True, repr=False)
class StepSelection:
    """A set of 1-based global steps: explicit steps, every k-th step, or none.

    Build one with `StepSelection.parse`; `StepSelection()` selects nothing.
    """

    explicit: tuple[int, ...] | None = ()
    """The selected steps in ascending order, or None when `every` is set."""
    every: int | None = None
    """k when every k-th step (k, 2k, 3k, ...) is selected, else None."""
    _members: frozenset[int] = field(default=frozenset(), init=False, compare=False)

    def __post_init__(self) -> None:
        if (self.explicit is None) == (self.every is None):
            raise ValueError("StepSelection needs exactly one of `explicit` and `every`")
        if self.every is not None and not (is_int(self.every) and self.every > 0):
            raise ValueError(f"`every` must be a positive integer, got {self.every!r}")
        if self.explicit is not None:
            steps = self.explicit
            if not all(is_int(n) and n > 0 for n in steps) or any(
                a >= b for a, b in pairwise(steps)
            ):
                raise ValueError(f"`explicit` must be ascending positive integers, got {steps!r}")
            object.__setattr__(self, "_members", frozenset(steps))

    @classmethod
    def parse(cls, value: object, *, key: str = "global_profiler.steps") -> StepSelection:
        """Parse a configured value; raise ConfigError naming `key` and the reason."""
        if value is None:
            return cls()
        if isinstance(value, StepSelection):
            return value
        if isinstance(value, Mapping):
            return cls(explicit=None, every=_parse_every(value, key))
        if isinstance(value, str):
            return cls(explicit=_parse_ranges(value, key))
        if isinstance(value, list | tuple):
            return cls(explicit=_parse_list(value, key))
        if is_int(value):
            return cls(explicit=(_positive(value, key),))
        raise ConfigError(key, f"expected {_FORMS}, got {show_value(value)}")

    def __contains__(self, n: object) -> bool:
        if not is_int(n) or n < 1:
            return False
        if self.every is not None:
            return n % self.every == 0
        return n in self._members

    @property
    def is_empty(self) -> bool:
        """True when no step is selected."""
        return self.every is None and not self.explicit

    def last_of_run(self, n: int) -> bool:
        """True if n is selected and n + 1 is not: where a run of consecutive steps ends."""
        return n in self and (n + 1) not in self

    def to_config(self) -> list[int] | dict[str, int] | None:
        """The canonical configured form: a sorted list, `{"every": k}`, or None."""
        if self.every is not None:
            return {"every": self.every}
        return list(self.explicit) if self.explicit else None

    def __str__(self) -> str:
        if self.every is not None:
            return f"every {self.every}"
        if not self.explicit:
            return "none"
        return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in _runs(self.explicit))

    def __repr__(self) -> str:
        return f"StepSelection({str(self)!r})"


def is_int(value: object) -> TypeGuard[int]:
    """True for an int that is not a bool."""
    # bool is an int subclass, but `steps: true` is a mistake, not step 1.
    return isinstance(value, int) and not isinstance(value, bool)


def show_value(value: object) -> str:
    """`value` as a config error message quotes it: YAML words, short reprs, or its type."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if is_int(value) and abs(value) >= 10**40:
        # Like long strings, cut short; past 4300 digits Python refuses to print it at all.
        return "an integer of more than 40 digits"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    return f"a {type(value).__name__}"


def key_member(name: object) -> str:
    """`name` as a key-path part: `.name`, or `['a\\nb']` when it would not read as one line."""
    return f".{name}" if isinstance(name, str) and name.isprintable() else f"[{name!r}]"


def _positive(value: object, key: str) -> int:
    if not is_int(value):
        raise ConfigError(key, f"expected a positive integer, got {show_value(value)}")
    if value < 1:
        raise ConfigError(
            key, f"must be a positive integer (steps are 1-based), got {show_value(value)}"
        )
    if value > MAX_INT:
        raise ConfigError(key, f"must be <= {MAX_INT}, got {show_value(value)}")
    return value


def _parse_every(value: Mapping[object, object], key: str) -> int:
    for name in value:
        if name != "every":
            raise ConfigError(key + key_member(name), "unknown key; expected 'every'")
    if "every" not in value:
        raise ConfigError(key, "expected {every: k}, got an empty mapping")
    return _positive(value["every"], f"{key}.every")


def _parse_list(value: list[object] | tuple[object, ...], key: str) -> tuple[int, ...]:
    if len(value) > MAX_SELECTED:
        raise ConfigError(key, f"selects more than {MAX_SELECTED} steps; use {{every: k}}")
    seen: set[int] = set()
    for i, item in enumerate(value):
        n = _positive(item, f"{key}[{i}]")
        if n in seen:
            raise ConfigError(f"{key}[{i}]", f"step {n} is listed twice")
        seen.add(n)
    return tuple(sorted(seen))


def _parse_ranges(value: str, key: str) -> tuple[int, ...]:
    seen: set[int] = set()
    for pos, raw in enumerate(value.split(","), 1):
        item = raw.strip()
        if not item:
            raise ConfigError(key, f"item {pos} of {value!r} is empty")
        match = _ITEM.fullmatch(item)
        if match is None:
            raise ConfigError(key, f"{item!r} is not a step or a range like '1-3'")
        lo = int(match[1])
        hi = int(match[2]) if match[2] is not None else lo
        if lo < 1:
            raise ConfigError(key, f"steps are 1-based, got 0 in {item!r}")
        if hi < lo:
            raise ConfigError(key, f"reversed range {item!r}; write '{hi}-{lo}'")
        if len(seen) + (hi - lo + 1) > MAX_SELECTED:
            raise ConfigError(key, f"selects more than {MAX_SELECTED} steps; use {{every: k}}")
        for n in range(lo, hi + 1):
            if n in seen:
                raise ConfigError(key, f"step {n} is selected twice in {value!r}")
            seen.add(n)
    return tuple(sorted(seen))


def _runs(steps: Iterable[int]) -> list[tuple[int, int]]:
    """Ascending steps as (first, last) runs of consecutive numbers."""
    runs: list[tuple[int, int]] = []
    for n in steps:
        if runs and runs[-1][1] == n - 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs
