"""The verifiable receipts log end to end (API.md section 14): receipts committed through the API enter
each tenant's log in feed order, checkpoints are signed by the in-process signer, and everything is
checked offline with the domain's verifier: proof files, roots recomputed from the served tiles,
entry bundles against level-0 tiles, consistency between checkpoints, tenant isolation."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import asyncpg
import httpx
import pytest

from effect_ledger.db.maintenance import purge
from effect_ledger.domain import merkle, tiles
from effect_ledger.domain.note import Signer, parse_checkpoint, parse_note
from effect_ledger.domain.receipt_log import verify_proof
from effect_ledger.settings import Settings
from support.auth import auth, token
from support.console import signed_in
from support.ledger import AUDITOR, CLAIM, RECEIPT, call, claim, committed, get, owner, resolve, wait_for_size
from support.receipt_log import (
    commit_with_a_discrepancy,
    integrate_twice,
    log_settings,
    purge_beside_the_next_check,
)
from support.server import Service
from support.waiting import until

# the Citus lane of .ci/run runs it again on a cluster (the log's statements must be ones Citus takes: an
# UPDATE of a distributed table with clock_timestamp() stopped every integration pass there until round 14)
pytestmark = [pytest.mark.timeout(180), pytest.mark.storage]
VERIFY = Path(sys.executable).with_name("effect-ledger-verify")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


@pytest.fixture
async def logged(settings: Settings, tmp_path: Path) -> AsyncIterator[Service]:
    async with Service(log_settings(settings, tmp_path)) as running:
        yield running


async def tile(client: httpx.AsyncClient, ref: tiles.TileRef, tenant: str = "t1") -> httpx.Response:
    return await get(client, "/v1/log/" + tiles.tile_path(ref), tenant=tenant, **AUDITOR)


async def test_the_write_answers_carry_the_log_index_as_the_reads_do(logged: Service) -> None:
    """API.md section 5: "Every endpoint that returns an operation returns this object"; section 14:
    "The operation view of a logged receipt carries `"log_index": i` (else `null`)". Until migration
    0027 only the reads carried it: a reuse_receipt claim, a repeated complete or resolve and a
    refusal showing a committed operation answered the view without the member."""
    async with logged.client() as client:
        first = await claim(client, "w-0")
        assert (first.status_code, first.json()["operation"]["log_index"]) == (201, None), first.text
        token = first.json()["claim"]["token"]
        report = {"token": token, "outcome": "committed", "receipt": RECEIPT}
        done = await call(client, "w-0", "complete", report)
        assert (done.status_code, done.json()["log_index"]) == (200, None), done.text  # not logged yet
        await committed(client, "w-1")
        await wait_for_size(client, 2)
        view = (await get(client, "/v1/operations/w-1", **AUDITOR)).json()
        assert view["log_index"] == 1
        again = await claim(client, "w-1")
        assert again.status_code == 200 and again.json()["action"] == "reuse_receipt", again.text
        assert again.json()["operation"] == view  # the same view as the read, log_index included
        repeat = await call(client, "w-0", "complete", report)
        assert (repeat.status_code, repeat.json()["log_index"]) == (200, 0), repeat.text
        late = await call(client, "w-0", "submit", {"token": token})
        assert late.status_code == 409 and late.json()["operation"]["log_index"] == 0, late.text
        conflict = await call(
            client,
            "w-0",
            "complete",
            {"token": token, "outcome": "not_applied", "reason": {"category": "other"}},
        )
        assert conflict.status_code == 409 and conflict.json()["code"] == "conflicting_outcome", conflict.text
        assert conflict.json()["operation"]["log_index"] == 0
        resolved = await resolve(client, "w-1", "committed", receipt=RECEIPT)
        assert (resolved.status_code, resolved.json()["log_index"]) == (200, 1), resolved.text  # a repeat


async def test_receipts_are_logged_in_feed_order_and_verify_offline(logged: Service, tmp_path: Path) -> None:
    async with logged.client() as client:
        ops = [f"op-{i:03d}" for i in range(300)]
        for op in ops:
            await committed(client, op, receipt={"external_ref": f"ref-{op}", "result": {"n": op}})
        await committed(client, "other-1", tenant="t2")
        note = await wait_for_size(client, len(ops))
        key = (await get(client, "/v1/log/key", **AUDITOR)).json()
        assert key["origin"] == "effect-ledger.local/t1" and key["witnesses"] == [] and key["quorum"] == 0
        assert key["vkey"].startswith("effect-ledger.local/t1+")
        cp = parse_checkpoint(parse_note(note).text)
        assert cp.origin == key["origin"]

        # the feed's order is the log's order
        feed = (await get(client, "/v1/receipts", {"limit": 500}, **AUDITOR)).json()["items"]
        assert [item["operation_id"] for item in feed] == ops

        # every proof file verifies offline, with the receipt as the operation view shows it
        for index, op in enumerate(ops):
            r = await get(client, "/v1/log/proof", {"operation_id": op}, **AUDITOR)
            assert r.status_code == 200, r.text
            view = (await get(client, f"/v1/operations/{op}", **AUDITOR)).json()
            assert view["log_index"] == index
            verified = verify_proof(r.text, key["vkey"], receipt=view["receipt"])
            assert (verified.index, verified.size, verified.operation_id) == (index, len(ops), op)
            leaf = json.loads(base64.b64decode(r.text.split("\n")[1].split(" ", 1)[1]))
            assert set(leaf) == {
                "v", "tenant", "operation_id", "index", "principal", "tool", "tool_version",
                "intent_digest", "attempt", "receipt_digest", "chain_hash", "committed_at", "salt",
            }  # fmt: skip
            assert "ref-" not in json.dumps(leaf)  # digests only, never the receipt's content

        # roots recomputed from the served tiles; bundles hash to the level-0 tiles
        store: dict[tuple[int, int], bytes] = {}
        for ref in tiles.layout(cp.size):
            r = await tile(client, ref)
            assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
            assert ("immutable" in r.headers["cache-control"]) == (not ref.partial)
            store[(ref.level, ref.index)] = r.content
        assert merkle.tree_root(cp.size, lambda nodes: tiles.read_nodes(nodes, store)) == cp.root
        bundles = [
            await tile(client, tiles.TileRef(tiles.ENTRIES, 0, 256)),
            await tile(client, tiles.TileRef(tiles.ENTRIES, 1, 44)),
        ]
        entries = [e for b in bundles for e in tiles.decode_bundle(b.content)]
        assert [json.loads(e)["operation_id"] for e in entries] == ops
        level0 = store[(0, 0)] + store[(0, 1)]
        assert b"".join(merkle.leaf_hash(e) for e in entries) == level0

        # a full tile is not served as partial beyond what exists, and bad paths are 404
        assert (await tile(client, tiles.TileRef(0, 1, 45))).status_code == 404
        assert (await tile(client, tiles.TileRef(0, 1, 256))).status_code == 404
        assert (await get(client, "/v1/log/tile/0/1", **AUDITOR)).status_code == 404
        assert (await get(client, "/v1/log/tile/0/001.p/3", **AUDITOR)).status_code == 200

        # another tenant: its own log; t1's operation is not found there, t1's tiles are not served
        await wait_for_size(client, 1, "t2")
        r = await get(client, "/v1/log/proof", {"operation_id": "op-001"}, tenant="t2", **AUDITOR)
        assert r.status_code == 404 and r.json()["code"] == "not_found"
        assert (await tile(client, tiles.TileRef(0, 0, 2), tenant="t2")).status_code == 404
        t2key = (await get(client, "/v1/log/key", tenant="t2", **AUDITOR)).json()
        t2proof = (
            await get(client, "/v1/log/proof", {"operation_id": "other-1"}, tenant="t2", **AUDITOR)
        ).text
        assert verify_proof(t2proof, t2key["vkey"]).tenant == "t2"

        # the log grows: consistency from the old checkpoint to the new one
        for i in range(5):
            await committed(client, f"late-{i}")
        new_note = await wait_for_size(client, len(ops) + 5)
        new = parse_checkpoint(parse_note(new_note).text)
        r = await get(client, "/v1/log/consistency", {"from": cp.size}, **AUDITOR)
        assert r.status_code == 200
        proof = [base64.b64decode(line) for line in r.text.splitlines()]
        assert merkle.verify_consistency(cp.size, new.size, cp.root, new.root, proof)
        bad = await get(client, "/v1/log/consistency", {"from": new.size + 1}, **AUDITOR)
        assert bad.status_code == 422 and bad.json()["code"] == "validation_failed"
        # the auditor checks offline that the log only grew between the two checkpoints it kept
        r = await get(client, "/v1/log/consistency", {"from": cp.size, "to": new.size}, **AUDITOR)
        files = {"old.checkpoint": note, "new.checkpoint": new_note, "consistency": r.text}
        for name, text in files.items():
            (tmp_path / name).write_text(text)
        check = [str(VERIFY), "--consistency", *(str(tmp_path / n) for n in files), "--vkey", key["vkey"]]
        ok = run(*check)
        assert (ok.returncode, ok.stdout) == (
            0,
            f"OK effect-ledger.local/t1 size {cp.size} -> {new.size}: append-only (witnesses: none)\n",
        ), ok
        lines = r.text.splitlines()
        (tmp_path / "consistency").write_text("\n".join([lines[-1], *lines[:-1]]) + "\n")  # reordered
        bad_run = run(*check)
        assert bad_run.returncode == 1 and "does not lead from size" in bad_run.stderr, bad_run
        swapped = run(
            str(VERIFY),
            "--consistency",
            *(str(tmp_path / n) for n in ("new.checkpoint", "old.checkpoint", "consistency")),
            "--vkey",
            key["vkey"],
        )
        assert swapped.returncode == 1 and "smaller than the old one's" in swapped.stderr, swapped


@pytest.mark.storage_repeat  # the scopes and the 409 over the log's reads: the endpoints' own reads run on Citus in the tests around it
async def test_scopes_missing_and_not_yet_logged(settings: Settings, tmp_path: Path) -> None:
    quiet = log_settings(settings, tmp_path)
    async with Service(replace(quiet, log_checkpoint_seconds=3600)) as running, running.client() as client:
        await committed(client, "first")
        await wait_for_size(client, 1)  # the first checkpoint comes at once; the next one in an hour
        await committed(client, "second")
        view = await until(
            lambda: get(client, "/v1/operations/second", **AUDITOR),
            "second committed",
            holds=lambda r: r.status_code == 200,
        )
        assert view.json()["log_index"] is None
        r = await get(client, "/v1/log/proof", {"operation_id": "second"}, **AUDITOR)
        assert r.status_code == 409 and r.json()["code"] == "not_yet_logged"
        assert int(r.headers["retry-after"]) >= 1
        r = await get(client, "/v1/log/proof", {"operation_id": "never"}, **AUDITOR)
        assert r.status_code == 404
        # the auditor's session: key and proof fetched, then verified offline by effect-ledger-verify
        (tmp_path / "key.json").write_text((await get(client, "/v1/log/key", **AUDITOR)).text)
        proof = (await get(client, "/v1/log/proof", {"operation_id": "first"}, **AUDITOR)).text
        (tmp_path / "first.tlog-proof").write_text(proof)
        view = (await get(client, "/v1/operations/first", **AUDITOR)).json()
        (tmp_path / "receipt.json").write_text(json.dumps(view["receipt"]))
        verify = [str(VERIFY), str(tmp_path / "first.tlog-proof"), "--vkey", str(tmp_path / "key.json")]
        ok = run(*verify, "--receipt", str(tmp_path / "receipt.json"))
        assert ok.returncode == 0 and ok.stdout.startswith("OK effect-ledger.local/t1 index 0 of 1"), ok
        (tmp_path / "view.json").write_text(json.dumps(view))  # the operation view saved whole
        assert run(*verify, "--receipt", str(tmp_path / "view.json")).returncode == 0
        shown = view["receipt"]
        # the receipt file is hashed as given: a member changed, added or dropped is another digest
        for forged in (
            {**shown, "external_ref": "other"},
            {**shown, "amount": 999},
            {k: v for k, v in shown.items() if k != "observed_at"},
            {"receipt": shown, "external_ref": "other"},  # not a view: hashed as it is
        ):
            (tmp_path / "receipt.json").write_text(json.dumps(forged))
            bad = run(*verify, "--receipt", str(tmp_path / "receipt.json"))
            assert bad.returncode == 1 and "receipt_digest" in bad.stderr, (forged, bad)
        # a receipt file holding `null` (what `jq .receipt` saves from a failed read) checks nothing:
        # a failure (until round 36, OK); a file that is not UTF-8 text and a key file without "vkey"
        # fail with their reason, not a traceback
        (tmp_path / "receipt.json").write_text("null\n")
        empty = run(*verify, "--receipt", str(tmp_path / "receipt.json"))
        assert (empty.returncode, empty.stderr) == (
            1,
            "FAILED: the receipt file holds no receipt (null), so nothing was checked\n",
        ), empty
        (tmp_path / "binary.tlog-proof").write_bytes(b"\xff\xfe" + proof.encode())
        binary = run(str(VERIFY), str(tmp_path / "binary.tlog-proof"), "--vkey", str(tmp_path / "key.json"))
        assert (binary.returncode, binary.stderr) == (1, "FAILED: the proof file is not UTF-8 text\n"), binary
        (tmp_path / "nokey.json").write_text('{"origin": "effect-ledger.local/t1"}')
        nokey = run(str(VERIFY), str(tmp_path / "first.tlog-proof"), "--vkey", str(tmp_path / "nokey.json"))
        assert (nokey.returncode, nokey.stderr) == (1, 'FAILED: the key file has no "vkey"\n'), nokey
        # key.json pins the witnesses and the quorum too (the README's session): a witness pinned there
        # that did not cosign fails the check, as it would with --witness
        pinned = json.loads((tmp_path / "key.json").read_text())
        w1 = Signer("witness.example/w1", bytes(range(32))).verifier.vkey
        pinned |= {"witnesses": [{"name": "witness.example/w1", "vkey": w1}], "quorum": 1}
        (tmp_path / "pinned.json").write_text(json.dumps(pinned))
        unwitnessed = run(
            str(VERIFY), str(tmp_path / "first.tlog-proof"), "--vkey", str(tmp_path / "pinned.json")
        )
        assert unwitnessed.returncode == 1 and "quorum is 1" in unwitnessed.stderr, unwitnessed
        lowered = run(
            str(VERIFY),
            str(tmp_path / "first.tlog-proof"),
            "--vkey",
            str(tmp_path / "pinned.json"),
            "--quorum",
            "0",
        )
        assert lowered.returncode == 0, lowered
        r = await client.get("/v1/log/checkpoint", headers=auth(scope="ledger:execute"))
        assert r.status_code == 403
        assert (await client.get("/v1/log/checkpoint")).status_code == 401


async def edit_receipt(running: Service, operation_id: str) -> None:
    """As the database's superuser: a receipt's external_ref rewritten, nothing else."""
    async with owner(running.settings.database_url) as superuser:
        await superuser.execute(
            "UPDATE ledger.operations SET receipt = jsonb_set(receipt, '{external_ref}', '\"x\"')"
            " WHERE tenant_id = 't1' AND operation_id = $1",
            operation_id,
        )


@pytest.mark.storage_repeat  # the console's pages over the same reads as the endpoints
async def test_console_shows_the_log_index_its_proof_and_the_checkpoint(
    settings: Settings, tmp_path: Path
) -> None:
    async with Service(log_settings(settings, tmp_path)) as running, running.client() as client:
        for i in range(3):
            await committed(client, f"op-{i}")
        await wait_for_size(client, 3)
        await signed_in(client, token(scope="ledger:audit ledger:reconcile", sub="aud-1"))
        page = await client.get("/console/operations/op-2")
        assert page.status_code == 200
        assert '<dd id="log-index">2</dd>' in page.text
        assert "Its proof verifies against the current signed checkpoint" in page.text
        overview = await client.get("/console/")
        assert '<dd id="log-size">3</dd>' in overview.text
        assert "effect-ledger.local/t1" in overview.text and "none configured" in overview.text
        await edit_receipt(running, "op-1")  # as the superuser, after it was logged
        page = await client.get("/console/operations/op-1")
        assert "Its proof does not verify" in page.text and "receipt_digest" in page.text
        assert '<dd id="log-index">1</dd>' in page.text  # the index stays shown beside the failure
        await signed_in(client, token(scope="ledger:reconcile", sub="rec-1"))
        assert 'id="log-index"' not in (await client.get("/console/operations/op-2")).text  # audit only


@pytest.mark.storage_repeat  # the client's verification of what the endpoints answer
async def test_the_client_proves_a_receipt_and_the_logs_growth_against_pinned_keys(
    settings: Settings, tmp_path: Path
) -> None:
    from effect_ledger.client import LedgerClient, ProofInvalid
    from effect_ledger.domain.note import Signer
    from effect_ledger.domain.receipt_log import checkpoint_of

    async with Service(log_settings(settings, tmp_path)) as running, running.client() as client:
        for i in range(5):
            await committed(client, f"op-{i}")
        first = await wait_for_size(client, 5)
        async with LedgerClient(running.base_url, token(scope="ledger:audit", sub="aud-1")) as ledger:
            key = await ledger.log.key()  # pinned once, out of band; every check below uses it
            assert (key.origin, key.witnesses, key.quorum) == ("effect-ledger.local/t1", [], 0)
            proved = await ledger.log.prove_receipt("op-3", key.vkey)
            assert (proved.index, proved.size, proved.operation_id) == (3, 5, "op-3")
            kept = await ledger.log.proof("op-3")
            for i in range(5, 9):
                await committed(client, f"op-{i}")
            await wait_for_size(client, 9)
            current, grown = await ledger.log.prove_growth(kept, key.vkey)  # from the proof file's checkpoint
            assert (grown.origin, grown.old_size, grown.new_size) == (key.origin, 5, 9)
            assert checkpoint_of(current).size == 9 and current == await ledger.log.checkpoint()
            assert (await ledger.log.prove_growth(current, key.vkey))[1].old_size == 9  # nothing new
            assert (await ledger.log.consistency(5)).splitlines() == (
                await ledger.log.consistency(5, 9)
            ).splitlines()
            unpinned = Signer(key.origin, bytes(32)).verifier.vkey  # the origin's name, another key
            with pytest.raises(ProofInvalid, match="checkpoint not signed by the log key"):
                await ledger.log.prove_receipt("op-3", unpinned)
            with pytest.raises(ProofInvalid, match="old checkpoint not signed by the log key"):
                await ledger.log.prove_growth(first, unpinned)
            await edit_receipt(running, "op-3")  # as the superuser: the view no longer matches its leaf
            with pytest.raises(ProofInvalid, match="receipt_digest"):
                await ledger.log.prove_receipt("op-3", key.vkey)
            # a purged receipt's view shows none: nothing to check is a failure, not a pass (until
            # round 36 the receipt check was skipped and the proof alone answered Verified)
            async with owner(running.settings.database_url) as superuser:
                await superuser.execute(
                    "UPDATE ledger.operations SET updated_at = now() - interval '31 days'"
                    " WHERE tenant_id = 't1' AND operation_id = 'op-4'"
                )
            assert (await purge(running.settings)).counts["operations"] == 1
            with pytest.raises(ProofInvalid, match="shows no receipt for 'op-4'"):
                await ledger.log.prove_receipt("op-4", key.vkey)


async def test_a_pass_that_fills_its_batch_is_followed_at_once(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """`integrate` says whether a tenant filled its batch, and the integrator then runs its next pass at
    once: a backlog (receipts committed while the log was off) is logged at the integrator's speed, not
    one batch per LOG_INTEGRATE_INTERVAL_MS (here ten minutes, far beyond the wait below)."""
    from effect_ledger.db import receipt_log
    from effect_ledger.db.maintenance import owner_connection

    async with Service(replace(settings, rate_limit_per_second=0)) as off, off.client() as client:
        for i in range(15):
            await committed(client, f"direct-{i:02d}")
        for i in range(40):
            await committed(client, f"backlog-{i:02d}", tenant="t2")
    owner = await owner_connection(settings)
    try:
        guard = receipt_log.LogGuard()
        guard.behind = {"t2": (0, 0)}  # t2 is left for the integrator of the service below
        passes = [await receipt_log.integrate(owner, 10, guard) for _ in range(3)]
        assert passes == ["full", "done", "done"]  # 10 (a full batch), then 5, then nothing
        backlog = replace(
            log_settings(settings, tmp_path), log_batch_size=10, log_integrate_interval_ms=600_000
        )
        async with Service(backlog):
            await until(
                lambda: owner.fetch("SELECT tenant_id, size FROM ledger.log_state ORDER BY tenant_id"),
                "t2's backlog of 40 logged in passes of 10",
                holds=lambda rows: [(r["tenant_id"], r["size"]) for r in rows] == [("t1", 15), ("t2", 40)],
                within=60,
            )
    finally:
        await owner.close()


async def test_the_log_loops_open_new_connections_after_theirs_were_cut(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """The server cuts the integrator's and the checkpointer's owner connections (pg_terminate_backend,
    as a failover or an idle-session reaper would): their next passes open new ones (OwnerLink) and the
    log keeps growing and being signed. Until round 20 each loop kept the connection it opened at
    start-up and failed every later pass on it, until the service restarted."""
    cut_ours = (
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = 'effect-ledger-maintenance'"
    )
    async with (
        Service(log_settings(settings, tmp_path)) as running,
        running.client() as client,
        owner(db_url) as superuser,
    ):
        await committed(client, "before-the-cut")
        await wait_for_size(client, 1)
        assert await superuser.fetchval(cut_ours) >= 2  # the integrator's and the checkpointer's
        await committed(client, "after-the-cut")
        await wait_for_size(client, 2)


async def test_a_tenant_held_by_another_writer_is_tried_again_soon(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """A pass that finds a tenant's log state locked by another writer (the checkpointer signing, another
    replica's integrator) answers `held`, and the integrator comes back within HELD_RETRY_SECONDS, not
    after LOG_INTEGRATE_INTERVAL_MS (ten minutes here). Until round 14 a held tenant counted as caught
    up: the Citus lane's backlog test met the checkpointer's lock and waited out the interval."""
    from effect_ledger.db import receipt_log
    from effect_ledger.db.catalogue import sql
    from effect_ledger.db.maintenance import owner_connection

    async with Service(replace(settings, rate_limit_per_second=0)) as off, off.client() as client:
        for i in range(3):
            await committed(client, f"held-{i}")
    holder, owner = await owner_connection(settings), await owner_connection(settings)
    try:
        async with holder.transaction():
            await holder.fetchrow(sql("tenant_context"), "t1")
            await holder.execute(sql("log_open"), "t1")
        lock = holder.transaction()
        await lock.start()
        await holder.fetchrow(sql("tenant_context"), "t1")
        assert await holder.fetchrow(sql("log_lock"), "t1") is not None  # the other writer holds t1
        assert await receipt_log.integrate(owner, 10, receipt_log.LogGuard()) == "held"
        slow = replace(log_settings(settings, tmp_path), log_integrate_interval_ms=600_000)
        async with Service(slow):
            await asyncio.sleep(1.0)  # the service's integrator meets the held tenant meanwhile
            assert await owner.fetchval("SELECT size FROM ledger.log_state WHERE tenant_id = 't1'") == 0
            await lock.rollback()
            await until(
                lambda: owner.fetchval("SELECT size FROM ledger.log_state WHERE tenant_id = 't1'"),
                "the held tenant's receipts logged once it is free",
                holds=lambda size: size == 3,
                within=20,
            )
        assert await receipt_log.integrate(owner, 10, receipt_log.LogGuard()) == "done"
    finally:
        await holder.close()
        await owner.close()


async def test_concurrent_integrators_write_one_log_in_feed_order(
    settings: Settings, db_url: str, on_citus: bool
) -> None:
    from effect_ledger.db import receipt_log
    from effect_ledger.db.maintenance import owner_connection

    # the log is not running; 600 claims of one principal in a burst would meet the rate limit
    unlimited = replace(settings, rate_limit_per_second=0)
    async with Service(unlimited) as off, off.client() as client:
        ops = [f"op-{i:03d}" for i in range(600)]
        for op in ops:
            await committed(client, op)
    conns = [await owner_connection(settings) for _ in range(4)]
    try:

        async def integrator(conn: asyncpg.Connection) -> int:
            # Passes until one finds nothing left to append. A pass that meets the tenant held by
            # another integrator (None) returns at once, so a fixed number of passes each could run out
            # while the others' slow passes held it (seen once in round 18, in a loaded full run).
            total = 0
            for _ in range(2000):  # a bound, not a budget: 12 passes of 50 are all the work there is
                appended = await receipt_log.integrate_tenant(conn, "t1", 50)
                if appended == 0:
                    return total
                total += appended or 0
            raise AssertionError(f"an integrator never found the log caught up (appended {total})")

        appended = await asyncio.gather(*(integrator(c) for c in conns))
        # each receipt appended exactly once, whoever held the tenant (the message: what each appended,
        # and where the log stands)
        reader = conns[0]
        size, root = await reader.fetchrow("SELECT size, root FROM ledger.log_state WHERE tenant_id = 't1'")
        assert sum(appended) == 600, (appended, size)
        tiles_rows = await reader.fetch(
            "SELECT level, idx, data FROM ledger.log_tiles WHERE tenant_id = 't1'"
        )
        # bundles are stored as written, never compressed (migration 0018; not on Citus, which refuses
        # the column's storage change): pglz of every pass's rewrite of the growing bundle was most of
        # log_tile_put's cost
        stored = await reader.fetch(
            "SELECT octet_length(data) AS raw, pg_column_size(data) AS kept FROM ledger.log_tiles"
            " WHERE tenant_id = 't1' AND level = -1 ORDER BY idx"
        )
        full = stored[:2]  # bundles 0 and 1 hold 256 entries each, bundle 2 the last 88
        assert len(stored) == 3 and all(r["raw"] > 100_000 for r in full), stored
        if on_citus:  # the default storage: pglz compresses leaf JSON about 2.3 x
            assert all(r["kept"] < r["raw"] for r in full), stored
        else:
            assert all(r["kept"] >= r["raw"] for r in full), stored
    finally:
        for conn in conns:
            await conn.close()
    store = {(r["level"], r["idx"]): bytes(r["data"]) for r in tiles_rows}
    entries = [e for n in range(3) for e in tiles.decode_bundle(store[(tiles.ENTRIES, n)])]
    assert size == 600 and [json.loads(e)["operation_id"] for e in entries] == ops
    assert [json.loads(e)["index"] for e in entries] == list(range(600))
    hashes = [merkle.leaf_hash(e) for e in entries]
    assert merkle.naive_root(hashes) == bytes(root)
    assert merkle.tree_root(600, lambda nodes: tiles.read_nodes(nodes, store)) == bytes(root)


async def test_a_receipt_purged_while_its_batch_is_checked_is_logged_as_read_without_an_alarm(
    settings: Settings, db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The log turned on late (its receipts older than the retention) while the purge runs: a receipt
    the batch read with its body and head event (one statement, one snapshot: round 34), purged into a
    tombstone before the batch is checked, is no edit. The pass logs it as read, without a
    `receipt_mismatch` refusal, and the leaf carries the digest the tombstone keeps. Before round 17
    each such race counted and logged a refusal; from round 17 to 33 (the heads a second statement) the
    pass stopped in front of it and the next one logged the tombstone. The checkpointer, comparing each
    new leaf with its operation's row (now the tombstone), signs all three."""
    from effect_ledger.db import receipt_log
    from effect_ledger.db.maintenance import owner_connection
    from effect_ledger.signer import signer_from_settings

    async with Service(settings) as off, off.client() as client:  # the log is not running
        for i in range(3):
            await committed(client, f"op-{i}")
    async with owner(db_url) as aged:  # untouched for longer than the retention (30 days)
        await aged.execute("UPDATE ledger.operations SET updated_at = now() - make_interval(days => 40)")
    purge_beside_the_next_check(monkeypatch, settings, 3)  # tombstones, beside the open pass
    conn = await owner_connection(settings)
    try:
        assert await integrate_twice(conn) == (3, 0, [])
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM ledger.operations WHERE tenant_id = 't1' AND receipt IS NULL"
            )
            == 3
        )  # the purge ran: the pass logged what it read before it
        bundle = await conn.fetchval(
            "SELECT data FROM ledger.log_tiles WHERE tenant_id = 't1' AND level = -1"
        )
        logged = {
            leaf["operation_id"]: leaf["receipt_digest"]
            for leaf in map(json.loads, tiles.decode_bundle(bundle))
        }
        kept = await conn.fetch(
            "SELECT operation_id, receipt_digest FROM ledger.operations WHERE tenant_id = 't1' AND receipt IS NULL"
        )
        assert logged == {r["operation_id"]: r["receipt_digest"] for r in kept} and len(logged) == 3
        signing = log_settings(settings, tmp_path)
        refused: list[str] = []
        signed = await receipt_log.checkpoint(
            conn,
            signer_from_settings(signing),
            receipt_log.LogConfig(signing.log_origin, 0),
            receipt_log.LogGuard(),
            lambda reason, _: refused.append(reason),
        )
        assert (signed, refused) == ([("t1", 3)], [])
    finally:
        await conn.close()


