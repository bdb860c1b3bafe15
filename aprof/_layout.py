"""The output layout under ``save_path``: safe names, window folders, relative paths."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_DOTS = re.compile(r"\.{2,}")


def safe_name(name: str) -> str:
    """``name`` reduced to ``[A-Za-z0-9_.-]``, with no ``..`` and no leading dot."""
    cleaned = _DOTS.sub("_", _UNSAFE.sub("_", name)).lstrip(".")
    if not cleaned.strip("_"):
        raise ValueError(f"{name!r} has no path-safe characters")
    return cleaned[:120]


def size_of(path: Path) -> int | None:
    """Bytes of a file, or of every file under a folder; ``None`` if it is not there."""
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size
    except OSError:  # gone, or going while we look
        return None


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def check_name(name: str, what: str) -> str:
    """Return ``name`` if it is already path-safe, else raise ``ValueError`` saying why."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a non-empty string, got {name!r}")
    if safe_name(name) != name:
        raise ValueError(
            f"{what} {name!r} is not path-safe: use letters, digits, '_', '-' and '.', "
            f"no '..' and no leading dot (for example {safe_name(name)!r})"
        )
    return name


class OutputLayout:
    """Where every window of a run writes, all inside one root folder."""

    def __init__(self, save_path: Path) -> None:
        self.root = Path(os.path.abspath(save_path))

    def rollout_dir(self, step: int, replica: int) -> Path:
        """``step_<n>/rollout/replica_<r>/``."""
        return self._inside(f"step_{step}", "rollout", f"replica_{replica}")

    def role_dir(self, step: int, role: str, rank: int | None) -> Path:
        """``step_<n>/<role>/rank_<k>/``, or ``step_<n>/<role>/`` for a whole worker group."""
        parts = [f"step_{step}", safe_name(role)]
        if rank is not None:
            parts.append(f"rank_{rank}")
        return self._inside(*parts)

    def absolute(self, path: Path) -> Path:
        """``path`` made absolute, relative paths taken from the root."""
        return Path(os.path.abspath(self.root / path))

    def relative(self, path: Path) -> str:
        """``path`` relative to the root when it lies inside, else absolute (POSIX form)."""
        full = self.absolute(path)
        if full.is_relative_to(self.root):
            return full.relative_to(self.root).as_posix()
        return full.as_posix()

    def check_writable(self) -> None:
        """Create the root and prove a file can be written there; raise ``OSError`` if not."""
        self.root.mkdir(parents=True, exist_ok=True)
        probe = self.root / f".aprof-probe-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()

    def _inside(self, *parts: str) -> Path:
        path = Path(os.path.abspath(self.root.joinpath(*parts)))
        if not path.is_relative_to(self.root):
            raise ValueError(f"{path} would lie outside save_path {self.root}")
        return path
