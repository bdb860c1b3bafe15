"""The one version parser of ``servers``: release suffixes, short versions, clear refusals."""

from __future__ import annotations

import pytest

from servers.versions import parse_version, version_text


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("v0.16.0rc1", (0, 16, 0)),
        ("0.32.0+cpu", (0, 32, 0)),
        ("0.12", (0, 12, 0)),
        (" 0.5.10.post1\n", (0, 5, 10)),
        ("0.10.2", (0, 10, 2)),
    ],
)
def test_parse_version_reads_release_suffixes(text: str, version: tuple[int, int, int]) -> None:
    assert parse_version(text) == version


@pytest.mark.parametrize("text", ["latest", "x.y", "", "0", "release 0.32.0"])
def test_unparseable_version_is_one_error_naming_the_text(text: str) -> None:
    with pytest.raises(ValueError, match=rf"^not a version: {text!r} \(expected X\.Y or X\.Y\.Z"):
        parse_version(text)


def test_versions_compare_by_release_whatever_their_length() -> None:
    assert parse_version("0.12") == parse_version("0.12.0") < parse_version("0.12.1")
    assert parse_version("0.9.9") < parse_version("0.10") < (0, 32, 0)
    assert version_text(parse_version("v0.13rc1")) == "0.13.0"
