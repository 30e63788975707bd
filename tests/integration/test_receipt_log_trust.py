"""The receipts log against the database's own operators (API.md section 14), as the superuser:

- an edited receipt, tile or entry, or a dropped operation, gets no new checkpoint signed over it; the
  refusal is counted (effect_ledger_log_refusals_total{reason}) and logged, and the proof files saved
  before still verify;
- a database restored from an older copy (CREATE DATABASE ... TEMPLATE of a snapshot) is behind the
  signer: executor writes answer 503 and /readyz names log_behind_signer, until `effect-ledger
  log-recover --entries DIR` re-creates the lost receipts as tombstones (each lost ID answers
  reuse_receipt again) from mirrored entry bundles, or `--accept-loss` records the operator's decision;
- the signer as its own process (`effect-ledger log-signer`) and a witness (`effect-ledger witness`)
  over loopback HTTP, whose cosignatures the served checkpoint carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from effect_ledger.db import receipt_log
from effect_ledger.domain import merkle, tiles
from effect_ledger.domain.note import (
    ALG_COSIGNATURE_V1,
    Signature,
    Signer,
    parse_checkpoint,
    parse_note,
    parse_vkey,
)
from effect_ledger.domain.receipt_log import ProofInvalid, parse_proof_file, verify_proof
from effect_ledger.settings import Settings, SettingsError
from effect_ledger.signer import FileSigner, RemoteSigner, SignRefused, create_key, serve_signer
from support.counting import CountingConnection
from support.ledger import AUDITOR, CLAIM, claim, committed, get
from support.ledger import owner as superuser
from support.receipt_log import CLI, cli_process, commit_with_a_discrepancy, log_settings
from support.server import Service, free_port
from support.waiting import until

pytestmark = pytest.mark.timeout(240)


async def size_of(client: httpx.AsyncClient) -> int:
    r = await get(client, "/v1/log/checkpoint", **AUDITOR)
    return 0 if r.status_code == 404 else parse_checkpoint(parse_note(r.text).text).size


async def wait_for_size(client: httpx.AsyncClient, size: int) -> None:
    assert (
        await until(lambda: size_of(client), f"checkpoint of size {size}", holds=lambda s: s >= size) == size
    )


def refusals(service: Service, reason: str) -> float:
    value = service.app.state.metrics.registry.get_sample_value(
        "effect_ledger_log_refusals_total", {"reason": reason}
    )
    return float(value or 0)


def refused_reasons(service: Service) -> set[str]:
    return {
        sample.labels["reason"]
        for metric in service.app.state.metrics.registry.collect()
        if metric.name == "effect_ledger_log_refusals"
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.value > 0
    }


async def proofs(client: httpx.AsyncClient, ops: list[str]) -> dict[str, str]:
    out = {}
    for op in ops:
        r = await get(client, "/v1/log/proof", {"operation_id": op}, **AUDITOR)
        assert r.status_code == 200, r.text
        out[op] = r.text
    return out


TAMPERS = {
    "receipt": (
        "UPDATE ledger.operations SET receipt = jsonb_set(receipt, '{external_ref}', '\"forged\"')"
        " WHERE tenant_id = 't1' AND operation_id = 'op-2'",
        {"receipt_mismatch"},
    ),
    "entry": (
        "UPDATE ledger.log_tiles SET data = overlay(data placing '\\x58'::bytea from 40 for 1)"
        " WHERE tenant_id = 't1' AND level = -1 AND idx = 0",
        {"entry_mismatch"},
    ),
    # an operation dropped (whose ID could then execute again): its row gone long before its tombstone
    # could have expired
    "dropped": (
        "DELETE FROM ledger.operations WHERE tenant_id = 't1' AND operation_id = 'op-2'",
        {"receipt_missing"},
    ),
    "tile deleted": (
        "DELETE FROM ledger.log_tiles WHERE tenant_id = 't1' AND level = 0 AND idx = 0",
        {"root_mismatch", "entry_mismatch"},
    ),
    "bundle deleted": (
        "DELETE FROM ledger.log_tiles WHERE tenant_id = 't1' AND level = -1 AND idx = 0",
        {"entry_mismatch"},
    ),
    "tile": (
        "UPDATE ledger.log_tiles SET data = overlay(data placing '\\x0000'::bytea from 33 for 2)"
        " WHERE tenant_id = 't1' AND level = 0 AND idx = 0",
        # the integrator appended to the edited tile, so the entries (not the root) disagree with it
        {"entry_mismatch", "root_mismatch", "inconsistent"},
    ),
}


# The Citus lane runs one tamper of each table the audit reads (an operation's receipt, a dropped
# operation, a tile) with the log growing; the other cases read the same rows with the same statements
# (storage_repeat: plain PostgreSQL only). The restore tests clone a database: plain PostgreSQL only.
ON_CITUS = {("receipt", True), ("dropped", True), ("tile", True)}


@pytest.mark.storage
@pytest.mark.parametrize(
    ("what", "grow"),
    [
        pytest.param(
            what,
            grow,
            id=f"{what}-{'log-grows' if grow else 'log-idle'}",
            marks=() if (what, grow) in ON_CITUS else pytest.mark.storage_repeat,
        )
        for what in sorted(TAMPERS)
        for grow in (True, False)
    ],
)
async def test_tampered_history_gets_no_new_checkpoint(
    what: str, grow: bool, settings: Settings, db_url: str, tmp_path: Path
) -> None:
    statement, reasons = TAMPERS[what]
    async with Service(log_settings(settings, tmp_path)) as running, running.client() as client:
        ops = [f"op-{i}" for i in range(5)]
        for op in ops:
            await committed(client, op)
        await wait_for_size(client, 5)
        key = (await get(client, "/v1/log/key", **AUDITOR)).json()["vkey"]
        saved = await proofs(client, ops)
        receipts = {
            op: (await get(client, f"/v1/operations/{op}", **AUDITOR)).json()["receipt"] for op in ops
        }
        async with superuser(db_url) as admin:
            assert await admin.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            assert (await admin.execute(statement)).endswith(" 1")
        for i in range(3 if grow else 0):  # idle: the audit finds it all the same
            await committed(client, f"later-{i}")
        got = await until(lambda: refused_reasons(running), f"a refusal for the edited {what}", within=60)
        assert got <= reasons, got
        await asyncio.sleep(2.5)  # several checkpoint periods: none may be signed
        assert await size_of(client) == 5
        for op, text in saved.items():
            assert verify_proof(text, key, receipt=receipts[op]).operation_id == op
        if what == "receipt":
            forged = (await get(client, "/v1/operations/op-2", **AUDITOR)).json()["receipt"]
            with pytest.raises(ProofInvalid, match="receipt_digest"):
                verify_proof(saved["op-2"], key, receipt=forged)
        if what == "entry":
            r = await get(client, "/v1/log/proof", {"operation_id": "op-0"}, **AUDITOR)
            assert r.status_code == 500 and r.json()["code"] == "internal"
        if what == "dropped":
            r = await get(client, "/v1/log/proof", {"operation_id": "op-2"}, **AUDITOR)
            assert r.status_code == 404 and r.json()["code"] == "not_found"


@pytest.mark.storage
async def test_an_edited_leaf_in_a_partly_audited_bundle_stops_the_next_checkpoint(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """Signed at 3, then at 5 (whose audit re-checked leaves 0..2), leaf 0 edited, the log grown to 7:
    the checkpoint of 7 is refused. Until round 18 the audit's cursor stopped at 3, the next audit
    checked only leaves 3..4 and 7 was signed over the edited leaf 0 (a CI run under load once met it
    in test_log_conformance.py, whose first checkpoints happened to be 3 and 5)."""
    async with Checkpointing(settings, tmp_path, commits=7) as log:
        assert [await log.grow_and_sign(3), await log.grow_and_sign(5)] == [3, 5]
        assert await log.owner.execute(TAMPERS["entry"][0]) == "UPDATE 1"
        assert await log.grow_and_sign(7) is None
        assert log.refused == ["entry_mismatch"] and await log.signed_size() == 5


@pytest.mark.storage
async def test_a_committed_operation_dropped_before_it_was_logged_stops_the_log_with_a_refusal(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """Its place on the feed has no operation behind it any more: the log stops in front of it (leaf
    i is the receipt at position i+1, so nothing after it can be logged either) and counts `feed_gap`
    each pass. Until round 18 it only logged a warning, and no alert could see it."""
    async with Checkpointing(settings, tmp_path, commits=7) as log, superuser(db_url) as admin:
        assert await admin.execute(TAMPERS["dropped"][0].replace("op-2", "op-3")) == "DELETE 1"
        assert await receipt_log.integrate_tenant(log.owner, "t1", 10, log.refuse) == 3  # op-0 .. op-2
        assert await receipt_log.integrate_tenant(log.owner, "t1", 10, log.refuse) == 0
        assert log.refused == ["feed_gap", "feed_gap"] and await log.size() == 3


async def rewrite_leaf_0(db_url: str) -> None:
    """As the database's superuser: leaf 0's principal changed in its bundle, its hash in the level-0
    tile and log_state.root rewritten to match (a log of at most 256 leaves), so the database agrees
    with itself, and the receipt digest and chain head the checks compare are untouched."""
    async with superuser(db_url) as admin:
        tile_rows = "SELECT data FROM ledger.log_tiles WHERE tenant_id = 't1' AND level = $1 AND idx = 0"
        entries = tiles.decode_bundle(await admin.fetchval(tile_rows, tiles.ENTRIES))
        leaf = json.loads(entries[0])
        leaf["principal"] = "someone-else"
        entries[0] = json.dumps(leaf, sort_keys=True, separators=(",", ":")).encode()
        hashes = [merkle.leaf_hash(e) for e in entries]
        put = "UPDATE ledger.log_tiles SET data = $2 WHERE tenant_id = 't1' AND level = $1 AND idx = 0"
        await admin.execute(put, tiles.ENTRIES, tiles.encode_bundle(entries))
        await admin.execute(put, 0, b"".join(hashes))
        await admin.execute(
            "UPDATE ledger.log_state SET root = $1 WHERE tenant_id = 't1'", merkle.naive_root(hashes)
        )


@pytest.mark.storage
async def test_a_rewritten_leaf_gets_no_proof_that_would_not_verify(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """The same careful edit under a running service: the proof endpoint checks the inclusion proof it
    built against the root the checkpoint's note signs, and answers 500 with an incident instead of a
    proof no verifier accepts (until round 18 it served one). The consistency endpoint checks its proof
    against the signed root the same way (round 19). A leaf's bundle deleted is the same 500, not 409
    not_yet_logged."""
    async with Service(log_settings(settings, tmp_path)) as running, running.client() as client:
        for i in range(5):
            await committed(client, f"op-{i}")
        await wait_for_size(client, 5)
        assert (await get(client, "/v1/log/proof", {"operation_id": "op-0"}, **AUDITOR)).status_code == 200
        assert (await get(client, "/v1/log/consistency", {"from": 3}, **AUDITOR)).status_code == 200
        await rewrite_leaf_0(db_url)
        for op in ("op-0", "op-3"):  # op-3's proof carries the rewritten leaf's hash in its path
            r = await get(client, "/v1/log/proof", {"operation_id": op}, **AUDITOR)
            assert r.status_code == 500 and r.json()["code"] == "internal", (op, r.text)
        # the consistency proof too: from the tiles, it no longer leads to the signed root
        for since in (1, 3, 5):
            r = await get(client, "/v1/log/consistency", {"from": since}, **AUDITOR)
            assert r.status_code == 500 and r.json()["code"] == "internal", (since, r.text)
        async with superuser(db_url) as admin:
            await admin.execute(TAMPERS["bundle deleted"][0])
        r = await get(client, "/v1/log/proof", {"operation_id": "op-1"}, **AUDITOR)
        assert r.status_code == 500 and r.json()["code"] == "internal", r.text


@pytest.mark.storage
async def test_a_leaf_rewritten_with_its_tile_and_root_is_found_by_the_idle_audit(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """A careful edit of a signed, idle log: leaf 0's principal changed in its bundle, its hash in the
    level-0 tile and log_state.root rewritten to match, so the database agrees with itself and the
    receipt digest and chain head the audit compares are untouched. The idle audit compares the tiles'
    root with the root the signer signed (its own state, outside the database) and refuses. Until round
    18 it compared with log_state.root and passed (only a later checkpoint, at the signer, would have
    seen it)."""
    async with Checkpointing(settings, tmp_path, commits=5) as log:
        assert await log.grow_and_sign(5) == 5
        await rewrite_leaf_0(db_url)
        assert await receipt_log.checkpoint(log.owner, log.signer, log.config, log.guard, log.refuse) == []
        assert log.refused == ["root_mismatch"] and await log.signed_size() == 5


class Checkpointing:
    """The integrator and the checkpointer driven step by step (no service running): `commits`
    operations of t1 committed first with the log off, an in-process signer, one guard, the refusals
    in a list."""

    def __init__(self, settings: Settings, tmp_path: Path, commits: int) -> None:
        from effect_ledger.signer import LocalSigner

        self.settings = settings
        self.commits = commits
        key = tmp_path / "signer.key"
        create_key(key, "effect-ledger.local")
        self.signer = LocalSigner(FileSigner(key, tmp_path / "state"))
        self.config = receipt_log.LogConfig("effect-ledger.local", 1)
        self.guard = receipt_log.LogGuard()
        self.refused: list[str] = []

    async def __aenter__(self) -> Checkpointing:
        from effect_ledger.db.maintenance import owner_connection

        unlimited = replace(self.settings, rate_limit_per_second=0)
        async with Service(unlimited) as off, off.client() as client:
            for i in range(self.commits):
                await committed(client, f"op-{i}")
        self.owner = await owner_connection(self.settings)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.owner.close()

    def refuse(self, reason: str, tenant: str) -> None:
        self.refused.append(reason)

    async def size(self) -> int:
        """The integrated log's size (0 before its first pass)."""
        return int(await self.owner.fetchval("SELECT size FROM ledger.log_state WHERE tenant_id = 't1'") or 0)

    async def signed_size(self) -> int:
        done = (await self.signer.states()).get("effect-ledger.local/t1")
        return done.size if done else 0

    async def grow(self, to: int) -> None:
        """Integrate up to `to` leaves, the built leaves kept in the guard as the service's integrator
        keeps them (receipt_log.integrate)."""
        size = await self.size()
        if to > size:
            built = self.guard.built.setdefault("t1", {})
            assert await receipt_log.integrate_tenant(self.owner, "t1", to - size, built=built) == to - size

    async def sign(self, conn: Any = None) -> int | None:
        before = (await self.signer.states()).get("effect-ledger.local/t1")
        return await receipt_log.checkpoint_tenant(
            conn or self.owner, "t1", self.signer, self.config, before, self.refuse, self.guard
        )

    async def grow_and_sign(self, to: int) -> int | None:
        await self.grow(to)
        return await self.sign()


