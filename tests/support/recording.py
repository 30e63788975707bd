"""The history of calls: every HTTP request to the ledger, recorded at invoke and at its end.

An httpx transport records each call as ok (2xx), fail (any other status, its problem code kept) or
unknown (no answer: reset, timeout, cancelled), so the checker can read the history afterwards.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx

PROBLEM_JSON = "application/problem+json"


@dataclass
class Call:
    """One HTTP call to the ledger: when it was invoked, how it ended, and what it answered."""

    method: str
    path: str
    operation_id: str | None
    kind: str  # claim, submit, heartbeat, complete, resolve, read, list, other
    started: float
    wall: float  # time.time() at invoke, to compare with the ledger's timestamps
    ended: float | None = None
    outcome: str = "invoked"  # ok | fail | unknown
    status: int | None = None
    code: str | None = None
    retry_after: str | None = None
    problem_json: bool = False
    replayed: bool = False
    body: Any = None
    error: str | None = None


def _classify(method: str, path: str) -> tuple[str | None, str]:
    parts = path.strip("/").split("/")
    if len(parts) >= 3 and parts[:2] == ["v1", "operations"]:
        return parts[2], parts[3] if len(parts) > 3 else "read"
    if parts[:2] == ["v1", "operations"]:
        return None, "list"
    return None, "other"


class History:
    """Every call, appended at invoke and completed at its end; the checker reads it afterwards."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def transport(self, inner: httpx.AsyncBaseTransport | None = None) -> RecordingTransport:
        """An httpx transport that records every request through it into this history."""
        return RecordingTransport(self, inner or httpx.AsyncHTTPTransport())

    def invoke(self, request: httpx.Request) -> Call:
        """Record the start of a call."""
        operation_id, kind = _classify(request.method, request.url.path)
        call = Call(request.method, request.url.path, operation_id, kind, time.monotonic(), time.time())
        self.calls.append(call)
        return call

    def answered(self, call: Call, response: httpx.Response) -> None:
        """Record an answer: ok for 2xx, fail for any other status (its problem code kept)."""
        call.ended = time.monotonic()
        call.status = response.status_code
        call.outcome = "ok" if response.is_success else "fail"
        call.retry_after = response.headers.get("retry-after")
        call.replayed = response.headers.get("idempotent-replayed") == "true"
        call.problem_json = response.headers.get("content-type", "").startswith(PROBLEM_JSON)
        try:
            call.body = response.json()
        except ValueError:
            call.body = None
        if not response.is_success and isinstance(call.body, dict):
            code = call.body.get("code")
            call.code = code if isinstance(code, str) else None

    def lost(self, call: Call, exc: BaseException) -> None:
        """Record a call whose answer never came: its effect on the ledger is unknown to the caller."""
        call.ended = time.monotonic()
        call.outcome = "unknown"
        call.error = type(exc).__name__

    def outcomes(self) -> Counter[str]:
        """Calls by outcome."""
        return Counter(c.outcome for c in self.calls)

    def statuses(self) -> Counter[int]:
        """Answered calls by status."""
        return Counter(c.status for c in self.calls if c.status is not None)


class RecordingTransport(httpx.AsyncBaseTransport):
    """Wraps a transport; the body is read here so the answer can be recorded before the client sees it."""

    def __init__(self, history: History, inner: httpx.AsyncBaseTransport) -> None:
        self.history = history
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        call = self.history.invoke(request)
        try:
            response = await self.inner.handle_async_request(request)
            await response.aread()
        except BaseException as exc:  # cancellation too: the caller never learns the outcome
            self.history.lost(call, exc)
            raise
        self.history.answered(call, response)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def check_answers(history: History, *, allowed_5xx: frozenset[int] = frozenset({503})) -> list[str]:
    """No 5xx but the allowed ones; every error answer is problem+json; every 503 says Retry-After."""
    found = []
    for c in history.calls:
        if c.status is None or c.status < 400:
            continue
        where = f"{c.method} {c.path} -> {c.status}"
        if c.status >= 500 and c.status not in allowed_5xx:
            found.append(f"server error: {where} {c.code}")
        if not c.problem_json or not isinstance(c.body, dict) or c.body.get("status") != c.status:
            found.append(f"not a problem+json answer: {where}")
        retry_after = c.retry_after or ""
        if c.status == 503 and (not retry_after.isdigit() or c.code != "unavailable"):
            found.append(f"503 without Retry-After or code unavailable: {where}")
    return found
