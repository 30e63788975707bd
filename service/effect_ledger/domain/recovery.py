"""The recovery decision for a failed attempt (API section 10): reconcile, stop, or retry."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "MAX_SAFE_INTEGER",
    "Decision",
    "InvalidRecoveryInput",
    "RecoveryInput",
    "backoff_ceiling_ms",
    "decide",
    "retry_delay_ms",
]

# JavaScript's Number.MAX_SAFE_INTEGER: the contract is written for JSON clients, and larger
# integers do not survive a round trip through a double in most of them.
MAX_SAFE_INTEGER = 2**53 - 1

# The exponent cap keeps base_delay * 2**n bounded however many attempts a caller reports.
_MAX_DOUBLINGS = 30

Effects = Literal["none", "committed", "unknown"]
Action = Literal["reconcile", "stop", "retry"]
StopReason = Literal["cause", "visible", "effects", "budget"]

_EFFECTS: tuple[str, ...] = ("none", "committed", "unknown")
_AT_LEAST_ONE = ("attempts", "maximum_attempts", "minimum_attempt_ms", "base_delay_ms", "maximum_delay_ms")
_AT_LEAST_ZERO = ("now_ms", "deadline_ms")


@dataclass(frozen=True, kw_only=True, slots=True)
class RecoveryInput:
    """What is known about a failed attempt and the budget left for the operation."""

    attempts: int
    maximum_attempts: int
    minimum_attempt_ms: int
    base_delay_ms: int
    maximum_delay_ms: int
    now_ms: int
    deadline_ms: int
    retry_after_ms: int | None = None
    jitter: float
    cause: str
    output_visible: bool
    effects: Effects

    def validate(self) -> list[tuple[str, str]]:
        """Return (field, problem) pairs for every invalid field; empty when the input is valid."""
        problems: list[tuple[str, str]] = []
        for name in _AT_LEAST_ONE:
            problem = _safe_integer_problem(getattr(self, name), minimum=1)
            if problem:
                problems.append((name, problem))
        for name in _AT_LEAST_ZERO:
            problem = _safe_integer_problem(getattr(self, name), minimum=0)
            if problem:
                problems.append((name, problem))
        if self.retry_after_ms is not None:
            problem = _safe_integer_problem(self.retry_after_ms, minimum=0)
            if problem:
                problems.append(("retry_after_ms", problem))
        if not _is_jitter_sample(self.jitter):
            problems.append(("jitter", "must be a finite number with 0 <= jitter < 1"))
        if not isinstance(self.cause, str) or not self.cause:
            problems.append(("cause", "must be a non-empty string"))
        if not isinstance(self.output_visible, bool):
            problems.append(("output_visible", "must be a boolean"))
        if not isinstance(self.effects, str) or self.effects not in _EFFECTS:
            problems.append(("effects", "must be one of: none, committed, unknown"))
        return problems


class InvalidRecoveryInput(ValueError):
    """decide() was given an input that validate() rejects."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("invalid recovery input: " + ", ".join(name for name, _ in problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class Decision:
    """The next action; reason is set only for stop, delay_ms only for retry."""

    action: Action
    reason: StopReason | None = None
    delay_ms: int | None = None

    def to_json(self) -> dict[str, str | int]:
        """Return the response body of POST /v1/recovery/decide."""
        if self.action == "stop":
            assert self.reason is not None  # guaranteed by the constructors below
            return {"action": "stop", "reason": self.reason}
        if self.action == "retry":
            assert self.delay_ms is not None
            return {"action": "retry", "delay_ms": self.delay_ms}
        return {"action": "reconcile"}


RECONCILE = Decision("reconcile")


def _stop(reason: StopReason) -> Decision:
    return Decision("stop", reason=reason)


def decide(inp: RecoveryInput) -> Decision:
    """Return the next action for a failed attempt, applying the API section 10 rules in order."""
    problems = inp.validate()
    if problems:
        raise InvalidRecoveryInput(problems)
    # Unknown effects come first: the outcome must be determined before anything else is
    # decided, and reconciling never repeats the effect, so it is safe whatever the cause.
    if inp.effects == "unknown":
        return RECONCILE
    if inp.cause != "transient":
        return _stop("cause")
    # Output the caller has already seen cannot be silently produced a second time.
    if inp.output_visible:
        return _stop("visible")
    if inp.effects == "committed":
        return _stop("effects")
    if inp.attempts >= inp.maximum_attempts:
        return _stop("budget")
    delay_ms = retry_delay_ms(inp)
    # Python ints are exact, so this comparison cannot be skewed by rounding near 2**53.
    if inp.deadline_ms - inp.now_ms < delay_ms + inp.minimum_attempt_ms:
        return _stop("budget")
    return Decision("retry", delay_ms=delay_ms)


def backoff_ceiling_ms(inp: RecoveryInput) -> int:
    """Return min(maximum_delay_ms, base_delay_ms * 2**min(attempts - 1, 30))."""
    return min(inp.maximum_delay_ms, inp.base_delay_ms << min(inp.attempts - 1, _MAX_DOUBLINGS))


def retry_delay_ms(inp: RecoveryInput) -> int:
    """Return the full-jitter delay, raised to the upstream retry-after when that is longer."""
    # The local cap must not shorten an upstream minimum wait; the deadline decides whether
    # that longer wait still fits. The ceiling is below 2**53, so jitter * ceiling is the same
    # double product a JavaScript client computes.
    jittered = math.floor(inp.jitter * backoff_ceiling_ms(inp))
    return max(jittered, inp.retry_after_ms or 0)


def _safe_integer_problem(value: object, *, minimum: int) -> str | None:
    # bool is a subclass of int in Python, but true is not a number in JSON.
    if isinstance(value, bool) or not isinstance(value, int):
        return "must be an integer"
    if not minimum <= value <= MAX_SAFE_INTEGER:
        return f"must be a safe integer >= {minimum}"
    return None


def _is_jitter_sample(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and 0 <= value < 1
