"""Continuation records (API.md section 12) on a real PostgreSQL: bound at append to the digest of the
prefix they continue, sealed at rest with a key outside the database, handed back only by a
compatible context answer; every mismatch reason; never among the context's records; the payload in
no other response, no log line, no row in clear."""

from __future__ import annotations

import base64
import json
import logging
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import structlog

from effect_ledger.db.maintenance import purge
from effect_ledger.domain.journal_continuations import KeyRing, prefix_digest
from effect_ledger.logs import configure_logging
from effect_ledger.settings import Settings
from support.auth import token
from support.console import sign_in as console_sign_in
from support.journal import WRITER, append, assistant, call, new_session, result, summary, user, who
from support.server import Service

# Run again on a Citus cluster by the Citus lane of .ci/run (pytest -m storage).
pytestmark = pytest.mark.storage


PAYLOAD = b"opaque-provider-state:" + secrets.token_bytes(48)
MARKER = base64.b64encode(PAYLOAD).decode()
LABELS = {"provider": "acme", "adapter": "acme-py/3", "account": "acct-1", "model_class": "large"}


def later(seconds: int = 3600) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def continuation(covers_to_seq: int, payload: str = MARKER, **changes: Any) -> dict[str, Any]:
    return {
        "type": "continuation",
        **LABELS,
        "response_id": "resp_1",
        "covers_to_seq": covers_to_seq,
        "expires_at": later(),
        "classification": "confidential",
        "payload": payload,
        **changes,
    }


def write_ring(path: Path, first: str, *, keep: bool) -> None:
    """Rotate: a new first line (it seals from now on), the old lines kept or dropped."""
    path.write_text(first + (path.read_text() if keep else ""))


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "journal-state.key"
    path.write_text(KeyRing.new_line("k1"))
    return path


@pytest.fixture
async def client(settings: Settings, key_file: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with Service(replace(settings, journal_state_key_file=str(key_file))) as running:
        async with running.client() as http:
            yield http


async def context(client: httpx.AsyncClient, sid: str, **params: Any) -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}/context", params=params, headers=who(WRITER))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def seeded(client: httpx.AsyncClient) -> str:
    """A session: a user message, a call and its result, an answer (seqs 1-4), then a continuation
    of records 1..4 (seq 5)."""
    sid = await new_session(client)
    r = await append(client, sid, 0, [user(), call("c1"), result("c1"), assistant("A is better")])
    assert r.status_code == 200, r.text
    r = await append(client, sid, 4, [continuation(4)])
    assert r.status_code == 200 and r.json()["revision"] == 5, r.text
    return sid


async def test_a_compatible_continuation_is_handed_back_with_its_payload(client: httpx.AsyncClient) -> None:
    sid = await seeded(client)
    answer = await context(client, sid, **LABELS)
    handed = answer["continuation"]
    assert handed["seq"] == 5 and handed["payload"] == MARKER
    assert (handed["provider"], handed["covers_to_seq"], handed["response_id"]) == ("acme", 4, "resp_1")
    assert [r["seq"] for r in answer["records"]] == [1, 2, 3, 4]  # never among the records
    assert answer["omitted"] == {"records": 0, "bytes": 0, "continuations": []}
    # the bound prefix is the digest of records 1..4 as stored
    snap = (await client.get(f"/v1/sessions/{sid}", headers=who(WRITER))).json()
    stored = [{k: v for k, v in r.items() if k not in ("seq", "at")} for r in snap["records"][:4]]
    assert handed["prefix_digest"] == prefix_digest(stored)


async def test_a_continuation_stays_valid_as_the_session_grows(client: httpx.AsyncClient) -> None:
    sid = await seeded(client)
    r = await append(client, sid, 5, [user("and C?"), call("c2"), result("c2"), summary(1, 4)])
    assert r.status_code == 200, r.text
    answer = await context(client, sid, **LABELS)
    assert answer["continuation"]["seq"] == 5 and answer["continuation"]["payload"] == MARKER
    assert 5 not in [r["seq"] for r in answer["records"]]
    # and with a tight budget: it never counts against the bounds
    tight = await context(client, sid, max_records=2, **LABELS)
    assert tight["continuation"]["seq"] == 5
    assert all(r["type"] != "continuation" for r in tight["records"])
    assert tight["omitted"]["records"] == 8 - len(tight["records"])


