"""Bringing the files other nodes hold of a run into the driver's ``save_path``, over Ray.

Each node's agent lists its part of ``save_path`` (no link followed); each file the driver
does not hold yet comes over in pieces of ``CHUNK`` bytes, two in flight, into a temporary
file under its final name's folder, is checked against the SHA-256 the node computed, and
only then takes its name. A file already there with the same content is not fetched again;
one there with other content is left as it is (noted). A node gone, a file that vanished or
changed while it came over: a note, and the rest goes on. Memory stays at a few pieces
whatever the files' sizes; every wait is bounded by the collection's deadline.
"""

from __future__ import annotations

import collections
import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from aprof._errors import describe
from aprof._manifest import FILENAME, HostFile, Note, load_manifest, load_run_file
from aprof._safe_files import open_folder, replacing, write_file
from aprof.ray._nodes import AGENT_S, Node, Nodes
from aprof.ray._run_files import Listing, digest_below, list_below

CHUNK = 4 << 20
"""Bytes per piece: large enough that a call's cost is small beside it, small enough that two
in flight cost little memory."""
IN_FLIGHT = 2


@dataclass
class Collection:
    """What one collection did."""

    files: list[HostFile] = field(default_factory=list)
    """Every file of the run, on the host that wrote it."""
    fetched: int = 0
    fetched_bytes: int = 0
    present: int = 0
    """Files of other hosts the driver already held (collected before)."""
    notes: list[str] = field(default_factory=list)


class _Deadline:
    def __init__(self, limit_s: float) -> None:
        self._end = time.monotonic() + limit_s

    def left(self, most: float) -> float:
        left = self._end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the collection's time is up")
        return min(left, most)


