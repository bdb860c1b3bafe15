"""The manifest: what every window of a run captured.

- ``model.py``: the records (``Manifest``, ``WindowRecord``, ...) and the files' schemas;
- ``files.py``: a live run's manifest as files, written off the event loop;
- ``load.py``: :func:`load_manifest`, a run read back from its ``save_path``.
"""

from aprof._manifest.files import ManifestFiles
from aprof._manifest.load import load_manifest, load_run_file, load_step
from aprof._manifest.model import (
    FILENAME,
    Clock,
    EnforcedBy,
    FileEntry,
    ForwardSteps,
    HostClock,
    HostFile,
    Manifest,
    Note,
    NoteLevel,
    OtelRecord,
    RankCapture,
    RequestCounts,
    RequestedBy,
    RunFile,
    StopReason,
    TimelineFile,
    Waited,
    WindowRecord,
    WindowState,
    split_notes,
)

__all__ = [
    "FILENAME",
    "Clock",
    "EnforcedBy",
    "FileEntry",
    "ForwardSteps",
    "HostClock",
    "HostFile",
    "Manifest",
    "ManifestFiles",
    "Note",
    "NoteLevel",
    "OtelRecord",
    "RankCapture",
    "RequestCounts",
    "RequestedBy",
    "RunFile",
    "StopReason",
    "TimelineFile",
    "Waited",
    "WindowRecord",
    "WindowState",
    "load_manifest",
    "load_run_file",
    "load_step",
    "split_notes",
]
