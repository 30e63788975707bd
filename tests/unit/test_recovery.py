"""The recovery decision of API section 10: every rule, every boundary, every invalid field."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from effect_ledger.domain.recovery import (
    MAX_SAFE_INTEGER,
    Decision,
    InvalidRecoveryInput,
    RecoveryInput,
    backoff_ceiling_ms,
    decide,
    retry_delay_ms,
)

# A transient failure with budget to spare: ceiling 100 ms on the first attempt, delay 50 ms.
BASE = RecoveryInput(
    attempts=1,
    maximum_attempts=3,
    minimum_attempt_ms=100,
    base_delay_ms=100,
    maximum_delay_ms=1000,
    now_ms=0,
    deadline_ms=10_000,
    retry_after_ms=None,
    jitter=0.5,
    cause="transient",
    output_visible=False,
    effects="none",
)


def given_input(**changes: Any) -> RecoveryInput:
    return dataclasses.replace(BASE, **changes)


def test_base_case_retries_after_half_the_first_window() -> None:
    assert decide(BASE) == Decision("retry", delay_ms=50)
    assert decide(BASE).to_json() == {"action": "retry", "delay_ms": 50}


@pytest.mark.parametrize(
    ("attempts", "expected_delay"),
    [(1, 50), (2, 100), (3, 200), (4, 400), (5, 500), (6, 500)],  # doubling until the 1000 ms cap
)
def test_exponential_window_capped_by_maximum_delay(attempts: int, expected_delay: int) -> None:
    assert decide(given_input(attempts=attempts, maximum_attempts=10)) == Decision(
        "retry", delay_ms=expected_delay
    )


def test_attempts_one_below_maximum_retries() -> None:
    assert decide(given_input(attempts=2, maximum_attempts=3)) == Decision("retry", delay_ms=100)


@pytest.mark.parametrize("attempts", [3, 4, MAX_SAFE_INTEGER])
def test_attempts_at_or_above_maximum_stop_for_budget(attempts: int) -> None:
    decision = decide(given_input(attempts=attempts, maximum_attempts=3))
    assert decision.to_json() == {"action": "stop", "reason": "budget"}


@pytest.mark.parametrize(
    ("attempts", "expected_ceiling"),
    [(30, 2**29), (31, 2**30), (32, 2**30), (1000, 2**30), (MAX_SAFE_INTEGER - 1, 2**30)],
)
def test_doubling_stops_at_two_to_the_thirtieth(attempts: int, expected_ceiling: int) -> None:
    inp = given_input(
        attempts=attempts,
        maximum_attempts=MAX_SAFE_INTEGER,
        base_delay_ms=1,
        maximum_delay_ms=MAX_SAFE_INTEGER,
        deadline_ms=MAX_SAFE_INTEGER,
    )
    assert backoff_ceiling_ms(inp) == expected_ceiling
    assert decide(inp) == Decision("retry", delay_ms=expected_ceiling // 2)


def test_huge_base_delay_is_capped_by_maximum_delay_exactly() -> None:
    inp = given_input(
        attempts=31, maximum_attempts=40, base_delay_ms=MAX_SAFE_INTEGER, maximum_delay_ms=MAX_SAFE_INTEGER
    )
    assert backoff_ceiling_ms(inp) == MAX_SAFE_INTEGER


def test_retry_after_longer_than_local_cap_wins() -> None:
    # The upstream asks for 600 ms; the local window tops out at 500 ms and must not shorten it.
    inp = given_input(attempts=4, maximum_attempts=5, maximum_delay_ms=500, jitter=0.999, retry_after_ms=600)
    assert backoff_ceiling_ms(inp) == 500
    assert decide(inp) == Decision("retry", delay_ms=600)


def test_jittered_delay_wins_over_a_shorter_retry_after() -> None:
    assert decide(given_input(retry_after_ms=20)) == Decision("retry", delay_ms=50)
    assert decide(given_input(retry_after_ms=0)) == Decision("retry", delay_ms=50)


@pytest.mark.parametrize(
    ("jitter", "expected"), [(0, 0), (0.0, 0), (0.999, 99), (math.nextafter(1.0, 0.0), 99)]
)
def test_jitter_is_floored(jitter: float, expected: int) -> None:
    assert retry_delay_ms(given_input(jitter=jitter)) == expected


def test_deadline_exactly_delay_plus_minimum_retries() -> None:
    inp = given_input(now_ms=1_000, deadline_ms=1_150)  # 150 = 50 delay + 100 minimum attempt
    assert decide(inp) == Decision("retry", delay_ms=50)


def test_deadline_one_short_of_delay_plus_minimum_stops() -> None:
    inp = given_input(now_ms=1_000, deadline_ms=1_149)
    assert decide(inp).to_json() == {"action": "stop", "reason": "budget"}


def test_retry_after_that_does_not_fit_the_deadline_stops() -> None:
    fits = given_input(retry_after_ms=900, deadline_ms=1_000)
    assert decide(fits) == Decision("retry", delay_ms=900)
    assert decide(given_input(retry_after_ms=901, deadline_ms=1_000)) == Decision("stop", reason="budget")


def test_deadline_already_passed_stops() -> None:
    assert decide(given_input(now_ms=5_000, deadline_ms=4_000)) == Decision("stop", reason="budget")


@pytest.mark.parametrize("cause", ["refused", "cancelled", "invalid", "Transient", "timeout"])
def test_non_transient_cause_stops(cause: str) -> None:
    assert decide(given_input(cause=cause)).to_json() == {"action": "stop", "reason": "cause"}


def test_visible_output_stops() -> None:
    assert decide(given_input(output_visible=True)).to_json() == {"action": "stop", "reason": "visible"}


def test_committed_effects_stop() -> None:
    assert decide(given_input(effects="committed")).to_json() == {"action": "stop", "reason": "effects"}


def test_unknown_effects_reconcile() -> None:
    assert decide(given_input(effects="unknown")).to_json() == {"action": "reconcile"}


@pytest.mark.parametrize(
    "changes",
    [
        {"cause": "refused"},
        {"output_visible": True},
        {"attempts": 3},
        {"deadline_ms": 0},
        {"cause": "cancelled", "output_visible": True, "attempts": 9, "deadline_ms": 0},
    ],
)
def test_unknown_effects_beat_every_stop(changes: dict[str, Any]) -> None:
    assert decide(given_input(effects="unknown", **changes)) == Decision("reconcile")


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"cause": "refused", "output_visible": True, "effects": "committed", "attempts": 3}, "cause"),
        ({"output_visible": True, "effects": "committed", "attempts": 3}, "visible"),
        ({"effects": "committed", "attempts": 3}, "effects"),
        ({"attempts": 3, "deadline_ms": 0}, "budget"),
    ],
)
def test_rules_apply_in_order(changes: dict[str, Any], reason: str) -> None:
    assert decide(given_input(**changes)).to_json() == {"action": "stop", "reason": reason}


def test_decision_json_shapes_are_exact() -> None:
    assert Decision("reconcile").to_json() == {"action": "reconcile"}
    assert Decision("stop", reason="effects").to_json() == {"action": "stop", "reason": "effects"}
    assert Decision("retry", delay_ms=0).to_json() == {"action": "retry", "delay_ms": 0}


INTEGER = "must be an integer"
AT_LEAST_ONE = "must be a safe integer >= 1"
AT_LEAST_ZERO = "must be a safe integer >= 0"
JITTER = "must be a finite number with 0 <= jitter < 1"


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        *[(name, 0, AT_LEAST_ONE) for name in ("attempts", "maximum_attempts", "minimum_attempt_ms")],
        *[(name, -1, AT_LEAST_ONE) for name in ("base_delay_ms", "maximum_delay_ms")],
        ("attempts", MAX_SAFE_INTEGER + 1, AT_LEAST_ONE),
        ("attempts", True, INTEGER),
        ("maximum_attempts", 3.0, INTEGER),
        ("base_delay_ms", "100", INTEGER),
        ("maximum_delay_ms", None, INTEGER),
        ("now_ms", -1, AT_LEAST_ZERO),
        ("now_ms", False, INTEGER),
        ("deadline_ms", MAX_SAFE_INTEGER + 1, AT_LEAST_ZERO),
        ("deadline_ms", 1.5, INTEGER),
        ("retry_after_ms", -1, AT_LEAST_ZERO),
        ("retry_after_ms", True, INTEGER),
        ("retry_after_ms", 2**53, AT_LEAST_ZERO),
        ("jitter", 1.0, JITTER),
        ("jitter", 1, JITTER),
        ("jitter", -0.01, JITTER),
        ("jitter", math.nan, JITTER),
        ("jitter", math.inf, JITTER),
        ("jitter", False, JITTER),
        ("jitter", "0.5", JITTER),
        ("cause", "", "must be a non-empty string"),
        ("cause", None, "must be a non-empty string"),
        ("output_visible", 0, "must be a boolean"),
        ("output_visible", "false", "must be a boolean"),
        ("effects", "maybe", "must be one of: none, committed, unknown"),
        ("effects", None, "must be one of: none, committed, unknown"),
    ],
)
def test_each_invalid_field_is_reported(field: str, value: object, problem: str) -> None:
    inp = given_input(**{field: value})
    assert inp.validate() == [(field, problem)]
    with pytest.raises(InvalidRecoveryInput) as caught:
        decide(inp)
    assert caught.value.problems == [(field, problem)]


@pytest.mark.parametrize(
    ("field", "value"),
    [("attempts", MAX_SAFE_INTEGER), ("now_ms", 0), ("retry_after_ms", 0), ("jitter", 0), ("jitter", 0.0)],
)
def test_boundary_values_are_valid(field: str, value: object) -> None:
    assert given_input(**{field: value}).validate() == []


def test_all_problems_are_reported_together_in_field_order() -> None:
    inp = given_input(attempts=0, deadline_ms=-5, jitter=2.0, effects="lost")
    assert inp.validate() == [
        ("attempts", AT_LEAST_ONE),
        ("deadline_ms", AT_LEAST_ZERO),
        ("jitter", JITTER),
        ("effects", "must be one of: none, committed, unknown"),
    ]


def test_every_field_is_validated() -> None:
    # A field added to RecoveryInput without a check would slip through; this catches it.
    broken: dict[str, Any] = {f.name: object() for f in dataclasses.fields(RecoveryInput)}
    reported = [name for name, _ in RecoveryInput(**broken).validate()]
    assert reported == [f.name for f in dataclasses.fields(RecoveryInput)]


def test_retry_after_defaults_to_none() -> None:
    fields = {f.name: getattr(BASE, f.name) for f in dataclasses.fields(RecoveryInput)}
    del fields["retry_after_ms"]
    assert RecoveryInput(**fields).retry_after_ms is None


safe = st.integers(min_value=0, max_value=MAX_SAFE_INTEGER)
small_positive = st.integers(min_value=1, max_value=10**7)
valid_inputs = st.builds(
    RecoveryInput,
    attempts=st.integers(min_value=1, max_value=64),
    maximum_attempts=st.integers(min_value=1, max_value=64),
    minimum_attempt_ms=small_positive,
    base_delay_ms=st.one_of(small_positive, st.integers(min_value=1, max_value=MAX_SAFE_INTEGER)),
    maximum_delay_ms=st.one_of(small_positive, st.integers(min_value=1, max_value=MAX_SAFE_INTEGER)),
    now_ms=st.integers(min_value=0, max_value=10**9),
    deadline_ms=st.one_of(st.integers(min_value=0, max_value=10**9), safe),
    retry_after_ms=st.none() | st.integers(min_value=0, max_value=10**8),
    jitter=st.floats(min_value=0, max_value=1, exclude_max=True),
    cause=st.sampled_from(["transient", "transient", "refused", "cancelled", "invalid"]),
    output_visible=st.booleans(),
    effects=st.sampled_from(["none", "none", "committed", "unknown"]),
)


@given(valid_inputs)
def test_decision_properties(inp: RecoveryInput) -> None:
    assert inp.validate() == []
    decision = decide(inp)
    assert (decision.action == "reconcile") == (inp.effects == "unknown")
    if decision.action == "retry":
        assert decision.delay_ms is not None
        ceiling = backoff_ceiling_ms(inp)
        assert decision.delay_ms <= max(ceiling, inp.retry_after_ms or 0)
        assert decision.delay_ms >= (inp.retry_after_ms or 0)
        assert decision.delay_ms + inp.minimum_attempt_ms <= inp.deadline_ms - inp.now_ms
        assert (inp.cause, inp.output_visible, inp.effects) == ("transient", False, "none")
        assert inp.attempts < inp.maximum_attempts
    if decision.action == "stop":
        assert decision.reason in {"cause", "visible", "effects", "budget"}
        assert decision.delay_ms is None