@pytest.mark.storage
async def test_the_checkpointer_takes_the_integrators_word_only_for_rows_unchanged_since(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """Leaves this process's integrator built are not compared with their receipts again while their
    rows are the versions it verified (log_rows_changed: one probe a row, no receipt read); a receipt
    edited between the integration and the checkpoint is compared in full, alone, and refused. Once
    signed, the built leaves are forgotten; the audit of the signed log compares them in full."""
    async with Checkpointing(settings, tmp_path, commits=5) as log, superuser(db_url) as admin:
        await log.grow(3)
        assert sorted(log.guard.built["t1"]) == [0, 1, 2]
        assert [v[1] for _, v in sorted(log.guard.built["t1"].items())] == ["op-0", "op-1", "op-2"]
        observed = CountingConnection(log.owner)
        assert await log.sign(observed) == 3
        assert observed.ids_sent("log_receipts_of") == [] and log.guard.built["t1"] == {}
        assert observed.sent.count("log_rows_changed") == 1

        await log.grow(5)  # op-3 and op-4; then op-4's receipt edited before they are signed
        assert await admin.execute(TAMPERS["receipt"][0].replace("op-2", "op-4")) == "UPDATE 1"
        observed = CountingConnection(log.owner)
        assert await log.sign(observed) is None
        # op-4 alone compared in full (its row changed; op-3's is the version verified), and refused
        # (the audit of the signed leaves 0 .. 2 follows only new leaves that passed)
        assert observed.ids_sent("log_receipts_of") == [["op-4"]]
        assert log.refused == ["receipt_mismatch"] and await log.signed_size() == 3


@pytest.mark.storage
async def test_an_entry_rewritten_with_its_tiles_and_root_is_refused_though_its_row_is_unchanged(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """The integrator's word covers the leaf it built, not whatever entry now sits at its index: an
    entry rewritten (another receipt digest) together with its level-0 tile and the log's root, so
    that tiles, entries and root agree, hashes to another leaf than the built one and is compared with
    its row in full: refused, nothing signed."""
    async with Checkpointing(settings, tmp_path, commits=3) as log, superuser(db_url) as admin:
        await log.grow(3)
        where = "WHERE tenant_id = 't1' AND idx = 0 AND level = $1"
        entries = tiles.decode_bundle(await admin.fetchval(f"SELECT data FROM ledger.log_tiles {where}", -1))
        leaf = json.loads(entries[1])
        leaf["receipt_digest"] = "0" * 64
        entries[1] = json.dumps(leaf, separators=(",", ":"), sort_keys=True).encode()
        hashes = [merkle.leaf_hash(e) for e in entries]
        await admin.execute(
            f"UPDATE ledger.log_tiles SET data = $2 {where}", -1, tiles.encode_bundle(entries)
        )
        await admin.execute(f"UPDATE ledger.log_tiles SET data = $2 {where}", 0, b"".join(hashes))
        await admin.execute(
            "UPDATE ledger.log_state SET root = $1 WHERE tenant_id = 't1'", merkle.naive_root(hashes)
        )
        assert await log.sign() is None
        assert log.refused == ["receipt_mismatch"] and await log.signed_size() == 0


@pytest.mark.storage
async def test_a_checkpoint_raced_by_another_replica_is_no_refusal(
    settings: Settings, tmp_path: Path
) -> None:
    """Every server pod runs a checkpointer (three replicas by default): one that read the signer's state
    before another replica signed sends a consistency proof from the older size, and the signer refuses
    it (`inconsistent`). That is a race, not a rewrite: no refusal is counted (until round 24 each one
    was, and alerted on), nothing is signed, and the next pass, from the signer's new state, signs. A
    tree that is no extension of what was signed is still refused (test_tampered_history_...)."""
    async with Checkpointing(settings, tmp_path, commits=3) as log:
        assert await log.grow_and_sign(2) == 2  # "another replica" signs size 2
        assert await receipt_log.integrate_tenant(log.owner, "t1", 1) == 1
        read_before = receipt_log.Signed(0, merkle.EMPTY_ROOT)  # what this one read before that
        raced = await receipt_log.checkpoint_tenant(
            log.owner, "t1", log.signer, log.config, read_before, log.refuse, log.guard
        )
        assert (raced, log.refused, await log.signed_size()) == (None, [], 2)
        assert await log.grow_and_sign(3) == 3 and log.refused == []


@pytest.mark.storage
async def test_a_logged_operation_whose_row_is_gone_stops_signing_unless_its_tombstone_could_have_expired(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """A committed operation's row lives at least a day after its commit under any settings
    (RETENTION_DAYS >= 1 to its tombstone, TOMBSTONE_DAYS >= RETENTION_DAYS to its expiry, both from
    its last change; MIN_ROW_AGE allows an hour for the clocks). A logged
    row gone sooner was dropped by someone who can write the database (its ID could execute again):
    `receipt_missing`, nothing signed. Until round 18 the checkpointer took every missing row for an
    expired tombstone. A row committed three days ago may have expired: its absence is no refusal."""
    async with Checkpointing(settings, tmp_path, commits=7) as log, superuser(db_url) as admin:
        # op-1 committed three days ago (its leaf's committed_at is the row's resolved_at; the value is
        # computed here: Citus refuses a STABLE `timestamptz - interval` over a column in an UPDATE)
        op_1 = "WHERE tenant_id = 't1' AND operation_id = 'op-1'"
        resolved = await admin.fetchval(f"SELECT resolved_at FROM ledger.operations {op_1}")
        await admin.execute(
            f"UPDATE ledger.operations SET resolved_at = $1 {op_1}",
            resolved - timedelta(days=3),
        )
        assert await log.grow_and_sign(5) == 5
        assert await admin.execute(TAMPERS["dropped"][0].replace("op-2", "op-1")) == "DELETE 1"
        assert await log.grow_and_sign(6) == 6  # op-1 could have expired: signed
        assert await admin.execute(TAMPERS["dropped"][0]) == "DELETE 1"  # op-2, committed just now
        assert await log.grow_and_sign(7) is None
        assert log.refused == ["receipt_missing"] and await log.signed_size() == 6


def test_the_audit_covers_the_signed_log_in_whole_bundles_round_robin() -> None:
    guard, width = receipt_log.LogGuard(), tiles.TILE_WIDTH
    assert [guard.audit_range("t", 3), guard.audit_range("t", 5), guard.audit_range("t", 5)] == [
        (0, 3),
        (0, 5),
        (0, 5),
    ]
    big = 9 * width + 7  # three rounds of AUDIT_BUNDLES = 4 bundles: 4, 4, then the last 1 and 7 leaves
    assert [guard.audit_range("t", big) for _ in range(4)] == [
        (0, 4 * width),
        (4 * width, 8 * width),
        (8 * width, big),
        (0, 4 * width),
    ]
    assert guard.audit_range("other", 1) == (0, 1)  # a cursor per tenant


def db_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def with_name(url: str, name: str) -> str:
    parts = urlsplit(url)
    return parts._replace(path="/" + name).geturl()


async def copy_database(admin_url: str, source: str, target: str) -> None:
    async with superuser(admin_url) as admin:
        await admin.execute(f'CREATE DATABASE "{target}" TEMPLATE "{source}"')


async def drop_database(admin_url: str, name: str) -> None:
    async with superuser(admin_url) as admin:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def witness_for(settings: Settings, tmp_path: Path) -> tuple[str, tuple[str, ...], dict[str, str]]:
    """t1's log vkey, the arguments of an `effect-ledger witness` of it (a free port, its state and key
    under tmp_path: the same witness when started again), and an environment without the test's
    EFFECT_LEDGER_ settings to run it in."""
    from effect_ledger.signer import signer_from_settings

    vkey = await signer_from_settings(log_settings(settings, tmp_path)).vkey("effect-ledger.local/t1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_LEDGER_")}
    args = ("witness", "--port", str(free_port()), "--state", str(tmp_path / "witness"))
    return vkey, (*args, "--key", str(tmp_path / "wkey"), "--log", vkey), env


async def a_witness_down(
    settings: Settings, tmp_path: Path
) -> tuple[str, tuple[str, ...], dict[str, str], dict[str, str]]:
    """witness_for's vkey, arguments and environment, and the witness's {url, vkey}: started once for
    its key and URL, then stopped (it is down until a test starts it again)."""
    vkey, witness_args, env = await witness_for(settings, tmp_path)
    with cli_process(*witness_args, env=env) as w:
        witness = {"url": w["witness"], "vkey": w["vkey"]}
    return vkey, witness_args, env, witness


async def signed_alone(client: httpx.AsyncClient) -> None:
    """op-0 committed and in a checkpoint of size 1 that carries only the log's own signature."""
    await committed(client, "op-0")
    await wait_for_size(client, 1)
    assert (await get(client, "/v1/log/checkpoint", **AUDITOR)).text.count("\u2014") == 1


@contextlib.asynccontextmanager
async def silent_witness() -> AsyncIterator[tuple[dict[str, str], list[bool]]]:
    """A witness ({url, vkey}) that accepts connections and never answers, and a list that gets an
    entry each time the service gives up on one and closes it (its client's 5 s timeout)."""
    closed: list[bool] = []

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(4096):
            pass
        closed.append(True)
        writer.close()

    silent = await asyncio.start_server(hang, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    vkey = Signer("silent-witness", secrets.token_bytes(32), ALG_COSIGNATURE_V1).verifier.vkey
    try:
        yield {"url": url, "vkey": vkey}, closed
    finally:
        silent.close()


async def cosigned(client: httpx.AsyncClient, what: str, within: float = 30) -> httpx.Response:
    """The served checkpoint, once it carries one cosignature beside the log's own signature."""
    return await until(
        lambda: get(client, "/v1/log/checkpoint", **AUDITOR),
        what,
        holds=lambda r: r.text.count("\u2014") == 2,
        within=within,
    )


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), *args], env=env, capture_output=True, text=True, timeout=120)


