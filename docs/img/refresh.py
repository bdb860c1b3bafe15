"""Refresh the README's picture: ``report.html`` of a fresh ``aprof demo``, as headless Chromium
draws it, into ``docs/img/report.png``.

Runs ``aprof demo --steps 1,2 --num-steps 3`` into a temporary folder (about a minute), opens
its ``report.html`` from disk in the OS's Chromium (``apt-get install chromium``; Playwright
drives it, nothing is downloaded), waits until every plot is drawn and screenshots the top of
the page at 1280 x 900. Needs the test extra (``pip install -e ".[test]"``).

Run: python docs/img/refresh.py [--run DIR]  (--run: screenshot an existing demo run instead)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PICTURE = HERE / "report.png"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
ALL_DRAWN = """() => {
    const plots = [...document.querySelectorAll('.js-plotly-plot')];
    return plots.length > 0 && plots.every(p => p.querySelector('.main-svg') && p._fullLayout);
}"""
"""True once plotly has drawn every plot of the page."""


def demo(out: Path) -> Path:
    """A fresh demo run in ``out``; its report.html."""
    command = [sys.executable, "-m", "aprof", "demo", "--steps", "1,2", "--num-steps", "3"]
    subprocess.run([*command, "--out", str(out)], check=True, timeout=900)
    return out / "report.html"


def screenshot(report: Path, picture: Path) -> None:
    """``report`` as Chromium draws it, its top 1280 x 900, into ``picture``."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("no Chromium: apt-get install chromium")
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=chromium,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            page = context.new_page()
            page.goto(report.as_uri(), wait_until="load", timeout=30_000)
            page.wait_for_function(ALL_DRAWN, timeout=30_000)
            page.screenshot(path=str(picture))
        finally:
            context.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="an existing demo run to screenshot")
    parser.add_argument(
        "--to", type=Path, default=PICTURE, help="the picture (docs/img/report.png)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        report = args.run / "report.html" if args.run else demo(Path(scratch) / "demo")
        screenshot(report, args.to)
    print(f"wrote {args.to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