async def test_a_conflicting_report_recorded_before_the_receipt_is_logged_is_no_edit(
    settings: Settings, db_url: str
) -> None:
    """A retried complete with another receipt, answered 409 conflicting_outcome, appends a
    `discrepancy` event (committed -> committed) after the receipt's `completed` event. The receipt
    is still the one the chain recorded: it is logged, with no `receipt_mismatch` refusal. Until round
    24 the integrator took the last event *into* committed as the recording one, found no receipt in
    the discrepancy's data, and refused the tenant's log on every pass from then on."""
    from effect_ledger.db import receipt_log
    from effect_ledger.db.maintenance import owner_connection

    await commit_with_a_discrepancy(settings)  # the log is not running
    refused: list[str] = []
    conn = await owner_connection(settings)
    try:
        kinds = await conn.fetch(
            "SELECT kind, to_status FROM ledger.events WHERE tenant_id = 't1' AND operation_id = 'op-1'"
            " ORDER BY seq"
        )
        assert [tuple(k) for k in kinds][-2:] == [("completed", "committed"), ("discrepancy", "committed")]
        appended = await receipt_log.integrate_tenant(
            conn, "t1", 50, lambda reason, _: refused.append(reason)
        )
        assert (appended, refused) == (3, [])
        bundle = await conn.fetchval(
            "SELECT data FROM ledger.log_tiles WHERE tenant_id = 't1' AND level = -1"
        )
        leaf = json.loads(tiles.decode_bundle(bundle)[1])
        hashes = await conn.fetch(
            "SELECT hash FROM ledger.events WHERE tenant_id = 't1' AND operation_id = 'op-1' ORDER BY seq"
        )
        assert (
            leaf["operation_id"] == "op-1" and leaf["chain_hash"] == hashes[-2]["hash"] != hashes[-1]["hash"]
        )
    finally:
        await conn.close()


