"""Typed calls of the run journal (API.md section 12): sessions, appends, reads, projection, context.

`client.journal` is a Journal over the client's connection, token and retry policy. Every append
carries a client_nonce, so a retried append whose answer was lost is answered (`replayed`), never
stored twice. A RevisionConflict is not retried: the caller re-reads and decides.
"""

from __future__ import annotations

import base64
import secrets
from datetime import datetime
from typing import Any
from urllib.parse import quote

from msgspec import Struct

from effect_ledger.client.transport import Transport

__all__ = [
    "AppendResult",
    "ContextSelection",
    "Journal",
    "JournalRecord",
    "Omitted",
    "Projection",
    "ProjectionCall",
    "ProjectionMessage",
    "SessionCreated",
    "SessionSnapshot",
    "continuation",
    "message",
    "summary",
    "tool_call",
    "tool_result",
]

JournalRecord = dict[str, Any]  # a record as sent: see message(), tool_call(), tool_result(), summary()


def message(role: str, content: str) -> JournalRecord:
    """A user or assistant message."""
    return {"type": "message", "role": role, "content": content}


def tool_call(call_id: str, name: str, arguments: Any, operation_id: str | None = None) -> JournalRecord:
    """A proposed call; `operation_id` names the ledger operation that would carry out its effect."""
    return {
        "type": "tool_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "operation_id": operation_id,
    }


def tool_result(call_id: str, name: str, output: Any, *, is_error: bool = False) -> JournalRecord:
    """The result of a pending call."""
    return {"type": "tool_result", "call_id": call_id, "name": name, "output": output, "is_error": is_error}


def summary(from_seq: int, to_seq: int, content: str, summarizer: str, omissions: list[str]) -> JournalRecord:
    """A derived (compaction) record covering seqs from_seq..to_seq."""
    return {
        "type": "summary",
        "covers": {"from_seq": from_seq, "to_seq": to_seq},
        "content": content,
        "summarizer": summarizer,
        "omissions": omissions,
    }


def continuation(
    *,
    provider: str,
    adapter: str,
    account: str,
    model_class: str,
    covers_to_seq: int,
    expires_at: datetime,
    payload: bytes,
    classification: str = "confidential",
    response_id: str | None = None,
) -> JournalRecord:
    """Opaque provider state continuing records 1..covers_to_seq; `payload` is sent base64 and comes
    back only from a compatible context() (docs/journal.md)."""
    return {
        "type": "continuation",
        "provider": provider,
        "adapter": adapter,
        "account": account,
        "model_class": model_class,
        "response_id": response_id,
        "covers_to_seq": covers_to_seq,
        "expires_at": expires_at.isoformat(),
        "classification": classification,
        "payload": base64.b64encode(payload).decode("ascii"),
    }


class SessionCreated(Struct, kw_only=True):
    """A new session: its ID, revision 0, record schema, creation time."""

    session_id: str
    revision: int
    schema: int
    created_at: datetime


class AppendResult(Struct, kw_only=True):
    """The session's revision after the append; `replayed` when the answer was a replay of a lost one."""

    session_id: str
    revision: int
    replayed: bool = False


class SessionSnapshot(Struct, kw_only=True):
    """A session and its records (each a dict with seq, at and the record's members)."""

    session_id: str
    revision: int
    schema: int
    labels: dict[str, str]
    created_at: datetime
    updated_at: datetime
    records: list[dict[str, Any]]

    def results(self) -> dict[str, Any]:
        """Each resolved call's output by call_id, as the journal restored it."""
        return {r["call_id"]: r["output"] for r in self.records if r["type"] == "tool_result"}


class ProjectionMessage(Struct, kw_only=True):
    """A message of the projection."""

    seq: int
    role: str
    content: str


class ProjectionCall(Struct, kw_only=True):
    """A call of the projection with what the ledger says now (`effect`) and what may happen (`resume`)."""

    call_id: str
    name: str
    seq: int
    operation_id: str | None
    state: str
    result_seq: int | None
    is_error: bool | None
    effect: dict[str, Any] | None
    resume: str


class Projection(Struct, kw_only=True):
    """GET /v1/sessions/{id}/projection."""

    session_id: str
    revision: int
    reducer: str
    digest: str
    messages: list[ProjectionMessage]
    calls: list[ProjectionCall]
    unresolved: list[str]


class Omitted(Struct, kw_only=True):
    """What a context selection left out."""

    records: int
    bytes: int
    continuations: list[dict[str, Any]] = []  # {"seq", "reason"} of each continuation not handed back


class ContextSelection(Struct, kw_only=True):
    """GET /v1/sessions/{id}/context."""

    revision: int
    records: list[dict[str, Any]]
    omitted: Omitted
    summarized: list[dict[str, int]]
    unresolved: list[str]
    continuation: dict[str, Any] | None = None  # the compatible one, with its payload (base64)


class Journal:
    """The journal calls of one LedgerClient."""

    def __init__(self, client: Transport) -> None:
        self.client = client

    @staticmethod
    def _path(session_id: str, tail: str = "") -> str:
        return f"/v1/sessions/{quote(session_id, safe='')}{tail}"

    async def create_session(self, labels: dict[str, str] | None = None) -> SessionCreated:
        """A new session owned by this client's tenant and principal."""
        body: dict[str, Any] = {} if labels is None else {"labels": labels}
        response = await self.client.request("POST", "/v1/sessions", body=body)
        return self.client.decode(response, SessionCreated)

    async def append(
        self,
        session_id: str,
        expected_revision: int,
        records: list[JournalRecord],
        *,
        client_nonce: str | None = None,
    ) -> AppendResult:
        """Append a batch at `expected_revision` (all or nothing); RevisionConflict when it moved on."""
        body = {
            "expected_revision": expected_revision,
            "records": records,
            "client_nonce": client_nonce or secrets.token_urlsafe(24),  # as new_client_nonce() does
        }
        response = await self.client.request("POST", self._path(session_id, "/records"), body=body)
        result = self.client.decode(response, AppendResult)
        result.replayed = response.headers.get("idempotent-replayed", "").lower() == "true"
        return result

    async def read(self, session_id: str, *, after_seq: int | None = None) -> SessionSnapshot:
        """The session and its records after `after_seq`, from one snapshot."""
        params = {} if after_seq is None else {"after_seq": after_seq}
        response = await self.client.request("GET", self._path(session_id), params=params)
        return self.client.decode(response, SessionSnapshot)

    async def projection(self, session_id: str) -> Projection:
        """The reducer's view with each call's ledger effect and resume; reading dispatches nothing."""
        response = await self.client.request("GET", self._path(session_id, "/projection"))
        return self.client.decode(response, Projection)

    async def context(
        self,
        session_id: str,
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
        provider: str | None = None,
        adapter: str | None = None,
        account: str | None = None,
        model_class: str | None = None,
    ) -> ContextSelection:
        """The records for a new model request under the bounds, with loss accounting; with the four
        continuation fields, the newest compatible continuation too (`continuation`)."""
        pairs = (
            ("max_records", max_records),
            ("max_bytes", max_bytes),
            ("provider", provider),
            ("adapter", adapter),
            ("account", account),
            ("model_class", model_class),
        )
        params: dict[str, str | int] = {k: v for k, v in pairs if v is not None}
        response = await self.client.request("GET", self._path(session_id, "/context"), params=params)
        return self.client.decode(response, ContextSelection)

    async def delete(self, session_id: str) -> None:
        """Delete the session with its records; the ledger's operations stay."""
        await self.client.request("DELETE", self._path(session_id))