async def test_every_mismatch_reason(client: httpx.AsyncClient, db_url: str) -> None:
    sid = await new_session(client)
    assert (await append(client, sid, 0, [user(), assistant("ok")])).status_code == 200
    batch = [
        continuation(2, provider="other"),  # seq 3
        continuation(2, adapter="acme-py/2"),  # 4
        continuation(2, account="acct-2"),  # 5
        continuation(2, model_class="small"),  # 6
        continuation(2, expires_at=(datetime.now(UTC) - timedelta(seconds=5)).isoformat()),  # 7
        continuation(1),  # 8: its prefix is tampered with below
        continuation(2),  # 9: compatible, but 10 is newer
        continuation(2),  # 10: the one handed back
    ]
    r = await append(client, sid, 2, batch)
    assert r.status_code == 200, r.text
    conn = await asyncpg.connect(db_url)
    try:  # an edit of the bound prefix (record 1) in the database: seq 8's binding no longer holds
        await conn.execute(
            "UPDATE journal.records SET record = jsonb_set(record, '{content}', '\"edited\"')"
            " WHERE session_id = $1 AND seq = 1",
            sid,
        )
        await conn.execute(
            "UPDATE journal.records SET record = jsonb_set(record, '{prefix_digest}', to_jsonb($2::text))"
            " WHERE session_id = $1 AND seq IN (9, 10)",
            sid,
            prefix_digest(
                [
                    {"type": "message", "role": "user", "content": "edited", "schema": 1},
                    {"type": "message", "role": "assistant", "content": "ok", "schema": 1},
                ]
            ),
        )
    finally:
        await conn.close()
    answer = await context(client, sid, **LABELS)
    assert answer["continuation"] is None or answer["continuation"]["seq"] == 10
    reasons = {o["seq"]: o["reason"] for o in answer["omitted"]["continuations"]}
    assert {k: reasons[k] for k in range(3, 9)} == {
        3: "provider",
        4: "adapter",
        5: "account",
        6: "model_class",
        7: "expired",
        8: "prefix",
    }
    # 9 and 10 were re-bound to the edited prefix in the database, but their payloads are sealed to
    # the prefix of their append: they do not open, so neither is handed back
    assert answer["continuation"] is None
    assert (reasons[9], reasons[10]) == ("unreadable", "unreadable")
    none_asked = await context(client, sid)
    assert "continuation" not in none_asked
    assert {o["reason"] for o in none_asked["omitted"]["continuations"]} == {"not_requested"}


async def test_superseded_and_not_requested(client: httpx.AsyncClient) -> None:
    sid = await seeded(client)
    assert (
        await append(client, sid, 5, [continuation(4, payload=base64.b64encode(b"newer").decode())])
    ).status_code == 200
    answer = await context(client, sid, **LABELS)
    assert answer["continuation"]["seq"] == 6
    assert base64.b64decode(answer["continuation"]["payload"]) == b"newer"
    assert answer["omitted"]["continuations"] == [{"seq": 5, "reason": "superseded"}]
    partial = await client.get(
        f"/v1/sessions/{sid}/context", params={"provider": "acme"}, headers=who(WRITER)
    )
    assert partial.status_code == 422
    assert {e["field"] for e in partial.json()["errors"]} == {"adapter", "account", "model_class"}


async def test_append_rules_for_continuations(client: httpx.AsyncClient) -> None:
    sid = await new_session(client)
    assert (await append(client, sid, 0, [user(), call("c1")])).status_code == 200
    # it may stand while a call is unresolved (the causal rules ignore it)
    assert (await append(client, sid, 2, [continuation(2)])).status_code == 200
    # it continues at most the history before the batch
    beyond = await append(client, sid, 3, [result("c1"), continuation(4)])
    assert beyond.status_code == 422 and beyond.json()["errors"][0]["index"] == 1
    # a summary may not cover one
    assert (await append(client, sid, 3, [result("c1"), assistant("done")])).status_code == 200
    covering = await append(client, sid, 5, [summary(1, 4)])
    assert covering.status_code == 422 and covering.json()["code"] == "invalid_history"
    assert covering.json()["errors"] == [{"index": 0, "problem": "covers a continuation record"}]
    assert (await append(client, sid, 5, [summary(5, 5)])).status_code == 200
    for bad in (
        {"payload": "not base64!"},
        {"payload": base64.b64encode(b"x" * (64 * 1024 + 1)).decode()},
        {"expires_at": "tomorrow"},
        {"expires_at": "9999-12-31T23:59:59-14:00"},  # RFC 3339, but year 10000 in UTC (a 500 until round 24)
        {"expires_at": "0001-01-01T00:00:00+14:00"},  # and year 0
        {"classification": "public"},
        {"extra": 1},
    ):
        r = await append(client, sid, 6, [continuation(2, **bad)])
        assert (r.status_code, r.json()["code"]) == (422, "validation_failed"), bad
    # the payload does not count against JOURNAL_MAX_RECORD_BYTES (16 KiB): 60 KiB of state is fine
    big = base64.b64encode(secrets.token_bytes(60 * 1024)).decode()
    assert (await append(client, sid, 6, [continuation(2, payload=big)])).status_code == 200


