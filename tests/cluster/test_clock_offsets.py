"""Clock offsets as NTP measures them: the probe with the shortest round trip of a burst
bounds a host's offset to half its round trip, whatever the delays on the way."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aprof.ray._clocks import HostClocks, Probe

delays = st.integers(min_value=0, max_value=50_000_000)


@given(
    offset=st.integers(min_value=-(10**12), max_value=10**12),
    paths=st.lists(st.tuples(delays, delays), min_size=1, max_size=16),
    sent=st.integers(min_value=10**18, max_value=2 * 10**18),
)
def test_the_best_probe_bounds_the_offset_to_half_its_round_trip(
    offset: int, paths: list[tuple[int, int]], sent: int
) -> None:
    """The host reads its clock (the driver's minus ``offset``) after the way there; the
    answer comes back after the way back: however uneven the two ways, the true offset lies
    within the recorded uncertainty."""
    clocks = HostClocks("driver")
    probes = []
    for there, back in paths:
        read = sent + there - offset
        probes.append(Probe(sent, read, sent + there + back))
    clocks.add("node", probes)
    (_, node) = clocks.records()
    assert abs(node.offset_ns - offset) <= node.uncertainty_ns
    assert node.uncertainty_ns == (min(t + b for t, b in paths) + 1) // 2


def test_the_driver_is_first_at_zero_and_never_measured() -> None:
    clocks = HostClocks("driver")
    clocks.add("driver", [Probe(0, 5, 10)])
    clocks.add("b", [Probe(100, 40, 110)])
    driver, b = clocks.records()
    assert (driver.host, driver.offset_ns, driver.uncertainty_ns) == ("driver", 0, 0)
    assert (b.host, b.offset_ns, b.uncertainty_ns) == ("b", 65, 5)


def test_a_later_burst_keeps_the_tighter_offset_and_counts_the_drift() -> None:
    clocks = HostClocks("driver")
    clocks.add("b", [Probe(0, -1000, 100)])  # offset 1050, ±50
    clocks.add("b", [Probe(1000, -8000, 1400)])  # offset 9200, ±200: looser, not kept
    (_, b) = clocks.records()
    assert (b.offset_ns, b.uncertainty_ns, b.measurements) == (1050, 50, 2)
    assert b.drift_ns == 9200 - 1050
    clocks.add("b", [Probe(5000, 3990, 5020)])  # offset 1020, ±10: tighter, kept
    (_, b) = clocks.records()
    assert (b.offset_ns, b.uncertainty_ns, b.measurements, b.measured_ns) == (1020, 10, 3, 5020)


def test_a_probe_the_driver_clock_stepped_back_on_is_not_taken() -> None:
    clocks = HostClocks("driver")
    clocks.add("b", [Probe(100, 0, 50)])
    assert [h.host for h in clocks.records()] == ["driver"]