async def test_a_restored_backup_stops_writes_until_log_recover(
    settings: Settings, db_url: str, pg_admin_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configured = log_settings(settings, tmp_path)
    snapshot = db_name(db_url) + "_snap"
    try:
        async with Service(configured) as running, running.client() as client:
            for i in range(3):
                await committed(client, f"op-{i}")
            await wait_for_size(client, 3)
        await copy_database(pg_admin_url, db_name(db_url), snapshot)  # the backup, taken at size 3
        mirror = tmp_path / "mirror"
        async with Service(configured) as running, running.client() as client:
            for i in range(3, 7):
                await committed(client, f"op-{i}")
            await wait_for_size(client, 7)
            bundle = await get(
                client, "/v1/log/" + tiles.tile_path(tiles.TileRef(tiles.ENTRIES, 0, 7)), **AUDITOR
            )
            assert bundle.status_code == 200
            target = mirror / tiles.tile_path(tiles.TileRef(tiles.ENTRIES, 0, 7))
            target.parent.mkdir(parents=True)
            target.write_bytes(bundle.content)  # what an auditor (or a witness) mirrors

        restored = replace(configured, database_url=with_name(db_url, snapshot))
        async with Service(restored) as running, running.client() as client:
            r = await claim(client, "op-5")  # committed in the lost history
            assert r.status_code == 503 and r.json()["code"] == "unavailable" and r.json()["incident"]
            r = await claim(client, "brand-new")
            assert r.status_code == 503
            ready = await client.get("/readyz")
            assert ready.status_code == 503 and ready.json()["checks"]["log"] == "log_behind_signer"
            assert refusals(running, "log_behind_signer") == 1
        # the same from a worker that only keeps the guard (serve's log process does the rest)
        monkeypatch.setattr(receipt_log, "_ELSEWHERE", [True])
        async with Service(restored) as running, running.client() as client:
            r = await claim(client, "brand-new")
            assert r.status_code == 503 and r.json()["code"] == "unavailable"
            ready = await client.get("/readyz")
            assert ready.status_code == 503 and ready.json()["checks"]["log"] == "log_behind_signer"
            assert refusals(running, "log_behind_signer") == 0  # the log process's to count
        monkeypatch.setattr(receipt_log, "_ELSEWHERE", [False])

        env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_LEDGER_")}
        env.update(
            EFFECT_LEDGER_DATABASE_URL=restored.database_url or "",
            EFFECT_LEDGER_DATA_DIR=configured.data_dir,
            EFFECT_LEDGER_LOG_SIGNER_STATE=configured.log_signer_state or "",
            EFFECT_LEDGER_LOG_FORMAT="json",
        )
        done = cli("log-recover", "--entries", str(mirror), env=env)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout.strip().splitlines()[-1])["log_recover"]["t1"]
        assert report["tombstones"] == 4 and report["leaves"] == 4

        async with Service(restored) as running, running.client() as client:
            assert (await client.get("/readyz")).status_code == 200
            # the recovered tree, which the signer had signed and the database had no checkpoint of, is
            # signed again: the recovered receipts are provable with no new commit (until round 24 they
            # answered 409 not_yet_logged, and the checkpoint served was the backup's, until one came)
            proved = await until(
                lambda: get(client, "/v1/log/proof", {"operation_id": "op-5"}, **AUDITOR),
                "a recovered receipt provable",
                holds=lambda r: r.status_code == 200,
            )
            key = (await get(client, "/v1/log/key", **AUDITOR)).json()["vkey"]
            verified = verify_proof(proved.text, key)
            assert (verified.index, verified.size) == (5, 7)
            for i in range(3, 7):  # every lost committed ID is known again: never executed twice
                r = await claim(client, f"op-{i}")
                assert r.status_code == 200 and r.json()["action"] == "reuse_receipt", r.text
                assert r.json()["operation"]["purged"] is True
            await committed(client, "after-recovery")
            await wait_for_size(client, 8)  # the signer accepts it: consistent with what it signed
            text = (await get(client, "/v1/log/proof", {"operation_id": "after-recovery"}, **AUDITOR)).text
            key = (await get(client, "/v1/log/key", **AUDITOR)).json()["vkey"]
            assert verify_proof(text, key).index == 7
    finally:
        await drop_database(pg_admin_url, snapshot)


