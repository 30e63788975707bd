"""Helpers for the journal tests: callers, sessions, appends, and the seed's records."""

from __future__ import annotations

from typing import Any

import httpx

from effect_ledger.client.journal import message, tool_call, tool_result
from effect_ledger.client.journal import summary as summary_record
from support.auth import auth

WRITER = {"tenant": "t1", "sub": "orch-1", "scope": "journal:write journal:read"}
OTHER_PRINCIPAL = {"tenant": "t1", "sub": "orch-2", "scope": "journal:write journal:read"}
OTHER_TENANT = {"tenant": "t2", "sub": "orch-1", "scope": "journal:write journal:read"}
AUDITOR = {"tenant": "t1", "sub": "aud-1", "scope": "ledger:audit"}


def who(caller: dict[str, str]) -> dict[str, str]:
    """Authorization headers for one of the callers above."""
    return auth(caller["tenant"], caller["sub"], caller["scope"])


def user(content: str = "compare prototypes A and B") -> dict[str, Any]:
    return message("user", content)


def assistant(content: str) -> dict[str, Any]:
    return message("assistant", content)


def call(
    call_id: str, name: str = "measure", operation_id: str | None = None, **arguments: Any
) -> dict[str, Any]:
    return tool_call(call_id, name, arguments, operation_id)


def result(call_id: str, name: str = "measure", output: Any = None, is_error: bool = False) -> dict[str, Any]:
    return tool_result(call_id, name, {"value": 1} if output is None else output, is_error=is_error)


def summary(first: int, last: int, content: str = "earlier turns") -> dict[str, Any]:
    return summary_record(first, last, content, "test-summarizer/1", [])


async def new_session(client: httpx.AsyncClient, caller: dict[str, str] = WRITER, **body: Any) -> str:
    """A new session of `caller`; returns its ID."""
    r = await client.post("/v1/sessions", json=body, headers=who(caller))
    assert r.status_code == 201, r.text
    return str(r.json()["session_id"])


async def append(
    client: httpx.AsyncClient,
    session_id: str,
    revision: int,
    records: list[dict[str, Any]],
    caller: dict[str, str] = WRITER,
    **extra: Any,
) -> httpx.Response:
    """POST a batch at an expected revision."""
    body = {"expected_revision": revision, "records": records, **extra}
    return await client.post(f"/v1/sessions/{session_id}/records", json=body, headers=who(caller))


async def read(
    client: httpx.AsyncClient, session_id: str, caller: dict[str, str] = WRITER, path: str = "", **params: Any
) -> httpx.Response:
    """GET the session (or one of its views: path "/projection", "/context")."""
    return await client.get(f"/v1/sessions/{session_id}{path}", params=params, headers=who(caller))
