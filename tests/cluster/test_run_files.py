"""A host's part of a run, as its agent answers for it: listed, hashed and read in pieces
below ``save_path``, no link followed and nothing outside it read."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from aprof._errors import UnsafePathError
from aprof.ray._run_files import digest_below, list_below, read_below


@pytest.fixture
def run(tmp_path: Path) -> Path:
    root = tmp_path / "profile"
    (root / "timeline").mkdir(parents=True)
    (root / "timeline" / "worker_1.trace.json.gz").write_bytes(b"x" * 1000)
    (root / "step_2" / "rollout" / "replica_0").mkdir(parents=True)
    (root / "step_2" / "rollout" / "replica_0" / "t.json").write_bytes(b"{}")
    (root / "timeline" / ".a.host.1.0123456789abcdef.aprof-tmp").write_bytes(b"half")
    return root


def test_a_listing_holds_every_file_with_its_size_and_no_temporary_file(run: Path) -> None:
    found = list_below(str(run))
    assert found.files == {
        "timeline/worker_1.trace.json.gz": 1000,
        "step_2/rollout/replica_0/t.json": 2,
    }
    assert not found.links and not found.truncated and not found.shared


def test_a_planted_link_is_named_and_not_followed(run: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("private")
    (run / "timeline" / "leak").symlink_to(secret / "key")
    (run / "step_2" / "elsewhere").symlink_to(secret)
    found = list_below(str(run))
    assert sorted(found.links) == ["step_2/elsewhere", "timeline/leak"]
    assert not any("key" in path for path in found.files)
    with pytest.raises(UnsafePathError):
        read_below(str(run), "timeline/leak", 0, 100)
    with pytest.raises(UnsafePathError):
        digest_below(str(run), "step_2/elsewhere/key")


@pytest.mark.parametrize("path", ["../secret", "/etc/passwd", "timeline/../../x", ""])
def test_a_path_that_leaves_save_path_is_refused(run: Path, path: str) -> None:
    with pytest.raises(ValueError, match="not a path below save_path"):
        read_below(str(run), path, 0, 10)


def test_a_file_is_read_in_pieces_and_hashed_whole(run: Path) -> None:
    path = "timeline/worker_1.trace.json.gz"
    pieces = [read_below(str(run), path, offset, 300) for offset in range(0, 1200, 300)]
    assert [len(p) for p in pieces] == [300, 300, 300, 100]
    assert digest_below(str(run), path) == (1000, hashlib.sha256(b"".join(pieces)).hexdigest())


def test_a_host_that_sees_the_drivers_manifest_of_the_run_is_shared(run: Path) -> None:
    (run / "manifest.json").write_text('{\n "schema": "aprof.manifest/2",\n "run_id": "r-1"\n}')
    assert list_below(str(run), "r-1").shared
    other = list_below(str(run), "r-2")
    assert not other.shared and "manifest.json" in other.files


def test_a_host_without_the_folder_holds_nothing(tmp_path: Path) -> None:
    found = list_below(str(tmp_path / "none"), "r-1")
    assert found.files == {} and not found.shared


def test_a_fifo_is_named_not_read(run: Path) -> None:
    os.mkfifo(run / "timeline" / "pipe")
    assert "timeline/pipe" in list_below(str(run)).links
