"""``servers.trace_files``: counting the engine steps a vLLM or SGLang capture holds, whatever
it finds,
and moving a window's traces without writing anywhere but the window's folder."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import on_another_device

from servers.trace_files import (
    count_sglang_steps,
    count_vllm_iterations,
    relocate,
    sglang_steps_in,
    vllm_steps_in,
)


def _event(name: str) -> dict[str, object]:
    return {"name": name, "cat": "user_annotation", "ph": "X", "ts": 0, "dur": 1}


def _write(path: Path, data: object) -> Path:
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    return path


def test_worker_traces_are_counted_and_the_largest_count_wins(tmp_path: Path) -> None:
    steps = [_event("execute_context_1(5)_generation_0(0)"), _event("execute_context_0(0)_gen")]
    rank0 = _write(tmp_path / "p_rank0.1.pt.trace.json.gz", {"traceEvents": steps})
    rank1 = _write(tmp_path / "p_rank1.1.pt.trace.json.gz", {"traceEvents": steps[:1]})
    front = _write(tmp_path / "p_vm_1.async_llm.1.pt.trace.json.gz", {"traceEvents": steps * 3})
    assert count_vllm_iterations(rank0) == 2
    assert vllm_steps_in([rank1, rank0, front]) == 2


def test_sglang_counts_step_annotations_not_run_batch(tmp_path: Path) -> None:
    # As a real SGLang 0.5.23 trace holds them: one step[...] per forward pass; run_batch
    # also covers the batch that ends the capture; GPU-side copies are another category.
    steps = [_event("step[EXTEND bs=1 toks=1]"), *[_event("step[DECODE bs=1]")] * 4]
    others = [_event("scheduler.run_batch")] * 6 + [_event("scheduler.idle")]
    gpu = {**_event("step[DECODE bs=1]"), "cat": "gpu_user_annotation"}
    rank0 = _write(tmp_path / "1796130907.85-TP-0.trace.json.gz", {"traceEvents": steps + others})
    rank1 = _write(tmp_path / "1796130907.85-TP-1.trace.json.gz", {"traceEvents": [gpu]})
    assert count_sglang_steps(rank0) == 5
    assert count_sglang_steps(rank1) == 0
    broken = tmp_path / "x-TP-2.trace.json.gz"
    broken.write_bytes(b"\x1f\x8b not gzip")
    assert sglang_steps_in([rank0, rank1, broken, tmp_path / "notes.txt"]) == 5
    assert sglang_steps_in([broken]) is None


def test_trace_reading_is_bounded(tmp_path: Path) -> None:
    trace = _write(tmp_path / "big-TP-0.trace.json.gz", {"traceEvents": [_event("step[X]")] * 50})
    assert count_sglang_steps(trace) == 50
    with pytest.raises(ValueError, match="more than 100 bytes"):
        count_sglang_steps(trace, limit=100)
    with pytest.raises(ValueError, match="more than 100 bytes"):
        count_vllm_iterations(trace, limit=100)


def test_array_form_trace_is_counted(tmp_path: Path) -> None:
    """Chrome trace JSON may be the bare list of events."""
    trace = _write(tmp_path / "rank0.1.pt.trace.json.gz", [_event("execute_context_1(2)_x"), 7])
    assert vllm_steps_in([trace]) == 1


def test_unreadable_traces_are_no_count_not_an_error(tmp_path: Path) -> None:
    """A stop has already been sent when traces are counted: a bad file must not raise."""
    corrupt = tmp_path / "a_rank0.1.pt.trace.json.gz"
    corrupt.write_bytes(gzip.compress(b"{}")[:10] + b"\xff" * 64)  # header, then no deflate data
    truncated = tmp_path / "b_rank0.1.pt.trace.json.gz"
    truncated.write_bytes(gzip.compress(json.dumps({"traceEvents": []}).encode())[:-12])
    scalar = _write(tmp_path / "c_rank0.1.pt.trace.json.gz", 3)
    weird = _write(tmp_path / "d_rank0.1.pt.trace.json.gz", {"traceEvents": {"a": 1}})
    assert vllm_steps_in([corrupt, truncated, scalar, weird]) is None


def _relocate(source: Path, dest: Path) -> tuple[list[Path], list[Path]]:
    found = relocate(source, dest, "p", None, 0)
    assert found is not None
    return found


def _folders(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The server's trace folder, the window's folder, and a folder outside ``save_path``."""
    source, dest, outside = tmp_path / "traces", tmp_path / "save" / "w", tmp_path / "outside"
    for folder in (source, dest, outside):
        folder.mkdir(parents=True)
    return source, dest, outside


@pytest.mark.parametrize("devices", ["same", "across"])
def test_relocation_follows_no_link_and_replaces_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, devices: str
) -> None:
    source, dest, outside = _folders(tmp_path)
    if devices == "across":
        on_another_device(monkeypatch, source)
    secret = outside / "secret.txt"
    secret.write_text("not the server's")
    (source / "p_rank0.1.pt.trace.json.gz").write_text("trace")
    npu = source / "p_host_1_ascend_pt"
    (npu / "FRAMEWORK").mkdir(parents=True)
    (npu / "FRAMEWORK" / "data.json").write_text("npu")
    # A trace that is a link to a file outside: never moved, its target never read.
    (source / "p_rank1.1.pt.trace.json.gz").symlink_to(secret)
    # Names already taken in the window's folder, one by a link planted to a folder outside
    # and one by a link to a file outside: neither is written through nor replaced.
    (source / "p_rank2.1.pt.trace.json.gz").write_text("trace 2")
    (dest / "p_rank2.1.pt.trace.json.gz").symlink_to(outside)
    (source / "p_rank3.1.pt.trace.json.gz").write_text("trace 3")
    (dest / "p_rank3.1.pt.trace.json.gz").symlink_to(secret)
    moved, kept = _relocate(source, dest)
    assert sorted(p.name for p in moved) == ["p_host_1_ascend_pt", "p_rank0.1.pt.trace.json.gz"]
    assert all(p.parent == dest for p in moved)
    assert (dest / "p_rank0.1.pt.trace.json.gz").read_text() == "trace"
    assert (dest / "p_host_1_ascend_pt" / "FRAMEWORK" / "data.json").read_text() == "npu"
    assert sorted(p.name for p in kept) == [f"p_rank{k}.1.pt.trace.json.gz" for k in (1, 2, 3)]
    assert all(p.parent == source for p in kept)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert secret.read_text() == "not the server's"
    assert (dest / "p_rank3.1.pt.trace.json.gz").is_symlink()
    assert sorted(p.name for p in source.iterdir()) == [p.name for p in kept]


@pytest.mark.parametrize("devices", ["same", "across"])
def test_relocation_into_a_linked_folder_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, devices: str
) -> None:
    source, dest, outside = _folders(tmp_path)
    if devices == "across":
        on_another_device(monkeypatch, source)
    dest.rmdir()
    dest.symlink_to(outside)
    (source / "p_rank0.1.pt.trace.json.gz").write_text("trace")
    moved, kept = _relocate(source, dest)
    assert (moved, kept) == ([], [source / "p_rank0.1.pt.trace.json.gz"])
    assert list(outside.iterdir()) == []
