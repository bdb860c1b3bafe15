"""Generated programs and attribute values against the timeline's format rules.

A program is a set of concurrent tasks, each a tree of nested spans and requests that yield to
the loop a generated number of times, maybe ending in an exception, with a generated buffer
size, batch size and writes at generated points. Whatever the interleaving, the file must
parse, pair every ``b`` with an ``e``, keep ids unique among open slices, hold exactly the
spans that fit the buffer, and count the rest as dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from timeline_rules import Slice, check_trace, load_trace, timeline_file

import aprof
from aprof._timeline import timeline as _timeline


@dataclass(frozen=True)
class Node:
    """A span (``replica`` is None) or a request, its yields, its children, and whether its
    body raises at the end."""

    name: str
    replica: int | None
    yields: int
    raises: bool
    children: tuple[Node, ...]


class Planned(Exception):
    """Raised by a node told to; caught by the task that runs it."""


nodes = st.recursive(
    st.builds(
        Node,
        name=st.sampled_from(["turn", "tool_call", "think"]),
        replica=st.none() | st.integers(0, 2),
        yields=st.integers(0, 3),
        raises=st.booleans(),
        children=st.just(()),
    ),
    lambda inner: st.builds(
        Node,
        name=st.sampled_from(["turn", "episode"]),
        replica=st.none(),
        yields=st.integers(0, 2),
        raises=st.just(False),
        children=st.lists(inner, max_size=3).map(tuple),
    ),
    max_leaves=8,
)


def walk(node: Node, path: str) -> dict[str, Node]:
    """Every node of the tree by its path ("2", "2.0", "2.0.1")."""
    found = {path: node}
    for i, child in enumerate(node.children):
        found |= walk(child, f"{path}.{i}")
    return found


async def run(prof: aprof.Profiler, node: Node, path: str) -> None:
    manager: Any = (
        prof.span(node.name, path=path)
        if node.replica is None
        else prof.request(replica=node.replica, request_id=path)
    )
    async with manager:
        for _ in range(node.yields):
            await asyncio.sleep(0)
        for i, child in enumerate(node.children):
            with contextlib.suppress(Planned):
                await run(prof, child, f"{path}.{i}")
        if node.raises:
            raise Planned


def within(outer: Slice, inner: Slice) -> bool:
    return outer.begin <= inner.begin <= inner.end <= outer.end


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    programs=st.lists(nodes, min_size=1, max_size=6),
    buffer=st.integers(1, 40),
    batch=st.integers(1, 8),
    write_after=st.sets(st.integers(0, 5)),
)
def test_any_interleaving_gives_a_valid_file_with_what_fit(
    programs: list[Node], buffer: int, batch: int, write_after: set[int]
) -> None:
    """``batch`` stands in for the 2,000 events handed to the writer at a time, so that
    small programs cross batch boundaries too."""

    async def main(save: Path) -> tuple[int, int]:
        cfg = {"global_profiler": {"save_path": str(save)}, "timeline": {"buffer_events": buffer}}
        async with aprof.Profiler(cfg) as prof:
            tasks = [asyncio.create_task(run(prof, n, str(i))) for i, n in enumerate(programs)]
            for i, task in enumerate(tasks):
                with contextlib.suppress(Planned):
                    await task
                if i in write_after:
                    await prof.flush()
        [entry] = prof.manifest.timeline
        return entry.events, entry.dropped

    with tempfile.TemporaryDirectory() as folder, mock.patch.object(_timeline, "_BATCH", batch):
        save = Path(folder)
        events, dropped = asyncio.run(main(save))
        roots = check_trace(load_trace(timeline_file(save)))
    planned: dict[str, Node] = {}
    for i, node in enumerate(programs):
        planned |= walk(node, str(i))
    assert events + dropped == len(planned)
    kept = {r.args.get("path", r.args.get("request_id")): r for r in roots}
    assert len(kept) == len(roots) == events
    assert set(kept) <= set(planned)
    assert dropped == 0 or events >= buffer
    for path, found in kept.items():
        node = planned[path]
        assert found.name == (
            node.name if node.replica is None else f"request replica_{node.replica}"
        )
        assert found.args.get("note") == ("Planned" if node.raises else None)
        parent = path.rpartition(".")[0]
        if parent in kept:  # a span or request ends before the one around it
            assert within(kept[parent], found)


scalars = st.text() | st.integers(-(2**80), 2**80) | st.floats() | st.booleans() | st.none()


@settings(max_examples=50, deadline=None)
@given(
    name=st.text(min_size=1),
    attrs=st.dictionaries(
        st.text().filter(lambda k: k.isidentifier() and k != "step"), scalars, max_size=5
    ),
)
@example(name="0", attrs={"name": None})  # an attr called name: the span's name is positional
def test_span_names_and_attrs_survive_any_value(name: str, attrs: dict[str, Any]) -> None:
    """Quotes, control characters, huge ints, NaN: the file parses and the args come back
    (non-finite floats as their text)."""

    async def main(save: Path) -> None:
        async with aprof.Profiler({"global_profiler": {"save_path": str(save)}}) as prof:
            with prof.span(name, **attrs):
                pass

    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(main(Path(folder)))
        (span,) = check_trace(load_trace(timeline_file(Path(folder))))
    assert span.name == name
    expected = {
        k: str(v) if isinstance(v, float) and not math.isfinite(v) else v for k, v in attrs.items()
    }
    assert span.args == expected | {"step": None}