async def test_accepting_the_loss_is_recorded_and_unblocks(
    settings: Settings, db_url: str, pg_admin_url: str, tmp_path: Path
) -> None:
    configured = log_settings(settings, tmp_path)
    snapshot = db_name(db_url) + "_snap"
    try:
        async with Service(configured) as running, running.client() as client:
            await committed(client, "op-0")
            await wait_for_size(client, 1)
        await copy_database(pg_admin_url, db_name(db_url), snapshot)
        async with Service(configured) as running, running.client() as client:
            await committed(client, "op-1")
            await wait_for_size(client, 2)
        restored = replace(configured, database_url=with_name(db_url, snapshot))
        env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_LEDGER_")}
        env.update(
            EFFECT_LEDGER_DATABASE_URL=restored.database_url or "",
            EFFECT_LEDGER_DATA_DIR=configured.data_dir,
            EFFECT_LEDGER_LOG_SIGNER_STATE=configured.log_signer_state or "",
        )
        refused = cli("log-recover", "--accept-loss", env=env)
        assert refused.returncode == 2 and "--reason" in refused.stderr
        done = cli("log-recover", "--accept-loss", "--reason", "restore of ticket 42", env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1]) == {
            "log_recover": {"t1": {"accepted_loss": 1}}
        }
        async with superuser(restored.database_url) as admin:
            row = await admin.fetchrow("SELECT kind, signed_size, db_size, reason FROM ledger.log_decisions")
        assert dict(row) == {
            "kind": "accept_loss",
            "signed_size": 2,
            "db_size": 1,
            "reason": "restore of ticket 42",
        }
        async with Service(restored) as running, running.client() as client:
            r = await claim(client, "op-1", CLAIM)  # the accepted loss: this ID is new again
            assert r.status_code == 201
    finally:
        await drop_database(pg_admin_url, snapshot)


