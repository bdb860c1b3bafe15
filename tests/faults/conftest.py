"""The fault suite's tally: what was injected, what was checked, and what was lost.

Each test counts what it injects and checks through the ``faults`` fixture; the session's
totals are printed as a table at the end of the run. A check that fails counts as lost (in
its category) and fails the test, so the table's "lost" row reads 0 when every test passes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from faults.tally import INJECTED, LOST, Faults, Tally

_TALLY = pytest.StashKey[Tally]()
_CALL = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Iterator[None]:
    """Keep each test's call report, for the ``faults`` fixture's teardown."""
    report = yield
    if report.when == "call":
        item.stash[_CALL] = report
    return report


@pytest.fixture
def faults(request: pytest.FixtureRequest) -> Iterator[Faults]:
    """This test's tally; losses a passing test did not assert fail it at teardown."""
    tally = request.config.stash.setdefault(_TALLY, Tally())
    view = Faults(tally)
    yield view
    call = request.node.stash.get(_CALL, None)
    if not view.asserted and (call is None or call.passed):
        view.assert_nothing_lost()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The table of the fault suite, when any of it ran."""
    tally = terminalreporter.config.stash.get(_TALLY, None)
    if tally is None:
        return
    lost = sum(tally.lost.values())
    rows = [(label, str(tally.counts[kind])) for kind, label in INJECTED.items()]
    rows.append((f"lost ({', '.join(LOST.values())})", str(lost)))
    write = terminalreporter.write_line
    terminalreporter.section("fault suite")
    width = max(len(label) for label, _ in rows)
    write(f"| {'what':<{width}} | count |")
    write(f"|{'-' * (width + 2)}|------:|")
    for label, value in rows:
        write(f"| {label:<{width}} | {value:>5} |")
    checks = ", ".join(f"{LOST[k]} {tally.checks[k]}" for k in LOST)
    write(f"checks made: {checks}")
    if lost:
        write("lost by category: " + ", ".join(f"{LOST[k]} {n}" for k, n in tally.lost.items()))
