"""The manifest: what every window of a run captured.

- ``model.py``: the records (``Manifest``, ``WindowRecord``, ...) and the files' schemas;
- ``files.py``: a live run's manifest as files, written off the event loop;
- ``load.py``: :func:`load_manifest`, a run read back from its ``save_path``.
"""

from aprof._manifest.files import ManifestFiles
from aprof._manifest.load import load_manifest, load_step
from aprof._manifest.model import (
    Clock,
    EnforcedBy,
    FileEntry,
    ForwardSteps,
    Manifest,
    Note,
    NoteLevel,
    OtelRecord,
    RankCapture,
    RequestCounts,
    RequestedBy,
    StopReason,
    TimelineFile,
    Waited,
    WindowRecord,
    WindowState,
    split_notes,
)

__all__ = [
    "Clock",
    "EnforcedBy",
    "FileEntry",
    "ForwardSteps",
    "Manifest",
    "ManifestFiles",
    "Note",
    "NoteLevel",
    "OtelRecord",
    "RankCapture",
    "RequestCounts",
    "RequestedBy",
    "StopReason",
    "TimelineFile",
    "Waited",
    "WindowRecord",
    "WindowState",
    "load_manifest",
    "load_step",
    "split_notes",
]
