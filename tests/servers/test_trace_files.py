"""``servers.trace_files``: counting the engine steps a vLLM capture holds, whatever it finds."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from servers.trace_files import count_vllm_iterations, vllm_steps_in


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
