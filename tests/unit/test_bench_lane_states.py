"""repeat --lanes: a lane's state by its wait event, one sample's lanes as one label, and the line."""

from __future__ import annotations

from collections import Counter

from effect_ledger_bench.lanes import IDLE, combination, label, lane_state, summary


def test_each_wait_event_names_a_state() -> None:
    assert lane_state(None, None) == "CPU"
    assert lane_state("IO", "WalSync") == "WAL flush"
    assert lane_state("LWLock", "WALWrite") == "WAL write lock"
    assert lane_state("IO", "WalWrite") == "WAL write"
    assert lane_state("Lock", "tuple") == "lock (tuple)"
    assert lane_state("Timeout", "PgSleep") == "Timeout: PgSleep"


def test_a_sample_is_its_lanes_sorted_or_none_in_flight() -> None:
    assert label(combination([])) == IDLE
    assert combination(["WAL flush", "CPU"]) == combination(["CPU", "WAL flush"]) == ("CPU", "WAL flush")
    assert label(combination(["WAL flush", "CPU"])) == "CPU + WAL flush"


def test_the_line_gives_the_commonest_combinations_and_the_lanes_in_flight_on_average() -> None:
    counts = Counter({(): 25, ("CPU",): 50, ("CPU", "WAL flush"): 25})
    # in flight: 0 x 25 + 1 x 50 + 2 x 25 = 100 over 100 samples
    assert (
        summary(counts, top=2)
        == "lanes (100 samples, 1.00 in flight on average): CPU 50%, none in flight 25%"
    )
    assert summary(Counter()) == "lanes: no samples"
