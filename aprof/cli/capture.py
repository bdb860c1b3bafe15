"""``aprof capture SAVE_PATH``: have a live run capture steps it was not configured to.

Writes a capture request into SAVE_PATH/control/requests/, where the run reads it at its next
step boundary, and prints the run's answer: the global steps, targets and bounds it accepted
(exit 0), or one line saying why not (exit 1): no live run at SAVE_PATH, steps already begun,
an unknown replica or role, a malformed request, or no answer in time (a request not read by
then is withdrawn). With --wait it then waits for those windows to end and prints each one
(exit 1 if one did not end done).

examples:
  aprof capture outputs/profile --next 2
  aprof capture outputs/profile --steps 120,130-132 --roles actor --wait
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from aprof import ConfigError, ManifestError
from aprof._control import (
    CaptureAnswer,
    CaptureRequest,
    ControlFolder,
    RunStatus,
    bad_field,
    process_gone,
)
from aprof._manifest import WindowRecord, load_step

ANSWER_GRACE_S = 5.0
"""Waited for an answer beyond the run's longest step so far."""
LEAST_WAIT_S = 10.0
"""The shortest wait for an answer (a run whose steps have all been short)."""
POLL_S = 0.1
T = TypeVar("T")


def arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aprof capture``."""
    parser.add_argument("save_path", metavar="SAVE_PATH", help="the live run's save_path")
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--next",
        nargs="?",
        const=1,
        type=int,
        metavar="N",
        help="capture the next N global steps (default: the next one)",
    )
    which.add_argument("--steps", metavar="SPEC", help="capture these global steps: '120,130-132'")
    parser.add_argument(
        "--replicas", metavar="LIST", help="only these rollout replicas: '0,3' (default: all)"
    )
    parser.add_argument(
        "--roles", metavar="LIST", help="only these roles: 'actor,ref' (default: all captured)"
    )
    parser.add_argument(
        "--forward-steps",
        type=int,
        metavar="K",
        help="engine forward steps per rollout window (default: rollout.forward_steps)",
    )
    parser.add_argument(
        "--wait", action="store_true", help="wait for those windows to end and print them"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="seconds to wait for the answer (default: the run's longest step + 5 s, at least "
        "10 s)",
    )


def run(args: argparse.Namespace) -> int:
    """Ask the run, print its answer; 0 when accepted, 1 otherwise."""
    root = Path(os.path.abspath(args.save_path))
    try:
        request = CaptureRequest.parse(_fields(args))
    except ConfigError as exc:
        return _fail(f"refused: {bad_field(exc)}")
    folder = ControlFolder(root)
    try:
        status = folder.status()
    except (OSError, ValueError) as exc:
        return _fail(f"no live run at {root}: its control/status.json cannot be read: {exc}")
    why = _not_live(root, status)
    if why is not None:
        return _fail(why)
    assert status is not None
    if args.timeout is not None and not 0 < args.timeout <= 86400:
        return _fail("--timeout takes seconds in (0, 86400]")
    limit_s = args.timeout or max(LEAST_WAIT_S, status.longest_step_s + ANSWER_GRACE_S)
    try:
        folder.submit(request)
    except OSError as exc:
        return _fail(f"cannot write the request below {root}/control: {exc}")
    answer = _await_answer(folder, root, request.id, limit_s, status)
    if isinstance(answer, str):
        return _fail(answer)
    print(answer.line())
    if not answer.accepted:
        return 1
    if args.wait:
        return _wait_for_windows(root, answer, status.run_id)
    return 0


def _fields(args: argparse.Namespace) -> dict[str, object]:
    fields: dict[str, object] = {}
    if args.next is not None:
        fields["next"] = args.next
    if args.steps is not None:
        fields["steps"] = args.steps
    for name, convert in (("replicas", _int_list), ("roles", _str_list)):
        value = getattr(args, name)
        if value is not None:
            fields[name] = convert(value, name)
    if args.forward_steps is not None:
        fields["forward_steps"] = args.forward_steps
    return fields


def _int_list(text: str, name: str) -> list[object]:
    items: list[object] = []
    for item in _str_list(text, name):
        items.append(int(item) if item.isdigit() else item)  # the request names what is not
    return items


def _str_list(text: str, name: str) -> list[str]:
    return [item.strip() for item in text.split(",")] if text.strip() else []


def _not_live(root: Path, status: RunStatus | None) -> str | None:
    """Why no run at ``root`` can answer, ``None`` when one can."""
    if status is None:
        return (
            f"no live run at {root}: no control/status.json (not an aprof save_path, a run "
            "not opened yet, or one from before aprof capture)"
        )
    if status.state == "ended":
        return f"no live run at {root}: run {status.run_id} has ended"
    if not status.folder:
        return f"run {status.run_id} reads no control folder (control.enable: false)"
    if _gone(status):
        return f"no live run at {root}: run {status.run_id}'s process {status.pid} is gone"
    return None


def _gone(status: RunStatus) -> bool:
    """The run's process has ended without saying so (it runs on this machine)."""
    return status.host == socket.gethostname() and process_gone(status.pid)


