"""A merged step as Perfetto merges it itself: the original files in a TAR archive with a
``perfetto_manifest.json`` (Perfetto's trace-manifest format, version 1).

Chrome JSON traces carry no clock Perfetto reads, so each file is pinned (``clocks.sync_to``
without a ``clock``) to the first file, the driver's timeline, with the offset between their
time bases; a file written on another host is given that host as its ``machine``.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MANIFEST = "perfetto_manifest.json"


@dataclass(frozen=True)
class ArchiveFile:
    """One trace of the archive: its path below ``save_path`` (its name in the archive), the
    file to read, the wall-clock time in ns its ``ts`` 0 stands for, and the host that wrote
    it if known."""

    path: str
    source: Path
    base_ns: int
    host: str | None = None


def manifest(files: list[ArchiveFile], *, attributes: dict[str, str | int]) -> dict[str, object]:
    """The trace manifest pinning every file to the first one."""
    reference = files[0]
    hosts = {f.host for f in files if f.host is not None}
    entries: list[dict[str, object]] = []
    for file in files:
        entry: dict[str, object] = {"path": file.path}
        if len(hosts) > 1 and file.host is not None:  # one host: no machine to tell apart
            entry["machine"] = {"name": file.host}
        if file is not reference:
            # At one instant this file reads T when the reference reads T + offset_ns.
            entry["clocks"] = {
                "sync_to": {"file": reference.path},
                "offset_ns": file.base_ns - reference.base_ns,
            }
        entries.append(entry)
    return {"perfetto_manifest": {"version": 1, "files": entries, "attributes": attributes}}


def write(out: BinaryIO, files: list[ArchiveFile], attributes: dict[str, str | int]) -> None:
    """Write the archive into ``out``: the manifest, then each file (one at a time,
    streamed)."""
    with tarfile.open(fileobj=out, mode="w") as tar:
        text = json.dumps(manifest(files, attributes=attributes), indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
        for file in files:
            with open(file.source, "rb") as source:
                member = tar.gettarinfo(fileobj=source, arcname=file.path)
                member.uid = member.gid = 0
                member.uname = member.gname = ""
                tar.addfile(member, source)
