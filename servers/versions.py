"""Engine versions: the one parser of version text, and the one shape every comparison uses.

Every version in ``servers`` (what a server reports, what a user passes, each era boundary
such as vLLM's ``(0, 32, 0)``) is a :data:`Version`, so comparisons never mix lengths.
"""

from __future__ import annotations

import re

from servers._errors import VersionError

Version = tuple[int, int, int]
"""``(major, minor, patch)`` of an engine release; a missing patch is ``0``."""

_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> Version:
    """``"v0.16.0rc1"`` -> ``(0, 16, 0)``, ``"0.32.0+cpu"`` -> ``(0, 32, 0)``, ``"0.12"`` ->
    ``(0, 12, 0)``: release suffixes are ignored. Raises :class:`~servers.VersionError` (a
    ``ValueError``) naming ``text`` when it does not begin with ``X.Y``."""
    match = _VERSION.match(text.strip())
    if match is None:
        raise VersionError(f"not a version: {text!r} (expected X.Y or X.Y.Z, such as '0.32.0')")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def version_text(version: Version) -> str:
    """``(0, 32, 0)`` -> ``"0.32.0"``."""
    return ".".join(map(str, version))
