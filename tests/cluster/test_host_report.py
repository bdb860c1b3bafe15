"""The hosts of a run over several nodes in its report: each one's offset, and a problem for
a clock known too loosely or one that drifted."""

from __future__ import annotations

from pathlib import Path

from aprof._manifest import HostClock
from aprof._report.hosts import host_lines, host_problems


def clock(host: str, offset: int, uncertainty: int, drift: int = 0) -> HostClock:
    return HostClock(
        host=host, offset_ns=offset, uncertainty_ns=uncertainty, measured_ns=1, drift_ns=drift
    )


def test_a_loose_or_drifting_clock_is_a_problem_and_a_tight_one_is_not() -> None:
    hosts = [
        clock("10.0.0.1", 0, 0),
        clock("10.0.0.2", 2_500_000_000, 300_000),
        clock("10.0.0.3", -1_700_000_000, 6_000_000),
        clock("10.0.0.4", 40_000, 100_000, drift=12_000_000),
    ]
    problems = host_problems(hosts)
    assert len(problems) == 2
    assert problems[0].startswith("host 10.0.0.3: its clock offset is known only to ±6.000 ms")
    assert problems[1].startswith("host 10.0.0.4: its clock offset moved by 12.000 ms")
    lines = host_lines(hosts)
    assert len(lines) == 5 and "+2500.000 ms" in lines[2] and "-1700.000 ms" in lines[3]


def test_a_run_on_one_host_shows_no_hosts() -> None:
    assert host_lines([clock("here", 0, 0)]) == [] and host_problems([clock("here", 0, 0)]) == []


def test_report_html_has_a_hosts_table_for_a_run_over_several_hosts(tmp_path: Path) -> None:
    from aprof._report.model import Distribution, RunReport
    from aprof._report.page import document

    hosts = (clock("10.0.0.1", 0, 0), clock("10.0.0.2", 2_500_000_000, 300_000, drift=40_000))
    report = RunReport("r", tmp_path, (), Distribution(), Distribution(), hosts=hosts)
    page = document(report, [])
    table = page[page.index('<div id="hosts">') :]
    assert "<td>10.0.0.2</td><td>+2500.000</td><td>0.300</td><td>0.040</td><td>1</td>" in table
    one_host = RunReport("r", tmp_path, (), Distribution(), Distribution(), hosts=hosts[:1])
    assert 'id="hosts"' not in document(one_host, [])
