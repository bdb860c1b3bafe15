"""The README's picture: ``docs/img/refresh.py`` screenshots a demo run's ``report.html`` in
headless Chromium, and the README shows the committed one."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "img" / "refresh.py"


def test_the_readme_shows_the_committed_picture() -> None:
    assert "](docs/img/report.png)" in (ROOT / "README.md").read_text()
    assert (ROOT / "docs" / "img" / "report.png").stat().st_size > 10_000


def test_the_script_screenshots_a_demo_runs_report(demo_run: Path, tmp_path: Path) -> None:
    if shutil.which("chromium") is None:
        pytest.skip("no Chromium: install the OS package (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api")
    image = pytest.importorskip("PIL.Image")
    spec = importlib.util.spec_from_file_location("refresh", SCRIPT)
    assert spec is not None and spec.loader is not None
    refresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(refresh)
    picture = tmp_path / "report.png"
    refresh.screenshot(demo_run / "report.html", picture)
    with image.open(picture) as shot:
        assert shot.size == (1280, 900)
        colours = shot.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 50  # drawn plots, not a blank page