async def test_a_nonce_replays_only_the_same_payload(client: httpx.AsyncClient) -> None:
    """Records are stored with `"payload": null`, so the batch's identity must cover the payload: the
    same client_nonce with another payload is another batch (409 revision_conflict, the first state
    kept), not a replay answered 200 with the new state dropped."""
    sid = await seeded(client)
    other = base64.b64encode(b"another state").decode()
    nonce = {"client_nonce": "n" * 16}
    record = continuation(5)
    first = await append(client, sid, 5, [record], **nonce)
    assert (first.status_code, first.json()["revision"]) == (200, 6), first.text
    again = await append(client, sid, 5, [record], **nonce)
    assert (again.status_code, again.json()["revision"]) == (200, 6), again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    changed = await append(client, sid, 5, [{**record, "payload": other}], **nonce)
    assert (changed.status_code, changed.json()["code"], changed.json()["revision"]) == (
        409,
        "revision_conflict",
        6,
    ), changed.text
    assert "Idempotent-Replayed" not in changed.headers
    answer = await context(client, sid, **LABELS)
    assert (answer["continuation"]["seq"], answer["continuation"]["payload"]) == (6, MARKER)


@pytest.fixture
def debug_logging() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers, config = root.level, list(root.handlers), structlog.get_config()
    configure_logging("debug")
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.configure(**config)


