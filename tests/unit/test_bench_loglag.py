"""The bench's integration-lag arithmetic (effect_ledger_bench/loglag.lags) on hand-made samples."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from effect_ledger_bench.loglag import lags

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_each_receipt_lags_from_its_commit_to_the_first_sample_that_saw_it_logged() -> None:
    samples = [(at(0.0), 0), (at(0.1), 2), (at(0.2), 3), (at(0.5), 6)]  # (database clock, log size)
    commits = [(4, at(0.12)), (1, at(0.01)), (2, at(0.05)), (3, at(0.1)), (5, at(0.2)), (6, at(0.3))]
    got = lags(samples, commits)
    # in position order: 1 and 2 logged by 0.1, 3 by 0.2, 4-6 by 0.5
    assert [round(x, 3) for x in got] == [0.09, 0.05, 0.1, 0.38, 0.3, 0.2]


def test_a_receipt_never_logged_or_never_positioned_lags_forever() -> None:
    samples = [(at(0.0), 5), (at(1.0), 6)]
    got = lags(samples, [(7, at(0.5)), (None, at(0.9)), (6, at(0.5))])
    assert got[0] == 0.5  # position 6: logged by the sample at 1.0
    assert math.isinf(got[1])  # position 7: no sample saw it
    assert math.isinf(got[2])  # no feed position at all
    assert len(got) == 3
    assert lags([], []) == []
