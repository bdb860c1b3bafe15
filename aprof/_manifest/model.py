"""The run manifest: what every window captured.

On disk a run is ``manifest.json`` (the run: its clock, config, timeline files and the notes
of no particular step) and one ``manifest/step_<n>.json`` per profiled step (that step's
windows and notes), so that recording a window change costs the same at step 10,000 as at
step 1. :func:`load_manifest` puts them back together into one :class:`Manifest`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

if TYPE_CHECKING:
    from aprof._capture import WorkerCapture

SCHEMA = "aprof.manifest/2"
"""The run file's schema (``manifest.json``)."""
STEP_SCHEMA = "aprof.step-manifest/1"
"""A step file's schema (``manifest/step_<n>.json``)."""
SINGLE_FILE_SCHEMA = "aprof.manifest/1"
"""Runs written before step files: every window in ``manifest.json``."""
FILENAME = "manifest.json"
STEPS_FOLDER = "manifest"
"""The folder of the step files, beside ``manifest.json``."""
MOST_BYTES = 256 << 20
"""The largest manifest file read back (a step of a thousand ranks' captures is a few MB)."""
STEP_FILE = re.compile(r"step_([1-9][0-9]{0,17})\.json")

WindowState = Literal["running", "done", "failed", "timeout", "skipped"]
StopReason = Literal[
    "auto_stop", "step_end", "rollout_end", "run_end", "error", "cancelled", "removed", "colocated"
]
EnforcedBy = Literal["server", "aprof", "none"]
RequestedBy = Literal["config", "on_demand", "slow_step", "slow_rollout"]
"""Why a window exists: the config selected its step, a person asked (``aprof capture``,
``prof.capture``), or a trigger fired."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


class ForwardSteps(_Model):
    """Engine forward steps of a window: asked for, seen, and who bounded the window."""

    delay: int = 0
    requested: int | None = None
    observed: int | None = None
    enforced_by: EnforcedBy = "none"
    counted_from: Literal["trace", "counter"] | None = None
    """``observed`` counted from the capture's files (``trace``) or the engine's counter."""


class RequestCounts(_Model):
    """Requests admitted to a replica while its window was starting or active."""

    admitted: int = 0
    gated: int = 0


class Waited(_Model):
    """What a window waited for before it started, besides its target's previous stop: the
    captures of targets that share its devices (``colocated`` in the config)."""

    targets: list[str]
    """The targets whose captures it waited for: their rollout ended, or they stopped."""
    seconds: float
    why: str


class FileEntry(_Model):
    """One file (or trace folder) of a window; ``path`` is relative to ``save_path``."""

    path: str
    bytes: int


class RankCapture(_Model):
    """One capture of one rank inside a worker group's role window."""

    rank: int
    stage: str | None
    """The stage of a discrete capture; ``None`` for a capture of the whole window."""
    step: int
    last_step: int
    """The last global step the capture covered (later than ``step`` in a continuous window)."""
    state: Literal["done", "failed"]
    files: list[FileEntry]
    error: str | None
    note: str | None
    """What the capture tool says the reader should know."""
    started_ns: int
    stopped_ns: int

    @classmethod
    def of(cls, capture: WorkerCapture, *, window_last_step: int) -> RankCapture:
        """The record of ``capture``, made in a window that covered up to ``window_last_step``."""
        last_step = capture.last_step
        if capture.stage is None:
            # A worker group tells its workers the first step of a continuous window only.
            last_step = max(last_step, window_last_step)
        return cls(
            rank=capture.rank,
            stage=capture.stage,
            step=capture.step,
            last_step=last_step,
            state=capture.state,
            files=[FileEntry(path=f.path, bytes=f.bytes) for f in capture.files],
            error=capture.error,
            note=capture.note,
            started_ns=capture.started_ns,
            stopped_ns=capture.stopped_ns,
        )