async def test_the_payload_is_in_no_other_response_no_log_line_and_no_row_in_clear(
    settings: Settings, key_file: Path, db_url: str, debug_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    cfg = replace(settings, journal_state_key_file=str(key_file), log_level="debug")
    bodies: dict[str, str] = {}
    async with Service(cfg) as service, service.client() as client:
        sid = await new_session(client)
        r = await append(client, sid, 0, [user(), call("c1", operation_id="op-1"), result("c1")])
        bodies["append"] = r.text
        r = await append(client, sid, 3, [continuation(3)])
        bodies["append-continuation"] = r.text
        for name, path in (
            ("read", f"/v1/sessions/{sid}"),
            ("read-after", f"/v1/sessions/{sid}?after_seq=3"),
            ("projection", f"/v1/sessions/{sid}/projection"),
            ("context-plain", f"/v1/sessions/{sid}/context"),
            ("context-other", f"/v1/sessions/{sid}/context?provider=x&adapter=y&account=z&model_class=w"),
        ):
            got = await client.get(path, headers=who(WRITER))
            assert got.status_code == 200, got.text
            bodies[name] = got.text
        read = json.loads(bodies["read"])["records"][3]
        assert (read["type"], read["payload"], read["covers_to_seq"]) == ("continuation", None, 3)
        await console_sign_in(client, token(sub="orch-1", scope="journal:write journal:read"))
        console = await client.get(f"/console/sessions/{sid}")
        assert console.status_code == 200 and sid in console.text
        bodies["console"] = console.text
        client.cookies.clear()
        compatible = await client.get(f"/v1/sessions/{sid}/context", params=LABELS, headers=who(WRITER))
        assert compatible.json()["continuation"]["payload"] == MARKER
    for name, text in bodies.items():
        assert MARKER not in text, name
        assert MARKER[:24] not in text, name
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert len(out.splitlines()) >= 8  # the service did log
    assert MARKER not in out and MARKER[:24] not in out
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch("SELECT record::text AS r FROM journal.records")
        sealed = await conn.fetch("SELECT key_id, ciphertext FROM journal.continuation_payloads")
    finally:
        await conn.close()
    assert all(MARKER not in row["r"] for row in rows)
    assert len(sealed) == 1 and sealed[0]["key_id"] == "k1"
    assert PAYLOAD not in bytes(sealed[0]["ciphertext"]) and PAYLOAD[:22] not in bytes(
        sealed[0]["ciphertext"]
    )


async def test_rotation_and_retention(settings: Settings, key_file: Path, db_url: str) -> None:
    async with Service(replace(settings, journal_state_key_file=str(key_file))) as service:
        async with service.client() as client:
            sid = await seeded(client)
    # rotation: a new key on top seals from now on; the old one still opens what it sealed
    write_ring(key_file, KeyRing.new_line("k2"), keep=True)
    async with Service(replace(settings, journal_state_key_file=str(key_file))) as service:
        async with service.client() as client:
            assert (await context(client, sid, **LABELS))["continuation"]["payload"] == MARKER
            gone = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
            assert (await append(client, sid, 5, [continuation(4, expires_at=gone)])).status_code == 200
    conn = await asyncpg.connect(db_url)
    try:
        keys = await conn.fetch("SELECT key_id FROM journal.continuation_payloads ORDER BY seq")
        assert [r["key_id"] for r in keys] == ["k1", "k2"]
    finally:
        await conn.close()
    assert (await purge(settings)).counts["continuation_payloads"] == 1
    # a key dropped from the ring: what it sealed can no longer be handed back
    write_ring(key_file, KeyRing.new_line("k3"), keep=False)
    async with Service(replace(settings, journal_state_key_file=str(key_file))) as service:
        async with service.client() as client:
            answer = await context(client, sid, **LABELS)
    assert answer["continuation"] is None
    reasons = {o["seq"]: o["reason"] for o in answer["omitted"]["continuations"]}
    assert reasons == {5: "unreadable", 6: "expired"}


async def test_without_a_key_file_a_process_key_seals_and_a_restart_cannot_open(settings: Settings) -> None:
    """An app built without JOURNAL_STATE_KEY_FILE (serve always has one) seals with a key of its own
    process: the payload is handed back while it runs, and reported unreadable after a restart."""
    assert settings.journal_state_key_file is None
    async with Service(settings) as first, first.client() as http:
        sid = await seeded(http)
        assert (await context(http, sid, **LABELS))["continuation"]["payload"] == MARKER
    async with Service(settings) as second, second.client() as http:
        answer = await context(http, sid, **LABELS)
    assert answer["continuation"] is None
    assert answer["omitted"]["continuations"] == [{"seq": 5, "reason": "unreadable"}]


async def test_reopen_hands_back_a_compatible_continuation_or_says_why_not(
    settings: Settings, key_file: Path
) -> None:
    from effect_ledger.client import LedgerClient, message, reopen
    from effect_ledger.client import continuation as continuation_record
    from support.auth import token

    async with Service(replace(settings, journal_state_key_file=str(key_file))) as service:
        async with LedgerClient(
            service.base_url, token(sub="orch-1", scope="journal:write journal:read")
        ) as c:
            sid = (await c.journal.create_session()).session_id
            plain = await reopen(c, sid, continuation_for=LABELS)
            assert (plain.continuation, plain.continuation_why_not) == (None, "none_recorded")
            await c.journal.append(sid, 0, [message("user", "hi"), message("assistant", "hello")])
            state = continuation_record(
                **LABELS, covers_to_seq=2, expires_at=datetime.now(UTC) + timedelta(hours=1), payload=PAYLOAD
            )
            await c.journal.append(sid, 2, [state])
            plan = await reopen(c, sid, continuation_for=LABELS)
            assert plan.continuation is not None and plan.continuation_why_not is None
            assert base64.b64decode(plan.continuation["payload"]) == PAYLOAD
            other = await reopen(c, sid, continuation_for={**LABELS, "model_class": "small"})
            assert (other.continuation, other.continuation_why_not) == (None, "model_class")
            unasked = await reopen(c, sid)
            assert (unasked.continuation, unasked.continuation_why_not) == (None, "not_requested")


async def test_deleting_the_session_takes_the_payloads_with_it(
    client: httpx.AsyncClient, db_url: str
) -> None:
    sid = await seeded(client)
    conn = await asyncpg.connect(db_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM journal.continuation_payloads") == 1
        assert (await client.delete(f"/v1/sessions/{sid}", headers=who(WRITER))).status_code == 204
        assert await conn.fetchval("SELECT count(*) FROM journal.continuation_payloads") == 0
    finally:
        await conn.close()


def test_serve_keeps_its_key_ring_in_the_data_directory(tmp_path: Path) -> None:
    from effect_ledger.runtime import with_state_key

    first = with_state_key(Settings(data_dir=str(tmp_path)))
    path = Path(first.journal_state_key_file or "")
    assert path == tmp_path.resolve() / "journal-state.key" and path.stat().st_mode & 0o777 == 0o600
    text = path.read_text()
    assert KeyRing.parse(text).active == "k1"
    again = with_state_key(Settings(data_dir=str(tmp_path)))  # a restart (or another worker): the same ring
    assert again.journal_state_key_file == first.journal_state_key_file and path.read_text() == text
    given = Settings(data_dir=str(tmp_path), journal_state_key_file=str(path))
    assert with_state_key(given) is given
