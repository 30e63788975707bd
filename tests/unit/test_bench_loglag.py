"""The bench's integration-lag arithmetic (effect_ledger_bench/loglag.lags) on hand-made samples."""

from __future__ import annotations

import math

from effect_ledger_bench.loglag import lags


def test_each_receipt_lags_from_its_commit_sample_to_its_logged_sample() -> None:
    # (t, committed, logged): receipts 3..6 are committed after the first sample
    samples = [(0.0, 2, 0), (0.1, 4, 2), (0.2, 6, 3), (0.5, 6, 6)]
    # k=3,4 committed at 0.1; logged at 0.2 (k=3) and 0.5 (k=4); k=5,6 committed at 0.2, logged at 0.5
    got = lags(samples, 6)
    assert [round(x, 3) for x in got] == [0.1, 0.4, 0.3, 0.3]


def test_a_receipt_never_logged_lags_forever_and_nothing_before_the_first_sample_counts() -> None:
    samples = [(0.0, 5, 5), (1.0, 7, 6)]
    got = lags(samples, 7)
    assert got[0] == 0.0  # k=6: committed and logged by the sample at 1.0
    assert math.isinf(got[1])  # k=7: never logged
    assert len(got) == 2  # k<=5 were committed before sampling began
    assert lags([], 3) == []