async def test_a_conflicting_report_recorded_after_the_batchs_read_is_no_edit_and_no_second_read(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch's rows and their head events are read in one statement (round 34; until then the heads
    were a second statement, and a `discrepancy` event appended between the two moved the chain past
    the head the row was read with, so that operation was read again with its whole chain). A
    discrepancy appended after the read changes nothing the pass saw: no operation is judged again,
    nothing is refused, and the receipt is logged with the hash of the event that committed it."""
    from effect_ledger.db import receipt_log
    from effect_ledger.db.maintenance import owner_connection
    from support.ledger import call, claim

    refused: list[str] = []
    again: list[list[str]] = []
    async with Service(settings) as off, off.client() as client:  # the log is not running
        await committed(client, "op-0")
        r = await claim(client, "op-1", {**CLAIM})
        done = {"token": r.json()["claim"]["token"], "outcome": "committed", "receipt": RECEIPT}
        assert (await call(client, "op-1", "complete", done)).status_code == 200
        await committed(client, "op-2")
        checked, judged = receipt_log._intact_receipts, receipt_log._judged_again

        async def reported_meanwhile(*args: object) -> object:  # after the rows' read, before the events'
            other = {**done, "receipt": {**RECEIPT, "external_ref": "another"}}
            r = await call(client, "op-1", "complete", other)
            assert (r.status_code, r.json()["code"]) == (409, "conflicting_outcome"), r.text
            return await checked(*args)  # type: ignore[operator]

        async def judged_again(
            conn: object, tenant: str, rows: list[dict[str, object]], verdicts: object
        ) -> None:
            again.append([str(row["operation_id"]) for row in rows])
            await judged(conn, tenant, rows, verdicts)  # type: ignore[arg-type]

        monkeypatch.setattr(receipt_log, "_intact_receipts", reported_meanwhile)
        monkeypatch.setattr(receipt_log, "_judged_again", judged_again)
        conn = await owner_connection(settings)
        try:
            appended = await receipt_log.integrate_tenant(
                conn, "t1", 50, lambda reason, _: refused.append(reason)
            )
            bundle = await conn.fetchval(
                "SELECT data FROM ledger.log_tiles WHERE tenant_id = 't1' AND level = -1"
            )
            hashes = await conn.fetch(
                "SELECT kind, hash FROM ledger.events WHERE tenant_id = 't1' AND operation_id = 'op-1' ORDER BY seq"
            )
        finally:
            await conn.close()
    assert (appended, refused, again) == (3, [], [])
    assert [h["kind"] for h in hashes][-2:] == ["completed", "discrepancy"]
    leaf = json.loads(tiles.decode_bundle(bundle)[1])
    assert leaf["operation_id"] == "op-1" and leaf["chain_hash"] == hashes[-2]["hash"] != hashes[-1]["hash"]


async def test_a_conflicting_report_after_the_receipt_is_logged_keeps_the_log_signing(
    logged: Service,
) -> None:
    """A `discrepancy` event appended to a logged receipt's chain moves the operation's chain head, not
    what its leaf records: the leaf's chain_hash is the hash of the event that committed it (API.md
    section 14: "the operation's last event hash at commit"). The checkpointer's audit compares the
    leaf with that, so the next checkpoint is signed and the proof still verifies. Until round 24 the
    audit compared it with the row's current head, found a mismatch, and the tenant's log stayed
    unsigned from then on."""
    from support.ledger import call, claim

    async with logged.client() as client:
        await committed(client, "op-0")
        r = await claim(client, "op-1", {**CLAIM})
        token = r.json()["claim"]["token"]
        done = {"token": token, "outcome": "committed", "receipt": RECEIPT}
        assert (await call(client, "op-1", "complete", done)).status_code == 200
        await wait_for_size(client, 2)
        other = {**done, "receipt": {**RECEIPT, "external_ref": "another"}}
        r = await call(client, "op-1", "complete", other)
        assert (r.status_code, r.json()["code"]) == (409, "conflicting_outcome"), r.text
        await committed(client, "op-2")
        await wait_for_size(client, 3)
        key = (await get(client, "/v1/log/key", **AUDITOR)).json()
        events = (await get(client, "/v1/operations/op-1/events", **AUDITOR)).json()["items"]
        assert [e["kind"] for e in events][-2:] == ["completed", "discrepancy"]
        r = await get(client, "/v1/log/proof", {"operation_id": "op-1"}, **AUDITOR)
        assert r.status_code == 200, r.text
        view = (await get(client, "/v1/operations/op-1", **AUDITOR)).json()
        verified = verify_proof(r.text, key["vkey"], receipt=view["receipt"])
        assert (verified.index, verified.size) == (1, 3)
        leaf = json.loads(base64.b64decode(r.text.split("\n")[1].split(" ", 1)[1]))
        assert leaf["chain_hash"] == events[-2]["hash"] != events[-1]["hash"]
