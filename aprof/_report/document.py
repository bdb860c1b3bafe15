"""``aprof report --json``: a run's accounting as one JSON object, for dashboards.

``{"run_id", "save_path", "summary": {...}, "steps": [...], "problems": [...], "notes": [...]}``:
``steps`` holds every step with a span (:meth:`aprof._accounting.StepAccount.as_json` gives
each one's names, and ``server`` the servers' own side of its requests where the run received
their spans: :mod:`aprof._report.server`), ``summary`` the run at a glance
(:func:`aprof._accounting.summary`).
"""

from __future__ import annotations

import json
from typing import Any

from aprof._accounting import summary
from aprof._report.build import Accounting
from aprof._report.model import RunReport


def document(report: Accounting | RunReport) -> dict[str, Any]:
    """The run's accounting as one object of JSON values."""
    return {
        "run_id": report.run_id,
        "save_path": str(report.save_path),
        "summary": summary(report.accounts),
        "steps": [
            {**account.as_json(), "server": report.server.get(account.step)}
            for account in report.accounts
        ],
        "hosts": [h.model_dump() for h in report.hosts],
        "problems": list(report.problems),
        "notes": list(report.notes),
    }


def dumps(report: Accounting | RunReport) -> str:
    """:func:`document` as JSON text (no NaN or infinity: every number is finite)."""
    return json.dumps(document(report), allow_nan=False)