@pytest.mark.parametrize("elsewhere", [False, True], ids=["log-in-worker", "guard-only-worker"])
async def test_writes_wait_until_the_guard_has_compared_the_database_with_the_signer(
    elsewhere: bool, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that starts while its signer is unreachable cannot know whether its database is a
    restored backup (behind what the signer signed): executor writes answer 503 (`log_not_checked`,
    an incident) and /readyz says so, until a pass reaches the signer; then they go through. Until
    round 20 such a worker served writes at once (fail-open): its first pass's failure was only
    logged. Both kinds of worker: the log in it, or only the guard (serve's log process does the rest)."""
    monkeypatch.setattr(receipt_log, "_ELSEWHERE", [elsewhere])
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_LEDGER_")}
    token = tmp_path / "signer-token"
    token.write_text(secrets.token_hex(32) + "\n")
    port = free_port()  # nothing listens there yet
    remote = log_settings(
        settings, tmp_path, log_signer_url=f"http://127.0.0.1:{port}", log_signer_token_file=str(token)
    )
    async with Service(remote) as running, running.client() as client:
        refused = await claim(client, "before-the-signer")
        assert refused.status_code == 503 and refused.json()["code"] == "unavailable", refused.text
        assert refused.json()["incident"].startswith("inc_")
        ready = await client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["log"] == "log_not_checked"
        signer_args = ("log-signer", "--generate-key", "--key", str(tmp_path / "key"), "--state")
        with cli_process(
            *signer_args,
            str(tmp_path / "state"),
            "--token-file",
            str(token),
            "--listen-port",
            str(port),
            env=env,
        ):
            granted = await until(
                lambda: claim(client, "before-the-signer"),
                "the claim once a pass reached the signer",
                holds=lambda r: r.status_code != 503,
            )
            assert granted.status_code == 201, granted.text
            assert (await client.get("/readyz")).status_code == 200


async def test_signer_process_and_witness_cosign_the_checkpoint(settings: Settings, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_LEDGER_")}
    key = tmp_path / "signer" / "key"
    token = tmp_path / "signer-token"
    token.write_text(secrets.token_hex(32) + "\n")
    signer_port, witness_port = free_port(), free_port()
    signer_args = (
        "log-signer",
        "--generate-key",
        "--key",
        str(key),
        "--state",
        str(tmp_path / "signer-state"),
        "--token-file",
        str(token),
    )
    with cli_process(*signer_args, "--listen-port", str(signer_port), env=env) as started:
        assert started["prefix"] == "effect-ledger.local"
        url = started["log_signer"]
        async with httpx.AsyncClient() as anonymous:  # nothing without the shared token
            assert (await anonymous.get(f"{url}/v1/state")).status_code == 401
        tokened = ("--log-signer-url", url, "--log-signer-token-file", str(token))
        vkey = json.loads(cli("log-key", "--tenant", "t1", *tokened, env=env).stdout)
        assert vkey["origin"] == "effect-ledger.local/t1"
        witness_args = ("witness", "--port", str(witness_port), "--state", str(tmp_path / "witness"))
        with cli_process(*witness_args, "--key", str(tmp_path / "wkey"), "--log", vkey["vkey"], env=env) as w:
            witnesses = json.dumps([{"url": w["witness"], "vkey": w["vkey"]}])
            remote = log_settings(
                settings,
                tmp_path,
                log_signer_url=url,
                log_signer_token_file=str(token),
                log_witnesses=witnesses,
            )
            async with Service(remote) as running, running.client() as client:
                await committed(client, "op-0")
                await wait_for_size(client, 1)
                key_view = (await get(client, "/v1/log/key", **AUDITOR)).json()
                assert key_view == {
                    "origin": "effect-ledger.local/t1",
                    "vkey": vkey["vkey"],
                    "witnesses": [{"name": w["vkey"].split("+")[0], "vkey": w["vkey"]}],
                    "quorum": 1,
                }

                async def cosigned() -> str:
                    r = await get(client, "/v1/log/proof", {"operation_id": "op-0"}, **AUDITOR)
                    return r.text if r.text.count("\u2014") == 2 else ""

                text = await until(cosigned, "a proof with the witness cosignature")
                receipt = (await get(client, "/v1/operations/op-0", **AUDITOR)).json()["receipt"]
                verified = verify_proof(text, vkey["vkey"], [w["vkey"]], receipt=receipt)
                assert verified.cosigned_by == (w["vkey"].split("+")[0],)
                for i in range(1, 4):
                    await committed(client, f"op-{i}")
                await wait_for_size(client, 4)
                text = await until(
                    lambda: get(client, "/v1/log/checkpoint", **AUDITOR), "a cosigned size 4",
                    holds=lambda r: r.text.count("\u2014") == 2,
                )  # fmt: skip
        state = json.loads((tmp_path / "witness" / "state.json").read_text())
        assert state["effect-ledger.local/t1"]["size"] == 4
        # a database behind this signer (its log state rolled back as a restore would), and the loss
        # accepted from the service's side: a remote signer records a loss only on its own host, and
        # log-recover says so as a refusal, exit 1 (until round 36, a traceback)
        async with superuser(settings.database_url or "") as admin:
            await admin.execute("UPDATE ledger.log_state SET size = 0 WHERE tenant_id = 't1'")
        recover_env = env | {"EFFECT_LEDGER_DATABASE_URL": settings.database_url or ""}
        refused = cli("log-recover", "--accept-loss", "--reason", "drill", *tokened, env=recover_env)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
        answer = json.loads(refused.stderr.strip().splitlines()[-1])
        assert answer["log_recover"] == "refused" and "log-signer --accept-loss" in answer["reason"], answer


async def test_a_checkpoint_signed_at_start_up_reaches_the_witnesses(
    settings: Settings, tmp_path: Path
) -> None:
    """serve's first checkpointer pass runs before it takes requests and does not wait for witnesses;
    what it signs goes to them with the next pass. Here the log was integrated to size 3 but not signed
    when the last service stopped: the new one signs size 3 at start-up, and the witness cosigns it
    with no further commit. Until round 20 a checkpoint signed at start-up was offered to no witness
    until the log grew again."""
    from effect_ledger.db.maintenance import owner_connection

    async with Service(settings) as off, off.client() as client:  # the log off
        for i in range(3):
            await committed(client, f"op-{i}")
    conn = await owner_connection(settings)
    try:
        assert await receipt_log.integrate(conn, 10, receipt_log.LogGuard()) == "done"
        assert await conn.fetchval("SELECT size FROM ledger.log_state WHERE tenant_id = 't1'") == 3
        assert await conn.fetchval("SELECT count(*) FROM ledger.log_checkpoints") == 0
    finally:
        await conn.close()
    _vkey, witness_args, env = await witness_for(settings, tmp_path)
    with cli_process(*witness_args, env=env) as w:
        witnessed = log_settings(
            settings, tmp_path, log_witnesses=json.dumps([{"url": w["witness"], "vkey": w["vkey"]}])
        )
        async with Service(witnessed) as running, running.client() as client:
            note = await cosigned(client, "size 3 cosigned by the witness")
            assert parse_checkpoint(parse_note(note.text).text).size == 3


async def test_a_checkpoint_a_witness_missed_is_offered_again_until_it_is_cosigned(
    settings: Settings, tmp_path: Path
) -> None:
    """A witness that is down when a checkpoint is signed cosigns it once it is back, with no further
    commit: the service offers a checkpoint some witness did not cosign again (after 1 s, then after
    twice the wait each time). Until round 21 it was offered once: an idle log kept an uncosigned
    checkpoint, and proofs no quorum accepts, until it grew again."""
    vkey, witness_args, env, witness = await a_witness_down(settings, tmp_path)
    witnessed = log_settings(settings, tmp_path, log_witnesses=json.dumps([witness]))
    async with Service(witnessed) as running, running.client() as client:
        await signed_alone(client)
        with cli_process(*witness_args, env=env):
            note = await cosigned(client, "size 1 cosigned once the witness is back", within=30)
        assert parse_checkpoint(parse_note(note.text).text).size == 1
        proof = (await get(client, "/v1/log/proof", {"operation_id": "op-0"}, **AUDITOR)).text
        assert verify_proof(proof, vkey, [witness["vkey"]]).cosigned_by == (witness["vkey"].split("+")[0],)


async def test_a_checkpoint_a_witness_missed_before_a_restart_is_offered_after_it(
    settings: Settings, tmp_path: Path
) -> None:
    """The witness is down when size 1 is signed, and the service restarts (a deploy) before it is
    back: the new service offers every tenant's latest checkpoint to the witnesses that have not
    cosigned it, so size 1 is cosigned with no further commit. Until round 24 the offers to retry lived
    in the stopped process's memory, and the checkpoint stayed uncosigned until the log grew."""
    _, witness_args, env, witness = await a_witness_down(settings, tmp_path)
    witnessed = log_settings(settings, tmp_path, log_witnesses=json.dumps([witness]))
    async with Service(witnessed) as running, running.client() as client:
        await signed_alone(client)
    with cli_process(*witness_args, env=env):
        async with Service(witnessed) as running, running.client() as client:
            note = await cosigned(client, "size 1 cosigned after the restart")
    assert parse_checkpoint(parse_note(note.text).text).size == 1


async def test_a_receipt_keeps_its_proof_while_a_witness_misses_many_checkpoints(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proof looks through at most COSIGNED_LOOKBACK checkpoints for one the quorum cosigned; with a
    witness down for more checkpoints than that, only those with cosignatures count. Until round 24
    the newest ones, all uncosigned, hid op-0's cosigned checkpoint and its proof was 409 (at the
    default LOG_CHECKPOINT_SECONDS, after about five minutes of a witness outage under steady commits).
    The lookback is made 2 here, for three checkpoints after the outage began."""

    monkeypatch.setattr(receipt_log, "COSIGNED_LOOKBACK", 2)
    vkey, witness_args, env = await witness_for(settings, tmp_path)
    with contextlib.ExitStack() as up:
        w = up.enter_context(cli_process(*witness_args, env=env))
        witness = {"url": w["witness"], "vkey": w["vkey"]}
        witnessed = log_settings(settings, tmp_path, log_witnesses=json.dumps([witness]))
        async with Service(witnessed) as running, running.client() as client:
            await committed(client, "op-0")
            await until(
                lambda: get(client, "/v1/log/proof", {"operation_id": "op-0"}, **AUDITOR),
                "op-0 provable",
                holds=lambda r: r.status_code == 200,
            )
            up.close()  # the witness stops
            for i in range(1, 4):
                await committed(client, f"op-{i}")
                await wait_for_size(client, i + 1)
            r = await get(client, "/v1/log/proof", {"operation_id": "op-0"}, **AUDITOR)
            assert r.status_code == 200, r.text
            verified = verify_proof(r.text, vkey, [witness["vkey"]], 1)
            assert (verified.index, verified.size) == (0, 1)


async def test_a_witness_that_never_answers_holds_up_no_checkpoint(
    settings: Settings, tmp_path: Path
) -> None:
    """Offers to the witnesses run apart from the checkpoints: while a witness that accepts and never
    answers holds the offer of size 1 (cut by the client after 5 s), size 2 is signed. Until round 24
    the checkpointer offered each checkpoint inline, and the next one waited the silent witness out (5
    s a witness and a tenant, every pass: API.md promises a checkpoint within LOG_CHECKPOINT_SECONDS
    plus one batch)."""
    async with silent_witness() as (witness, closed_by_the_service):
        witnessed = log_settings(
            settings, tmp_path, log_witnesses=json.dumps([witness]), log_witness_quorum=0
        )
        async with Service(witnessed) as running, running.client() as client:
            await committed(client, "op-0")
            await wait_for_size(client, 1)
            await committed(client, "op-1")
            await wait_for_size(client, 2)
            assert closed_by_the_service == []  # the offer of size 1 still hangs


async def test_a_proof_goes_against_the_newest_checkpoint_the_quorum_cosigned(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """API.md section 14: the proof file carries "the cosigned checkpoint it proves against". With the
    witness down after size 1 was cosigned, size 2 is signed but not cosigned: op-0's proof goes against
    the cosigned size 1 (and verifies with the quorum), op-1's is 409 not_yet_logged with Retry-After
    until the witness is back and cosigns size 2. Until round 23 both were proved against the newest
    checkpoint, cosigned or not: proof files that `effect-ledger-verify --quorum 1` refuses."""

    vkey, witness_args, env = await witness_for(settings, tmp_path)
    with contextlib.ExitStack() as up:  # the witness, up for size 1 only
        w = up.enter_context(cli_process(*witness_args, env=env))
        witness = {"url": w["witness"], "vkey": w["vkey"]}
        witnessed = log_settings(settings, tmp_path, log_witnesses=json.dumps([witness]))
        async with Service(witnessed) as running, running.client() as client:
            await committed(client, "op-0")
            await cosigned(client, "size 1 cosigned")
            up.close()  # the witness stops
            await committed(client, "op-1")
            await wait_for_size(client, 2)
            assert (await get(client, "/v1/log/checkpoint", **AUDITOR)).text.count("\u2014") == 1
            older = await get(client, "/v1/log/proof", {"operation_id": "op-0"}, **AUDITOR)
            assert older.status_code == 200, older.text
            verified = verify_proof(older.text, vkey, [witness["vkey"]], 1)
            assert (verified.index, verified.size) == (0, 1)
            assert verified.cosigned_by == (witness["vkey"].split("+")[0],)
            newer = await get(client, "/v1/log/proof", {"operation_id": "op-1"}, **AUDITOR)
            assert newer.status_code == 409, newer.text
            assert newer.json()["code"] == "not_yet_logged"
            assert "quorum" in newer.json()["detail"]
            assert int(newer.headers["Retry-After"]) >= 1
            # a cosignature line written into the database by hand, in the witness's name, counts for nothing
            # (the witness's name and key ID, then a timestamp and a signature no key made)
            real = parse_vkey(witness["vkey"])
            line = Signature(real.name, real.key_id, secrets.token_bytes(8 + 64)).line
            async with superuser(db_url) as admin:
                await admin.execute(
                    "UPDATE ledger.log_checkpoints SET cosignatures = $1 WHERE tenant_id = 't1' AND size = 2",
                    line,
                )
            forging = await get(client, "/v1/log/proof", {"operation_id": "op-1"}, **AUDITOR)
            assert forging.status_code == 409, forging.text
            served = (await get(client, "/v1/log/checkpoint", **AUDITOR)).text
            assert served.count("\u2014") == 1 and line not in served  # nor is it served with the checkpoint
            with cli_process(*witness_args, env=env):  # back: it cosigns size 2
                proved = await until(
                    lambda: get(client, "/v1/log/proof", {"operation_id": "op-1"}, **AUDITOR),
                    "op-1 proved against a cosigned checkpoint",
                    holds=lambda r: r.status_code == 200,
                    within=30,
                )
            verified = verify_proof(proved.text, vkey, [witness["vkey"]], 1)
            assert (verified.index, verified.size) == (1, 2)
            async with superuser(db_url) as admin:  # the forged line was dropped when the witness cosigned
                kept = await admin.fetchval(
                    "SELECT cosignatures FROM ledger.log_checkpoints WHERE tenant_id = 't1' AND size = 2"
                )
            assert line not in kept and kept.count("\u2014") == 1


async def test_a_witness_that_never_answers_does_not_hold_up_the_start(
    settings: Settings, tmp_path: Path
) -> None:
    """The checkpoint signed at start-up goes to the witnesses only once serve is serving: a witness
    that accepts and never answers (each request cut by the client after 5 s) is still holding its
    first connection when the service takes its first claim. Until round 20 the start-up pass would
    have waited it out, 5 s per witness and tenant, before serving (once it offered start-up
    checkpoints to the witnesses at all)."""
    from effect_ledger.db.maintenance import owner_connection

    async with Service(settings) as off, off.client() as client:  # the log off
        await committed(client, "op-0")
    conn = await owner_connection(settings)
    try:
        assert await receipt_log.integrate(conn, 10, receipt_log.LogGuard()) == "done"
    finally:
        await conn.close()
    async with silent_witness() as (witness, closed_by_the_service):
        witnessed = log_settings(settings, tmp_path, log_witnesses=json.dumps([witness]))
        async with Service(witnessed) as running, running.client() as client:
            assert (await claim(client, "op-1")).status_code == 201
            assert closed_by_the_service == []
            assert (
                parse_checkpoint(
                    parse_note((await get(client, "/v1/log/checkpoint", **AUDITOR)).text).text
                ).size
                == 1
            )


EDITED_BEFORE_LOGGED = {
    "receipt": TAMPERS["receipt"][0].replace("op-2", "op-1"),
    # any hash, well formed or not (the column is text since migration 0017): the leaf would record it
    "chain head": "UPDATE ledger.operations SET chain_hash = repeat('a', 64)"
    " WHERE tenant_id = 't1' AND operation_id = 'op-1'",
    "chain head, not hex": "UPDATE ledger.operations SET chain_hash = 'forged'"
    " WHERE tenant_id = 't1' AND operation_id = 'op-1'",
    # marked purged with its body kept: not the purge racing a pass (that waits without a refusal), an edit
    "half purged": "UPDATE ledger.operations SET purged_seq = 1, purged_hash = repeat('a', 64)"
    " WHERE tenant_id = 't1' AND operation_id = 'op-1'",
    # the committing event's attempt alone (its hash kept, the append-only trigger off): the hash still
    # holds over the row's attempt, so only the head's attempt against the row's tells (round 34)
    "head's attempt": "SET session_replication_role = replica; UPDATE ledger.events SET attempt = 2"
    " WHERE tenant_id = 't1' AND operation_id = 'op-1' AND seq = 2",
}


@pytest.mark.storage
@pytest.mark.parametrize(
    "what",
    [
        # on Citus: the receipt and the purge columns; the chain head cases edit the same row
        pytest.param(what, marks=() if what in ("receipt", "half purged") else pytest.mark.storage_repeat)
        for what in sorted(EDITED_BEFORE_LOGGED)
    ],
)
async def test_a_receipt_edited_before_it_was_logged_never_enters_the_log(
    what: str, settings: Settings, db_url: str, tmp_path: Path
) -> None:
    async with Service(settings) as off, off.client() as client:  # the log is not running yet
        for i in range(3):
            await committed(client, f"op-{i}")
    async with superuser(db_url) as admin:
        assert await admin.execute(EDITED_BEFORE_LOGGED[what]) == "UPDATE 1"
    async with Service(log_settings(settings, tmp_path)) as running, running.client() as client:
        await until(lambda: refusals(running, "receipt_mismatch"), "the edited receipt refused", within=60)
        await wait_for_size(client, 1)  # op-0 only: op-1's chain does not record what its row says
        await asyncio.sleep(1.5)
        assert await size_of(client) == 1
        r = await get(client, "/v1/log/proof", {"operation_id": "op-1"}, **AUDITOR)
        assert r.status_code == 409 and r.json()["code"] == "not_yet_logged"


# An event edited before its receipt is logged, as only an attacker could (the append-only triggers off).
EVENT_EDIT = (
    "UPDATE ledger.events SET data = jsonb_set(data, '{forged}', 'true')"
    " WHERE tenant_id = 't1' AND operation_id = 'op-1' AND seq = $1"
)


@pytest.mark.storage
async def test_the_integrator_checks_each_head_and_leaves_earlier_events_to_the_chain_it_commits_to(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """Round 31: the integrator reads each committed operation's head event (with its row in log_batch
    since round 34), not its whole chain, and checks it (its own hash, the row's head and commit hash,
    the receipt it recorded). The committing event edited before the receipt is logged: refused, never logged. The claim event
    edited: logged, because the leaf's chain_hash is the head's hash, which commits to the claim
    event's original hash through its prev_hash: /v1/audit/verify names the edited seq, and the logged
    chain_hash is still the one the unedited chain ends at."""
    async with Service(settings) as off, off.client() as client:  # the log is not running yet
        for i in range(3):
            await committed(client, f"op-{i}")  # claim (seq 1), complete (seq 2)
        head = (await get(client, "/v1/operations/op-1/events", **AUDITOR)).json()["items"][-1]["hash"]
    async with superuser(db_url) as admin, admin.transaction():
        await admin.execute("SET LOCAL session_replication_role = replica")
        assert await admin.execute(EVENT_EDIT, 2) == "UPDATE 1"
    async with Service(log_settings(settings, tmp_path)) as running, running.client() as client:
        await until(lambda: refusals(running, "receipt_mismatch"), "the edited head refused", within=60)
        await wait_for_size(client, 1)  # op-0 only
        await asyncio.sleep(1.5)
        assert await size_of(client) == 1
    async with superuser(db_url) as admin, admin.transaction():
        await admin.execute("SET LOCAL session_replication_role = replica")
        await admin.execute(
            "UPDATE ledger.events SET data = data - 'forged'"
            " WHERE tenant_id = 't1' AND operation_id = 'op-1' AND seq = 2"
        )
        assert await admin.execute(EVENT_EDIT, 1) == "UPDATE 1"
    async with Service(log_settings(settings, tmp_path)) as running, running.client() as client:
        await wait_for_size(client, 3)
        assert refused_reasons(running) == set()
        proof = (await get(client, "/v1/log/proof", {"operation_id": "op-1"}, **AUDITOR)).text
        leaf = json.loads(parse_proof_file(proof).extra or b"")
        assert leaf["chain_hash"] == head
        r = await get(client, "/v1/audit/verify", {"operation_id": "op-1"}, **AUDITOR)
        assert r.json() == {"ok": False, "checked": 1, "first_bad_seq": 1}


async def test_the_integrator_reads_one_event_per_usual_operation_and_every_event_of_the_rest(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """The head suffices for a committed operation whose chain ends at its commit; one with a
    conflicting report after the commit (a `discrepancy` event moves the head) is judged by its whole
    chain (log_batch_chains), and logged."""
    from effect_ledger.db.maintenance import owner_connection

    await commit_with_a_discrepancy(settings)
    conn = await owner_connection(settings)
    try:
        observed = CountingConnection(conn)
        assert await receipt_log.integrate_tenant(observed, "t1", 10) == 3  # type: ignore[arg-type]
        assert [name for name in observed.sent if name.startswith("log_batch")] == [
            "log_batch",  # the rows with their head events, in one statement (round 34)
            "log_batch_chains",
        ]
        assert observed.ids_sent("log_batch_chains") == [["op-1"]]
    finally:
        await conn.close()


def test_the_signer_answers_only_the_shared_token(tmp_path: Path) -> None:
    """LOG_SIGNER_TOKEN_FILE: with a token the signer answers no request without it (a wrong one, none,
    another scheme: 401, nothing signed or read); without one it refuses to listen beyond loopback;
    a short token file stops the service's settings, naming the file and not its content."""
    key = tmp_path / "key"
    create_key(key, "effect-ledger.local")
    token = secrets.token_hex(32)
    server = serve_signer(FileSigner(key, tmp_path / "state"), "127.0.0.1", 0, token)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        for headers in ({}, {"Authorization": f"Bearer {token[:-1]}x"}, {"Authorization": f"Basic {token}"}):
            for method, path in (("GET", "/v1/state"), ("GET", "/v1/key?origin=o/t1"), ("POST", "/v1/sign")):
                r = httpx.request(method, url + path, headers=headers, json={})
                assert (r.status_code, r.json()) == (401, {"reason": "unauthorized"}), (headers, path)
        with pytest.raises(SignRefused) as refused:
            asyncio.run(RemoteSigner(url, token="y" * 64).states())
        assert refused.value.reason == "unauthorized" and "y" * 32 not in str(refused.value)
        assert asyncio.run(RemoteSigner(url, token=token).states()) == {}
        vkey = asyncio.run(RemoteSigner(url, token=token).vkey("effect-ledger.local/t1"))
        assert vkey.startswith("effect-ledger.local/t1+")
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ValueError, match="needs a token"):
        serve_signer(FileSigner(key, tmp_path / "state"), "0.0.0.0", 0)  # noqa: S104
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_LEDGER_")}
    everywhere = "0.0.0.0"  # noqa: S104 -- the address it must refuse without a token
    args = ("log-signer", "--key", str(key), "--state", str(tmp_path / "s"), "--listen-host", everywhere)
    run = subprocess.run([str(CLI), *args], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "needs a token" in run.stderr, run.stderr
    short = tmp_path / "short-token"
    short.write_text("s3cr3t-but-short")
    with pytest.raises(SettingsError) as bad:
        Settings.from_env({}, log_signer_token_file=str(short))
    assert "shorter than 32" in str(bad.value) and "s3cr3t" not in str(bad.value)