def _await_answer(
    folder: ControlFolder, root: Path, request_id: str, limit_s: float, status: RunStatus
) -> CaptureAnswer | str:
    """The run's answer, or why there is none (the request withdrawn if still unread)."""
    deadline = time.monotonic() + limit_s
    while True:
        answer = _poll(lambda: folder.answer(request_id))
        if isinstance(answer, CaptureAnswer):
            return answer
        if answer is not None:
            return answer
        now = _poll(folder.status)
        ended = isinstance(now, RunStatus) and (now.state == "ended" or _gone(now))
        if ended and folder.withdraw(request_id):
            return f"the run ended before reading the request (run {status.run_id})"
        if time.monotonic() >= deadline:
            if folder.withdraw(request_id):
                return (
                    f"no answer within {limit_s:.3g} s (the run's longest step so far took "
                    f"{status.longest_step_s:.3g} s; --timeout waits longer); the request "
                    "was withdrawn"
                )
            deadline += ANSWER_GRACE_S  # read just now: its answer is on its way
        time.sleep(POLL_S)


def _poll(read: Callable[[], T | None]) -> T | str | None:
    try:
        return read()
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return f"cannot read the run's answer: {exc}"


def _wait_for_windows(root: Path, answer: CaptureAnswer, run_id: str) -> int:
    """Print each window of ``answer`` as it ends; 0 when every one ended done."""
    pending = {(n, t) for n in answer.steps for t in answer.targets}
    failed = 0
    folder = ControlFolder(root)
    while pending:
        for n in sorted({n for n, _ in pending}):
            try:
                windows = load_step(root, n, run_id)
            except ManifestError as exc:
                return _fail(str(exc))
            for record in windows:
                key = (record.step, record.target)
                if key in pending and record.state != "running":
                    pending.discard(key)
                    failed += record.state != "done"
                    print(_window_line(record))
        if not pending:
            break
        status = _poll(folder.status)
        if isinstance(status, RunStatus) and (status.state == "ended" or _gone(status)):
            shown = ", ".join(f"step {n} {t}" for n, t in sorted(pending))
            return _fail(f"the run ended before these windows did: {shown}")
        time.sleep(POLL_S * 5)
    return 1 if failed else 0


def _window_line(record: WindowRecord) -> str:
    text = f"step {record.step} {record.target}: {record.state}"
    observed = record.forward_steps.observed
    if observed is not None:
        text += f", {observed} forward steps"
    if record.error:
        text += f" ({record.error})"
    return text


def _fail(line: str) -> int:
    print(f"aprof capture: {line}".replace("\n", "\\n"), file=sys.stderr)
    sys.stdout.flush()
    return 1