class WindowRecord(_Model):
    """One (step, target) window as the manifest shows it."""

    step: int
    target: str
    kind: Literal["rollout", "role"]
    tool: str
    requested_by: RequestedBy = "config"
    state: WindowState = "running"
    stop_reason: StopReason | None = None
    started_ns: int | None = None
    stopped_ns: int | None = None
    forward_steps: ForwardSteps = Field(default_factory=ForwardSteps)
    requests: RequestCounts = Field(default_factory=RequestCounts)
    files: list[FileEntry] = Field(default_factory=list)
    error: str | None = None
    waited_for: Waited | None = None
    """Set when its start waited for captures on the devices it shares."""
    captures: list[RankCapture] = Field(default_factory=list)
    """Per-rank captures of a worker group's window; empty for other role targets, and not
    written for rollout windows."""

    @model_serializer(mode="wrap")
    def _rollout_without_captures(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.kind == "rollout":
            data.pop("captures", None)
        return data


NoteLevel = Literal["info", "problem"]
"""How a note reads: ``info`` (a request accepted, a trigger fired, a window skipped as
planned) or ``problem`` (something went wrong: counts lost, a counter lost, files missing, the
manifest not written for a while)."""


class Note(_Model):
    """Something a reader of the run should know about a window, a step or the run."""

    step: int | None
    target: str | None
    text: str
    level: NoteLevel
    """Absent in older manifests, where a note of no step was read as a problem and a
    step's as information: read so."""

    @model_validator(mode="before")
    @classmethod
    def _level_of_older_manifests(cls, data: Any) -> Any:
        if isinstance(data, dict) and "level" not in data:
            return {**data, "level": "problem" if data.get("step") is None else "info"}
        return data

    @property
    def line(self) -> str:
        """The note in one line, after its step and target: ``step 3 replica_0: text``."""
        where = " ".join(
            part
            for part in (None if self.step is None else f"step {self.step}", self.target)
            if part
        )
        return f"{where}: {self.text}" if where else self.text


def split_notes(notes: Iterable[Note]) -> tuple[list[str], list[str]]:
    """The lines of ``notes`` that are problems, and those of the others, in their order:
    what ``aprof report``, ``report.html`` and ``aprof status`` show as each."""
    problems: list[str] = []
    others: list[str] = []
    for note in notes:
        (problems if note.level == "problem" else others).append(note.line)
    return problems, others


class Clock(_Model):
    """One instant read on both clocks, to place monotonic timestamps on the wall clock."""

    wall_ns: int
    monotonic_ns: int


class TimelineFile(_Model):
    """One process's timeline file (aprof's spans as a Chrome trace) and what it holds."""

    path: str
    """Relative to ``save_path``: ``timeline/<process>.trace.json.gz``."""
    process: str
    bytes: int
    events: int
    """Spans, steps and windows written to it."""
    dropped: int
    """Events that did not fit into ``timeline.buffer_events`` and were not recorded."""
    recorder: Literal["c", "python"] | None = None
    """Which recorder recorded it (``aprof.timeline_backend()``); absent in older manifests."""
    host: str | None = None
    """The machine the process ran on; absent in older manifests."""


class HostClock(_Model):
    """One host's wall clock against the driver's, measured over Ray (probes both ways: the
    driver's send and receive times around the host's reading)."""

    host: str
    """As Ray names the node: its IP address."""
    offset_ns: int
    """What to add to this host's wall clock to read the driver's (the driver's host: 0)."""
    uncertainty_ns: int
    """Half the round trip of the probe it comes from: the offset is good to within this."""
    measured_ns: int
    """When that probe was made, on the driver's wall clock."""
    measurements: int = 1
    """Bursts of probes made (as other processes connect, at each profiled step, at close)."""
    drift_ns: int = 0
    """How far apart the offsets of those bursts lay: the largest minus the smallest."""


class HostFile(_Model):
    """One file of the run, with the host that holds it (wrote it)."""

    path: str
    """Relative to ``save_path``."""
    host: str
    bytes: int
    sha256: str | None = None
    """Set once collected: the driver's copy was checked against it."""


class OtelRecord(_Model):
    """The run's OTLP receiver (``otel.receive``) and what it kept below ``otel/``."""

    endpoint: str
    """Its base URL (OTLP's ``/v1/traces`` below it)."""
    spans: int = 0
    """Spans written below ``otel/``: ``step_<n>.spans.jsonl`` by the step their trace id
    names, ``no_step.spans.jsonl``, ``other.spans.jsonl`` (another trace's)."""
    dropped: int = 0
    """Spans not kept: over ``otel.max_spans_per_step``, of a step the run did not begin (or
    began too long ago), or lost to a failed write."""


class Manifest(_Model):
    """Every window of one run, with its state, files and counts."""

    schema_: str = Field(default=SCHEMA, alias="schema")
    run_id: str
    clock: Clock
    save_path: str
    windows: list[WindowRecord] = Field(default_factory=list)
    notes: list[Note] = Field(default_factory=list)
    timeline: list[TimelineFile] = Field(default_factory=list)
    trace_salt: str | None = None
    """The first half (16 hex digits) of the run's W3C trace ids; the second is the step."""
    otel: OtelRecord | None = None
    """The run's OTLP receiver, when ``otel.receive`` is on."""
    hosts: list[HostClock] = Field(default_factory=list)
    """Each host's clock against the driver's (a run over several Ray nodes)."""
    files: list[HostFile] = Field(default_factory=list)
    """Every file of the run on every host, as listed as it closed or was collected (a run
    over several Ray nodes)."""
    config: dict[str, Any] = Field(default_factory=dict)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def window(self, step: int, target: str) -> WindowRecord | None:
        """The window of ``target`` for ``step``, if there is one."""
        for record in self.windows:
            if record.step == step and record.target == target:
                return record
        return None

    def to_json(self) -> str:
        """The whole manifest as one JSON document."""
        return self.model_dump_json(by_alias=True, indent=1)


class RunFile(_Model):
    """``manifest.json``: the run, without the windows (those are in the step files)."""

    schema_: str = Field(default=SCHEMA, alias="schema")
    run_id: str
    clock: Clock
    save_path: str
    steps: str = f"{STEPS_FOLDER}/step_<n>.json"
    """Where the windows and notes of each step are."""
    notes: list[Note] = Field(default_factory=list)
    """Notes of no particular step."""
    timeline: list[TimelineFile] = Field(default_factory=list)
    trace_salt: str | None = None
    """The first half (16 hex digits) of the run's W3C trace ids; the second is the step."""
    otel: OtelRecord | None = None
    """The run's OTLP receiver, when ``otel.receive`` is on."""
    hosts: list[HostClock] = Field(default_factory=list)
    """Each host's clock against the driver's (a run over several Ray nodes)."""
    files: list[HostFile] = Field(default_factory=list)
    """Every file of the run on every host, as listed as it closed or was collected (a run
    over several Ray nodes)."""
    config: dict[str, Any] = Field(default_factory=dict)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class StepFile(_Model):
    """``manifest/step_<n>.json``: the windows and notes of one step of one run."""

    schema_: str = Field(default=STEP_SCHEMA, alias="schema")
    run_id: str
    step: int
    windows: list[WindowRecord] = Field(default_factory=list)
    notes: list[Note] = Field(default_factory=list)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
