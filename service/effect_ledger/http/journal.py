"""The run journal of API.md section 12: owned sessions, expected revisions, replay without dispatch.

No handler here claims, submits or executes anything: the projection only reads the ledger.
"""

from __future__ import annotations

import re
import secrets
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.params import FromPath, FromQuery, JSONBody
from msgspec import Meta, Struct

from effect_ledger.db import journal as repo
from effect_ledger.db.ledger import Ledger
from effect_ledger.domain.errors import LedgerError, not_found, unsupported_schema
from effect_ledger.domain.journal_context import select_context
from effect_ledger.domain.journal_history import AppendCommand, Caps, Replayed
from effect_ledger.domain.journal_projection import REDUCER, projection_view
from effect_ledger.domain.journal_records import (
    NEWEST_SCHEMA,
    AppendBody,
    future_schema_indexes,
    payloads_digest,
    stored_form,
)
from effect_ledger.domain.timefmt import format_ts
from effect_ledger.domain.tokens import nonce_hash
from effect_ledger.http.auth import AUDIT, JOURNAL_READ, JOURNAL_WRITE, Caller, requires
from effect_ledger.http.context import caller_of, ledger_of
from effect_ledger.http.journal_continuations import (
    CONTEXT_PARAMS,
    Continuations,
    key_ring_of,
    take_payloads,
    wanted_from,
)
from effect_ledger.http.journal_telemetry import JournalMetrics
from effect_ledger.http.paging import QueryProblems
from effect_ledger.http.schemas import StrictBody, strict, strict_convert

SESSION_ID = re.compile(r"^ses_[A-Za-z0-9_-]{22,64}\Z")
SESSION_PATH = "/{session_id:str}"
LabelKey = Annotated[str, Meta(min_length=1, max_length=100)]
LabelValue = Annotated[str, Meta(max_length=256)]


class CreateSessionBody(Struct, forbid_unknown_fields=True):
    """POST /v1/sessions: `{}` or `{"labels": {str: str}}`, at most 16 labels."""

    labels: Annotated[dict[LabelKey, LabelValue], Meta(max_length=16)] = {}


def _session_id(raw: str) -> str:
    """A well-formed session ID, or the same 404 as a missing session."""
    if not SESSION_ID.match(raw):
        raise not_found(repo.SESSION)
    return raw


def _reader(caller: Caller) -> str | None:
    """Whose sessions the caller may read: its own, or (ledger:audit) any of its tenant (None)."""
    return None if AUDIT in caller.scopes else caller.principal


async def session_projection(
    request: Request[Any, Any, Any], caller: Caller, session_id: str, ledger: Ledger | None = None
) -> dict[str, Any]:
    """The projection answer of one session the caller may read (the API's and the console's; the
    console passes the audit pool's ledger)."""
    sid = _session_id(session_id)
    reading = ledger_of(request) if ledger is None else ledger
    snap, operations = await repo.read_with_effects(reading, caller.tenant, sid, _reader(caller))
    return projection_view(sid, snap.revision, [(seq, r) for seq, _, r in snap.records], operations)


def _metrics(request: Request[Any, Any, Any]) -> JournalMetrics:
    metrics: JournalMetrics = request.app.state.journal_metrics
    return metrics


def _caps(request: Request[Any, Any, Any]) -> Caps:
    settings = request.app.state.settings
    return Caps(settings.journal_max_records, settings.journal_max_record_bytes)


def record_view(seq: int, at: Any, record: dict[str, Any]) -> dict[str, Any]:
    """A stored record as the API shows it: seq and acceptance time, then the record's members."""
    # jsonb keeps keys in its own order; the view leads with the record's type again
    return {"seq": seq, "at": format_ts(at), "type": record["type"], **record}


def _decode_append(raw: bytes) -> AppendBody:
    """Future schema versions are refused before anything else is interpreted; then a strict decode."""
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        raise LedgerError("malformed_request", "The body is not valid JSON.") from None
    if not isinstance(value, dict):
        raise LedgerError("malformed_request", "The body must be a JSON object.")
    newer = future_schema_indexes(value.get("records"))
    if newer:
        raise unsupported_schema(newer, NEWEST_SCHEMA)
    return strict_convert(value, AppendBody)


