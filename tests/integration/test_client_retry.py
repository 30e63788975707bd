"""The client's one retry loop on a scripted transport: Retry-After, the deadline, what is never retried."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from effect_ledger.client import (
    InternalError,
    LedgerClient,
    LedgerProblem,
    LedgerUnreachable,
    OperationInProgress,
    RateLimited,
    RetryPolicy,
    Unavailable,
)
from effect_ledger.client.errors import CLASSES, parse_retry_after

VIEW = {
    "operation_id": "op-1",
    "principal": "exec-1",
    "tool": "measure",
    "tool_version": "1",
    "intent_digest": "sha256:" + "0" * 64,
    "status": "pending",
    "attempt": 1,
    "lease_expires_at": "2026-11-30T10:00:30.000Z",
    "lease_expired": False,
    "effect_ref": None,
    "receipt": None,
    "not_applied_reason": None,
    "created_at": "2026-11-30T10:00:00.000Z",
    "updated_at": "2026-11-30T10:00:00.000Z",
    "submitted_at": None,
    "resolved_at": None,
    "resolved_by": None,
}


def problem(status: int, code: str, retry_after: str | None = None, **members: object) -> httpx.Response:
    headers = {"Content-Type": "application/problem+json"}
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    body = {
        "type": f"urn:effect-ledger:problem:{code}",
        "title": code,
        "status": status,
        "code": code,
        "detail": "scripted",
        **members,
    }
    return httpx.Response(status, json=body, headers=headers)


class Script:
    """A transport that answers from a list, recording when each request arrived."""

    def __init__(self, *answers: httpx.Response | Callable[[httpx.Request], httpx.Response]) -> None:
        self.answers = list(answers)
        self.times: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.times.append(time.monotonic())
        answer = self.answers[min(len(self.times), len(self.answers)) - 1]
        return answer(request) if callable(answer) else answer


def ledger(script: Script, **policy: float) -> LedgerClient:
    return LedgerClient(
        "http://ledger.test", "tok", transport=httpx.MockTransport(script), retry=RetryPolicy(**policy)
    )  # type: ignore[arg-type]


async def test_retry_after_is_honoured_then_the_answer_returned() -> None:
    script = Script(problem(503, "unavailable", "1", incident="inc_x"), httpx.Response(200, json=VIEW))
    async with ledger(script) as client:
        view = await client.get_operation("op-1")
    assert view.operation_id == "op-1" and view.status == "pending"
    assert len(script.times) == 2
    assert script.times[1] - script.times[0] >= 1.0  # the server asked for a second; jitter alone is < 100 ms


async def test_retry_after_as_an_http_date_is_honoured() -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=2), usegmt=True)
    script = Script(problem(429, "rate_limited", when), httpx.Response(200, json=VIEW))
    async with ledger(script) as client:
        await client.get_operation("op-1")
    # An HTTP-date has whole-second resolution, so the wait is between 1 and 2 seconds.
    assert 1.0 <= script.times[1] - script.times[0] <= 2.5


async def test_a_wait_that_does_not_fit_the_deadline_is_not_started() -> None:
    script = Script(problem(503, "unavailable", "5", incident="inc_x"))
    started = time.monotonic()
    async with ledger(script, deadline_seconds=2.0) as client:
        with pytest.raises(Unavailable) as failed:
            await client.get_operation("op-1")
    assert time.monotonic() - started < 0.5
    assert len(script.times) == 1 and failed.value.attempts == 1
    assert failed.value.retry_after == 5.0 and failed.value.incident == "inc_x"


async def test_one_deadline_bounds_the_whole_call() -> None:
    script = Script(problem(503, "unavailable", "0"))
    started = time.monotonic()
    async with ledger(
        script,
        deadline_seconds=1.0,
        maximum_attempts=1000,
        base_delay_ms=50,
        maximum_delay_ms=100,
        minimum_attempt_ms=50,
    ) as client:
        with pytest.raises(Unavailable) as failed:
            await client.get_operation("op-1")
    elapsed = time.monotonic() - started
    assert 0.5 < elapsed <= 1.0
    assert failed.value.attempts == len(script.times) > 5


async def test_attempts_are_bounded_with_the_first_one_counted() -> None:
    script = Script(problem(503, "unavailable", "0"))
    async with ledger(script, maximum_attempts=3, base_delay_ms=1) as client:
        with pytest.raises(Unavailable) as failed:
            await client.get_operation("op-1")
    assert len(script.times) == 3 and failed.value.attempts == 3


async def test_429_is_retried() -> None:
    script = Script(problem(429, "rate_limited", "0"), httpx.Response(200, json=VIEW))
    async with ledger(script, base_delay_ms=1) as client:
        await client.get_operation("op-1")
    assert len(script.times) == 2


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "malformed_request"),
        (401, "unauthenticated"),
        (404, "not_found"),
        (409, "operation_in_progress"),
        (422, "validation_failed"),
        (500, "internal"),
    ],
)
async def test_other_errors_are_never_retried(status: int, code: str) -> None:
    script = Script(problem(status, code, "0"), httpx.Response(200, json=VIEW))
    async with ledger(script, base_delay_ms=1) as client:
        with pytest.raises(LedgerProblem) as failed:
            await client.get_operation("op-1")
    assert len(script.times) == 1
    assert failed.value.code == code and failed.value.status == status
    assert type(failed.value) is CLASSES[code]


async def test_a_conflict_carries_the_operation_view() -> None:
    script = Script(problem(409, "operation_in_progress", "12", operation=VIEW))
    async with ledger(script) as client:
        with pytest.raises(OperationInProgress) as busy:
            await client.get_operation("op-1")
    assert busy.value.operation is not None and busy.value.operation.attempt == 1
    assert busy.value.retry_after == 12.0
    assert "wait" in str(busy.value)


async def test_transport_errors_are_retried_then_reported_as_unreachable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    script = Script(refuse)
    async with ledger(script, maximum_attempts=4, base_delay_ms=1) as client:
        with pytest.raises(LedgerUnreachable) as failed:
            await client.get_operation("op-1")
    assert len(script.times) == 4 and failed.value.attempts == 4
    assert isinstance(failed.value.__cause__, httpx.ConnectError)


async def test_a_proxy_page_is_mapped_by_status() -> None:
    script = Script(httpx.Response(502, text="<html>bad gateway</html>"), httpx.Response(500, text="oops"))
    async with ledger(script, base_delay_ms=1) as client:
        with pytest.raises(InternalError) as failed:
            await client.get_operation("op-1")
    assert len(script.times) == 2 and failed.value.status == 500


async def test_rate_limited_without_retry_after_backs_off_by_policy() -> None:
    script = Script(problem(429, "rate_limited"))
    async with ledger(script, maximum_attempts=2, base_delay_ms=1) as client:
        with pytest.raises(RateLimited) as failed:
            await client.get_operation("op-1")
    assert failed.value.retry_after is None and failed.value.attempts == 2


def test_retry_after_parsing() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-3") is None
    past = format_datetime(datetime.now(UTC) - timedelta(minutes=5), usegmt=True)
    assert parse_retry_after(past) == 0.0


def test_every_problem_code_has_its_own_class() -> None:
    from effect_ledger.domain.errors import PROBLEMS

    assert set(CLASSES) == set(PROBLEMS)
    assert len(set(CLASSES.values())) == len(CLASSES)
    assert all(issubclass(kind, LedgerProblem) and kind is not LedgerProblem for kind in CLASSES.values())