def gather(
    save_path: Path,
    nodes: Nodes,
    known: list[HostFile],
    *,
    limit_s: float,
    fetch: bool = True,
) -> Collection:
    """List the run's files on the driver's host and every other node; with ``fetch``, bring
    those of other nodes into ``save_path``. ``known``: the files the manifest listed
    before (a second collection fetches only what is missing). Blocking: run it off the
    event loop."""
    done = Collection()
    deadline = _Deadline(limit_s)
    root = str(save_path)
    before = {f.path: f for f in known}
    remote: dict[str, HostFile] = {}
    nodes.refresh()
    for node in list(nodes.nodes.values()):
        try:
            listing: Listing = nodes.call(node, "listing", limit_s=deadline.left(nodes.call_s))
        except Exception as exc:
            nodes.gone[node.host] = describe(exc)
            continue
        nodes.gone.pop(node.host, None)  # a probe that timed out before says nothing now
        if listing.shared:
            continue  # it sees the driver's folder: its files are listed below as the driver's
        _say_listing(node.host, listing, done)
        for path, size in sorted(listing.files.items()):
            entry = HostFile(path=path, host=node.host, bytes=size)
            if fetch:
                entry = _bring(root, nodes, node, entry, before.get(path), deadline, done)
            remote.setdefault(path, entry)
    alive = {node.host for node in nodes.nodes.values()} | {nodes.driver}
    for host in sorted({f.host for f in before.values()} - alive):
        nodes.gone.setdefault(host, "its Ray node is gone")
    here = list_below(root)
    _say_listing(nodes.driver, here, done)
    for path, size in here.files.items():
        if path in remote:
            continue
        earlier = before.get(path)
        # A file collected before from a host gone since is still that host's.
        host = earlier.host if earlier is not None else nodes.driver
        sha = earlier.sha256 if earlier is not None and earlier.bytes == size else None
        remote[path] = HostFile(path=path, host=host, bytes=size, sha256=sha)
    for path, earlier in before.items():
        if path not in remote:
            remote[path] = earlier  # on a host gone: still known, not here
    for host, why in sorted(nodes.gone.items()):
        lost = sorted(p for p, f in remote.items() if f.host == host and p not in here.files)
        if lost:
            shown = ", ".join(lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
            done.notes.append(
                f"host {host} could not be reached ({why}): {len(lost)} of its files not "
                f"collected: {shown}"
            )
    done.files = sorted(remote.values(), key=lambda f: f.path)
    return done


def _say_listing(host: str, listing: Listing, done: Collection) -> None:
    for path in listing.links:
        done.notes.append(f"host {host}: {path} is a link or not a regular file: not followed")
    if listing.truncated:
        done.notes.append(f"host {host}: more files below save_path than a listing looks at")


def _bring(
    root: str,
    nodes: Nodes,
    node: Node,
    entry: HostFile,
    earlier: HostFile | None,
    deadline: _Deadline,
    done: Collection,
) -> HostFile:
    """``entry`` of ``node`` in the driver's ``save_path``: fetched unless there already."""
    path = entry.path
    try:
        held = _local_size(root, path)
        if (
            held == entry.bytes
            and earlier is not None
            and earlier.host == node.host
            and earlier.sha256 is not None
        ):
            done.present += 1
            return entry.model_copy(update={"sha256": earlier.sha256})
        size, sha = nodes.call(node, "digest", path, limit_s=deadline.left(nodes.call_s))
        entry = entry.model_copy(update={"bytes": size})
        if held is not None:
            if held == size and digest_below(root, path)[1] == sha:
                done.present += 1
                return entry.model_copy(update={"sha256": sha})
            done.notes.append(
                f"host {node.host}: {path} is also on the driver with other content: "
                "the driver's is kept, this one not fetched"
            )
            return entry
        _fetch(root, nodes, node, path, size, sha, deadline)
    except Exception as exc:
        done.notes.append(f"host {node.host}: {path} not collected: {describe(exc)}")
        return entry
    done.fetched += 1
    done.fetched_bytes += size
    return entry.model_copy(update={"sha256": sha})


def _fetch(
    root: str, nodes: Nodes, node: Node, path: str, size: int, sha: str, deadline: _Deadline
) -> None:
    parts = PurePosixPath(path).parts
    folder = open_folder(root, parts[:-1], create=True)
    try:
        with replacing(folder, parts[-1]) as out:
            digest = hashlib.sha256()
            pending: collections.deque[Any] = collections.deque()
            asked = 0
            while asked < size or pending:
                while asked < size and len(pending) < IN_FLIGHT:
                    pending.append(node.agent.read.remote(path, asked, min(CHUNK, size - asked)))
                    asked += CHUNK
                piece: bytes = nodes.wait(pending.popleft(), deadline.left(nodes.call_s))
                if not piece:
                    raise OSError(f"it shrank below {size} bytes while it came over")
                digest.update(piece)
                out.write(piece)
            if digest.hexdigest() != sha:
                raise OSError("it changed while it came over (its checksum differs)")
    finally:
        os.close(folder)


def _local_size(root: str, path: str) -> int | None:
    """The size of the regular file ``path`` below ``root`` on the driver, ``None`` if none."""
    parts = PurePosixPath(path).parts
    try:
        folder = open_folder(root, parts[:-1], create=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return os.stat(parts[-1], dir_fd=folder, follow_symlinks=False).st_size
    except FileNotFoundError:
        return None
    finally:
        os.close(folder)


def collect(save_path: str | os.PathLike[str], *, limit_s: float = 600.0) -> Collection:
    """Bring every file other Ray nodes hold of the finished run at ``save_path`` (the
    driver's) into it, and list each file with its host and checksum in its
    ``manifest.json``; the notes say what could not be. Needs ``ray.init()`` on the cluster
    the run used. Raises ``ManifestError`` when ``save_path`` holds no run."""
    root = Path(save_path).resolve()
    manifest = load_manifest(root)
    nodes = Nodes(str(root), manifest.run_id, AGENT_S)
    try:
        done = gather(root, nodes, manifest.files, limit_s=limit_s)
    finally:
        nodes.close()
    _rewrite(root, done)
    return done


def _rewrite(root: Path, done: Collection) -> None:
    """The run's ``manifest.json`` with the files listed now and the collection's notes."""
    run = load_run_file(root)
    notes = [Note(step=None, target=None, level="problem", text=t) for t in done.notes]
    run = run.model_copy(update={"files": done.files, "notes": [*run.notes, *notes]})
    write_file(str(root), [], FILENAME, run.model_dump_json(by_alias=True, indent=1).encode())