class AppendDTO(StrictBody[AppendBody]):
    """The append body, decoded once: future schema versions are refused first (never interpreted),
    then the whole batch is decoded strictly into AppendBody. A refusal is handed to the handler as a
    value, so that it is counted and logged as an append outcome like every other."""

    def decode_bytes(self, value: bytes) -> Any:
        """AppendBody, or the LedgerError that refuses the body (see _decode_append)."""
        try:
            return _decode_append(value)
        except LedgerError as refusal:
            return refusal


def _optional_int(q: QueryProblems, name: str, value: str | None, minimum: int) -> int | None:
    if value is None or value == "":
        return None
    if not value.isdigit() or int(value) < minimum or int(value) > 2**31 - 1:
        q.errors.append((name, f"must be an integer from {minimum} to 2147483647"))
        return None
    return int(value)


class JournalController(Controller):
    """Create sessions, append records at an expected revision, read, project, select context, delete."""

    path = "/v1/sessions"
    tags = ("journal",)

    @post("/", guards=[requires(JOURNAL_WRITE)], status_code=201, **strict(CreateSessionBody))
    async def create(
        self, request: Request[Any, Any, Any], data: JSONBody[CreateSessionBody]
    ) -> Response[Any]:
        """A new session owned by the caller (tenant and principal), at revision 0."""
        body = data
        caller = caller_of(request)
        session_id = "ses_" + secrets.token_urlsafe(18)  # 144 random bits, chosen by the service
        async with _metrics(request).observe("create", session_id=session_id, revision=0):
            row = await repo.create_session(
                ledger_of(request), caller.tenant, caller.principal, session_id, body.labels
            )
        answer = {
            "session_id": row["session_id"],
            "revision": row["revision"],
            "schema": row["schema"],
            "created_at": format_ts(row["created_at"]),
        }
        return Response(answer, status_code=201, headers={"Location": f"/v1/sessions/{session_id}"})

    @post(
        SESSION_PATH + "/records",
        guards=[requires(JOURNAL_WRITE)],
        status_code=200,
        dto=AppendDTO,
        return_dto=None,
    )
    async def append(
        self,
        request: Request[Any, Any, Any],
        session_id: FromPath[str],
        data: JSONBody[AppendBody | LedgerError],
    ) -> Response[Any]:
        """Append a batch at expected_revision: all or nothing, in one transaction."""
        async with _metrics(request).observe("append") as line:
            line["session_id"] = sid = _session_id(session_id)
            if isinstance(data, LedgerError):
                raise data
            body = data
            caller = caller_of(request)
            records = [stored_form(r) for r in body.records]
            payloads = take_payloads(records, key_ring_of(request))  # before anything else sees them
            cmd = AppendCommand(
                body.expected_revision,
                records,
                None if body.client_nonce is None else nonce_hash(body.client_nonce),
                None if payloads is None else payloads_digest(payloads.by_index),
            )
            line.update(expected_revision=body.expected_revision, records=len(records))
            decision = await repo.append(
                ledger_of(request), caller.tenant, caller.principal, sid, cmd, _caps(request), payloads
            )
            if isinstance(decision, LedgerError):
                raise decision
            line["revision"] = decision.revision
            if isinstance(decision, Replayed):
                line["outcome"] = "replayed"
                return Response(
                    {"session_id": sid, "revision": decision.revision},
                    headers={"Idempotent-Replayed": "true"},
                )
            if decision.summaries:
                _metrics(request).summaries.inc(decision.summaries)
        return Response({"session_id": sid, "revision": decision.revision})

    @get(SESSION_PATH, guards=[requires(JOURNAL_READ, AUDIT)])
    async def read(
        self,
        request: Request[Any, Any, Any],
        session_id: FromPath[str],
        after_seq: FromQuery[str | None] = None,
    ) -> Response[Any]:
        """The session and its records after `after_seq`, from one consistent snapshot."""
        async with _metrics(request).observe("load") as line:
            line["session_id"] = sid = _session_id(session_id)
            q = QueryProblems(request, ("after_seq",))
            after = _optional_int(q, "after_seq", after_seq, 0)
            q.check()
            snap = await repo.read_session(
                ledger_of(request), caller_of(request).tenant, sid, _reader(caller_of(request)), after or 0
            )
            line.update(revision=snap.revision, records=len(snap.records))
        return Response(
            {
                "session_id": snap.session_id,
                "revision": snap.revision,
                "schema": snap.schema,
                "labels": snap.labels,
                "created_at": format_ts(snap.created_at),
                "updated_at": format_ts(snap.updated_at),
                "records": [record_view(seq, at, record) for seq, at, record in snap.records],
            }
        )

    @get(SESSION_PATH + "/projection", guards=[requires(JOURNAL_READ, AUDIT)])
    async def projection(self, request: Request[Any, Any, Any], session_id: FromPath[str]) -> Response[Any]:
        """The reducer's view, each call joined with what the ledger says now; nothing is dispatched."""
        metrics = _metrics(request)
        async with metrics.observe("projection", reducer=REDUCER) as line:
            line["session_id"] = sid = _session_id(session_id)
            answer = await session_projection(request, caller_of(request), sid)
            metrics.unresolved.inc(len(answer["unresolved"]))
            line.update(
                revision=answer["revision"], unresolved=len(answer["unresolved"]), digest=answer["digest"]
            )
        return Response(answer)

    @get(SESSION_PATH + "/context", guards=[requires(JOURNAL_READ, AUDIT)])
    async def context(
        self,
        request: Request[Any, Any, Any],
        session_id: FromPath[str],
        max_records: FromQuery[str | None] = None,
        max_bytes: FromQuery[str | None] = None,
        provider: FromQuery[str | None] = None,
        adapter: FromQuery[str | None] = None,
        account: FromQuery[str | None] = None,
        model_class: FromQuery[str | None] = None,
    ) -> Response[Any]:
        """The records to send with a new model request, selected under the bounds, losses counted;
        with provider, adapter, account and model_class, the newest compatible continuation too."""
        metrics = _metrics(request)
        async with metrics.observe("context") as line:
            line["session_id"] = sid = _session_id(session_id)
            q = QueryProblems(request, CONTEXT_PARAMS)
            most_records = _optional_int(q, "max_records", max_records, 0)
            most_bytes = _optional_int(q, "max_bytes", max_bytes, 0)
            wanted = wanted_from(q, (provider, adapter, account, model_class))
            q.check()
            caller = caller_of(request)
            judged: list[Continuations] = []

            def candidates(snapshot: repo.SessionSnapshot, now: Any) -> list[tuple[int, str]]:
                judged.append(Continuations(snapshot, wanted))
                return judged[0].candidates(now)

            read = await repo.read_for_context(
                ledger_of(request), caller.tenant, sid, _reader(caller), key_ring_of(request), candidates
            )
            snap = read.snapshot
            line["revision"] = snap.revision
            continuations = judged[0] if judged else Continuations(snap, wanted)
            if not judged:
                continuations.candidates(read.now)
            chosen = select_context(continuations.others, most_records, most_bytes, snap.sizes)
            if isinstance(chosen, LedgerError):
                raise chosen
            metrics.omitted.inc(chosen.omitted_records)
            line.update(
                kept=len(chosen.seqs), omitted=chosen.omitted_records, summarized=len(chosen.summarized)
            )
        kept = set(chosen.seqs)
        extra = continuations.answer(read.handed, read.unreadable)
        omitted: dict[str, Any] = {"records": chosen.omitted_records, "bytes": chosen.omitted_bytes}
        if "omitted_continuations" in extra:
            omitted["continuations"] = extra.pop("omitted_continuations")
        return Response(
            {
                "revision": snap.revision,
                "records": [record_view(seq, at, r) for seq, at, r in snap.records if seq in kept],
                "omitted": omitted,
                "summarized": chosen.summarized,
                "unresolved": chosen.unresolved,
                **extra,
            }
        )

    @delete(SESSION_PATH, guards=[requires(JOURNAL_WRITE)], status_code=204)
    async def remove(self, request: Request[Any, Any, Any], session_id: FromPath[str]) -> None:
        """Delete the caller's session with its records and labels; the ledger is another plane."""
        async with _metrics(request).observe("delete") as line:
            line["session_id"] = sid = _session_id(session_id)
            caller = caller_of(request)
            await repo.delete_session(ledger_of(request), caller.tenant, caller.principal, sid)
