"""The values exchanged with a capture target (the protocols are in ``aprof.abc``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

TargetKind = Literal["rollout", "role"]
CountSource = Literal["trace", "counter"]
"""Where an observed forward-step count comes from: the capture's files, or the engine's counter."""


@dataclass(frozen=True, slots=True)
class Window:
    """One capture of one target for one global step."""

    step: int
    """The global step (for a continuous role window, the first step of the run)."""
    target: str
    """The target's name."""
    kind: TargetKind
    """``rollout`` for an inference-server replica, ``role`` for engine workers."""
    delay: int
    """Engine forward steps to skip before capturing (rollout windows)."""
    forward_steps: int | None
    """Engine forward steps to capture, ``None`` for "until the step ends"."""
    dir: Path
    """The directory this capture writes into; it exists and lies inside ``save_path``."""
    prefix: str
    """A unique, path-safe file-name prefix for this capture."""
    root: Path | None = None
    """``save_path``, where ``dir`` lies: a target that writes there itself opens ``dir``
    from it without following a link below it (``None``: ``dir`` as it is)."""
    replica: int | None = None
    """The replica of a rollout window (``None`` for a role window)."""


@dataclass(frozen=True, slots=True)
class CaptureFile:
    """One file (or trace folder) of a capture."""

    path: str
    """Relative to ``save_path`` (absolute if the tool wrote outside it)."""
    bytes: int


@dataclass(frozen=True, slots=True)
class WorkerCapture:
    """What one capture of one rank did, as the driver collects it for the manifest."""

    step: int
    """The global step (for a continuous window, the first step of the run)."""
    last_step: int
    """The last global step the capture covered (``step`` unless continuous)."""
    role: str
    rank: int
    stage: str | None
    """The stage of a discrete capture; ``None`` for a step capture."""
    tool: str
    state: Literal["done", "failed"]
    files: tuple[CaptureFile, ...]
    error: str | None
    note: str | None
    """What the tool says the reader should know (say, an activity it could not record)."""
    started_ns: int
    stopped_ns: int

    def to_record(self) -> dict[str, Any]:
        """This capture as plain values: how it crosses from a worker to the driver."""
        return asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> WorkerCapture:
        """The capture :meth:`to_record` gave."""
        files = tuple(CaptureFile(**f) for f in record["files"])
        return cls(**{**record, "files": files})


@dataclass(frozen=True, slots=True)
class CaptureResult:
    """What a target reports when it stops a capture."""

    files: tuple[Path, ...] = ()
    """Files the capture produced (absolute, or relative to ``save_path``)."""
    forward_steps: int | None = None
    """Engine forward steps the capture saw, ``None`` if unknown."""
    counted_from: CountSource | None = None
    """How ``forward_steps`` was counted: iteration records in the files, or the counter."""
    auto_stopped: bool = False
    """The target (the server) had already ended the capture on its own."""
    note: str | None = None
    """Anything the reader of the manifest should know about this capture."""
    captures: tuple[WorkerCapture, ...] = ()
    """One record per rank capture of a worker-group window (empty for other targets)."""
    error: str | None = None
    """Why the capture failed, when the target could still say what it left behind: the
    window is recorded ``failed`` with this reason, and ``files`` are listed all the same
    (the stop of a server that died, a server that restarted during the window)."""
    host: str | None = None
    """The host holding ``files`` when it is not the driver's (a target placed on another
    node, :func:`aprof.ray.placed`): their sizes are ``sizes``, as that host read them."""
    sizes: tuple[int | None, ...] = ()
    """With ``host``: each file's size there (``None``: missing there too)."""


@dataclass(frozen=True, slots=True)
class WorkerTimeline:
    """A worker rank's timeline (its trainer stages) as the rank hands it to the driver."""

    process: str
    """The timeline's name: ``timeline/<process>.trace.json.gz`` below ``save_path``."""
    files: tuple[dict[str, Any], ...]
    """Each part written so far, as the manifest's ``TimelineFile`` fields."""
    ledger: Any = None
    """What the writes since the rank's last hand-over hold
    (``aprof._accounting.Ledger.take``'s plain data), for the driver's accounting."""

    def to_record(self) -> dict[str, Any]:
        """Plain fields, to cross a process boundary."""
        return {"process": self.process, "files": list(self.files), "ledger": self.ledger}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> WorkerTimeline:
        """From :meth:`to_record`'s fields."""
        return cls(str(record["process"]), tuple(record["files"]), record.get("ledger"))
