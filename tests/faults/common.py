"""Checks every part of the fault suite makes: windows final, captures stopped, manifests
that load, nothing written outside ``save_path``; and a recording target that keeps what
its starts did."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof.testing import RecordingTarget
from faults.tally import Faults

FINAL = ("done", "failed", "timeout", "skipped")

Entry = tuple[str, int, int, str]
"""What a path is: kind, size, mtime (ns), and its content's digest or link target."""


def snapshot(root: Path, *, exclude: Iterable[Path] = ()) -> dict[str, Entry]:
    """Every entry below ``root`` (links not followed), but those below ``exclude``."""
    skip = {os.path.abspath(p) for p in exclude}
    found: dict[str, Entry] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(folder, d) not in skip]
        for name in dirs + files:
            path = os.path.join(folder, name)
            if path in skip:
                continue
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                what = "link:" + os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as file:
                    what = hashlib.sha256(file.read()).hexdigest()
            else:
                what = ""
            kind = stat.filemode(info.st_mode)[0]
            found[os.path.relpath(path, root)] = (kind, info.st_size, info.st_mtime_ns, what)
    return found


def check_outside(faults: Faults, before: dict[str, Entry], after: dict[str, Entry]) -> None:
    """Nothing outside ``save_path`` was created, changed or removed between two snapshots."""
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    faults.check("outside", not changed, f"changed outside save_path: {changed[:10]}")


def load(faults: Faults, path: Path | str) -> aprof.Manifest | None:
    """``aprof.load_manifest(path)``, or ``None`` (lost) when it does not load."""
    try:
        manifest = aprof.load_manifest(path)
    except Exception as exc:
        faults.check("unloadable", False, f"{path}: {type(exc).__name__}: {exc}")
        return None
    faults.check("unloadable", True, "")
    return manifest


def check_windows(
    faults: Faults, manifest: aprof.Manifest | None, *, running_ok: bool = False
) -> None:
    """Every window is final (or ``running``, after a kill, with ``running_ok``) and says why
    it ended: ``done`` without an error, ``failed``/``timeout`` with one, ``skipped`` with an
    error or a note about it."""
    if manifest is None:
        return
    noted = {(n.step, n.target) for n in manifest.notes}
    for w in manifest.windows:
        faults.count("windows")
        where = f"step {w.step} {w.target}: {w.state} ({w.stop_reason}, {w.error!r})"
        if w.state == "running":
            faults.check("not_final", running_ok, where)
            continue
        if w.state == "done":
            why = w.error is None
        elif w.state == "skipped":
            why = bool(w.error) or (w.step, w.target) in noted
        else:
            why = bool(w.error)
        final = w.state in FINAL and w.stop_reason is not None and why
        faults.check("not_final", final, where)


def same_windows(live: aprof.Manifest, loaded: aprof.Manifest | None) -> bool:
    """The manifest read back lists the live manifest's windows, as they are."""
    if loaded is None:
        return False
    dump = sorted((w.step, w.target, w.model_dump_json()) for w in live.windows)
    back = sorted((w.step, w.target, w.model_dump_json()) for w in loaded.windows)
    return dump == back


class LedgerTarget(RecordingTarget):
    """A :class:`RecordingTarget` that also keeps how each of its starts ended:
    ``ok`` (returned), ``raised`` or ``cancelled`` (cut off by its timeout).

    A plain ``RecordingTarget`` keeps a capture whose stop failed running, so that every
    later start fails; with ``ends_on_failed_stop`` the capture ends all the same (a server
    that stopped but could not say so), and the target captures again.
    """

    def __init__(self, name: str, *, ends_on_failed_stop: bool = False, **kwargs: object) -> None:
        super().__init__(name, **kwargs)  # type: ignore[arg-type]
        self.ledger: list[tuple[str, aprof.Window, str]] = []
        """``(op, window, outcome)`` in the order the calls ended."""
        self._ends_on_failed_stop = ends_on_failed_stop

    async def start(self, window: aprof.Window) -> None:
        try:
            await super().start(window)
        except asyncio.CancelledError:
            self.ledger.append(("start", window, "cancelled"))
            raise
        except BaseException:
            self.ledger.append(("start", window, "raised"))
            raise
        self.ledger.append(("start", window, "ok"))

    async def stop(self, window: aprof.Window) -> aprof.CaptureResult:
        try:
            return await super().stop(window)
        except BaseException:
            if self._ends_on_failed_stop and self.active is window:
                self.active = None
            raise
        finally:
            self.ledger.append(("stop", window, "called"))


def check_stops(faults: Faults, target: LedgerTarget) -> list[str]:
    """Every start of ``target`` that succeeded got exactly one stop, after it and before the
    next start; no stop went to a capture whose start did not succeed; no window was started
    or stopped twice. Unstopped captures are lost; the other breaches are returned."""
    return check_calls(faults, target.name, *ledger_of(target))


def ledger_of(target: LedgerTarget) -> tuple[list[tuple[str, str]], set[str]]:
    """``target``'s start and stop calls as ``(op, window prefix)``, in order, and the
    prefixes of the windows whose start succeeded."""
    calls: list[tuple[str, str]] = [
        (c.op, c.window.prefix) for c in target.calls if c.window is not None
    ]
    succeeded = {w.prefix for op, w, outcome in target.ledger if op == "start" and outcome == "ok"}
    return calls, succeeded


def check_calls(
    faults: Faults, name: str, calls: list[tuple[str, str]], succeeded: set[str]
) -> list[str]:
    """:func:`check_stops` on a target's calls, ``(op, window prefix)`` in order, and the
    windows whose start succeeded."""
    breaches = []
    open_: str | None = None
    for op, window in calls:
        if op == "start":
            if open_ is not None:
                faults.check("not_stopped", False, f"{name}: {open_} not stopped before the next")
            open_ = window if window in succeeded else None
        elif op == "stop":
            if window not in succeeded:
                breaches.append(f"{name}: stop of {window}, never started")
            if window == open_:
                faults.check("not_stopped", True, "")
                open_ = None
    if open_ is not None:
        faults.check("not_stopped", False, f"{name}: {open_} never stopped")
    for what in ("start", "stop"):
        windows = [w for op, w in calls if op == what]
        twice = sorted({w for w in windows if windows.count(w) > 1})
        if twice:
            breaches.append(f"{name}: {what} twice: {twice}")
    return breaches


def on_another_device(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Make renames and hard links out of ``folder`` fail as across devices (``EXDEV``),
    as they do when a server's trace folder is another file system than ``save_path``."""

    def crossing(real: Callable[..., None]) -> Callable[..., None]:
        def call(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if isinstance(src, (str, Path)) and Path(src).is_relative_to(folder):
                raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(src))
            real(src, dst, *args, **kwargs)

        return call

    monkeypatch.setattr(os, "rename", crossing(os.rename))
    monkeypatch.setattr(os, "link", crossing(os.link))
