"""``aprof npu-analyse DIR``: parse raw Ascend captures offline, off the training run.

Run torch_npu's offline analysis over DIR: a window folder, a step folder or a whole save_path
holding *_ascend_pt capture folders. Needs torch_npu.

example:
  aprof npu-analyse outputs/profile --workers 4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aprof.tools import ToolUnavailableError
from aprof.tools.npu import analyse

RAW_SUFFIX = "_ascend_pt"


def arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aprof npu-analyse``."""
    parser.add_argument("dir", metavar="DIR", type=Path, help="folder holding *_ascend_pt data")
    parser.add_argument(
        "--workers", type=int, default=None, help="parallel parser processes (torch_npu's default)"
    )


def run(args: argparse.Namespace) -> int:
    """Analyse every raw capture under DIR; 0, or 1 with one line naming what was wrong."""
    folder: Path = args.dir
    if args.workers is not None and args.workers < 1:
        return _fail("--workers must be >= 1")
    if not folder.is_dir():
        return _fail(f"{folder}: not a folder")
    raw = [p for p in folder.rglob(f"*{RAW_SUFFIX}") if p.is_dir()]
    if folder.name.endswith(RAW_SUFFIX):
        raw.append(folder)
    if not raw:
        return _fail(f"{folder}: no *{RAW_SUFFIX} capture folder inside")
    try:
        analyse(folder, max_process_number=args.workers)
    except ToolUnavailableError as exc:
        return _fail(str(exc))
    print(f"analysed {len(raw)} capture folder(s) under {folder}")
    return 0


def _fail(message: str) -> int:
    print(f"aprof npu-analyse: {message}", file=sys.stderr)
    return 1
