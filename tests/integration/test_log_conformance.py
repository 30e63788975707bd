"""The receipts log (API.md section 14) checked as an outside auditor would: over loopback HTTP, with
a verifier written from RFC 6962 / RFC 9162 and the C2SP specs alone (support/tlog_spec.py imports
nothing of effect_ledger), so a misreading of a spec shared by the service and our own domain verifier
(test_receipt_log.py, test_receipt_log_trust.py) fails here.

One log, with a witness (`effect-ledger witness`, a process of its own) cosigning its checkpoints, is
built once for the module: 300 receipts for t1 and 3 for t2, interleaved. The tests read it, then grow
it (consistency), in file order; the tampering tests each run a service of their own.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import random
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from effect_ledger.settings import Settings
from support.auth import TEST_SECRET
from support.ledger import AUDITOR, RECONCILER, committed, get
from support.receipt_log import cli_process, log_settings
from support.server import Service, free_port
from support.tlog_spec import (
    COSIGNATURE_V1,
    TILE_WIDTH,
    Checkpoint,
    Note,
    Rejected,
    VerifierKey,
    b64decode,
    decode_bundle,
    leaf_hash,
    mth,
    parse_proof,
    parse_vkey,
    path,
    proof,
    root_from_tiles,
    tile_index,
    tile_path,
    tiles_of,
    verified_checkpoint,
    verify_consistency,
    verify_cosignature,
    verify_inclusion,
    verify_note,
    verify_proof,
)
from support.waiting import until

pytestmark = [pytest.mark.timeout(180), pytest.mark.storage]
ORIGIN = "effect-ledger.local"  # LOG_ORIGIN's default
LEAF_KEYS = {
    "v", "tenant", "operation_id", "index", "principal", "tool", "tool_version", "intent_digest",
    "attempt", "receipt_digest", "chain_hash", "committed_at", "salt",
}  # fmt: skip
T1_RECEIPTS, T2_RECEIPTS = 300, 3


def jcs(value: Any) -> bytes:
    """RFC 8785 for JSON of strings, integers, null and ASCII keys (no floats): sorted, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def receipt_of(i: int) -> dict[str, Any]:
    return {"external_ref": f"secret-ref-{i}", "result": {"payload": f"secret-content-{i}", "n": i}}


@contextmanager
def witness(tmp_path: Path, vkeys: list[str]) -> Iterator[dict[str, str]]:
    """`effect-ledger witness` for the given logs; yields its first line, {"witness": url, "vkey": …}."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_LEDGER_")}
    args = ["witness", "--port", str(free_port()), "--state", str(tmp_path / "witness")]
    args += ["--key", str(tmp_path / "witness-key"), "--log", *vkeys]
    with cli_process(*args, env=env) as started:
        yield started


@dataclass
class Log:
    """The module's running log and what an auditor pinned out of band."""

    http: httpx.AsyncClient  # over loopback HTTP, as an auditor reaches it
    client: httpx.AsyncClient  # in process, for the executor's commits
    keys: dict[str, VerifierKey]
    witnesses: list[VerifierKey]
    quorum: int
    ops: dict[str, list[str]]

    async def checkpoint(self, tenant: str = "t1") -> tuple[Checkpoint, Note, str]:
        """The served checkpoint, verified: the log's signature and the witness quorum."""
        r = await get(self.http, "/v1/log/checkpoint", tenant=tenant, **AUDITOR)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "text/plain; charset=utf-8"
        checkpoint, note = verified_checkpoint(r.text, self.keys[tenant], f"{ORIGIN}/{tenant}")
        cosigned = [verify_cosignature(note, w, int(time.time())) for w in self.witnesses]
        assert len(cosigned) >= self.quorum
        return checkpoint, note, r.text

    async def wait_for(self, size: int, tenant: str = "t1") -> Checkpoint:
        """The first cosigned checkpoint of at least `size` leaves, which must be exactly `size`."""

        async def cosigned() -> int:
            try:
                return (await self.checkpoint(tenant))[0].size
            except (AssertionError, Rejected):  # none yet, or not yet cosigned
                return -1

        await until(cosigned, f"{tenant}'s cosigned checkpoint of {size}", holds=lambda s: s >= size)
        checkpoint = (await self.checkpoint(tenant))[0]
        assert checkpoint.size == size
        return checkpoint

    async def tile(self, level: int | str, n: int, width: int, tenant: str = "t1") -> httpx.Response:
        return await get(self.http, "/v1/log/" + tile_path(level, n, width), tenant=tenant, **AUDITOR)

    async def tiles(self, size: int, tenant: str = "t1") -> dict[tuple[int, int], bytes]:
        """Every tile of the tree of `size` leaves, each of the width its path names."""
        out = {}
        for level, n, width in tiles_of(size):
            r = await self.tile(level, n, width, tenant)
            assert r.status_code == 200, (level, n, width, r.text)
            assert r.headers["content-type"] == "application/octet-stream"
            assert len(r.content) == 32 * width
            out[(level, n)] = r.content
        return out

    async def entries(self, size: int, tenant: str = "t1") -> list[bytes]:
        """Every entry of the tree of `size` leaves, from its entry bundles."""
        out: list[bytes] = []
        for _, n, width in [t for t in tiles_of(size) if t[0] == 0]:
            r = await self.tile("entries", n, width, tenant)
            assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
            bundle = decode_bundle(r.content)
            assert len(bundle) == width
            out += bundle
        return out


def leaf_hashes(tiles: dict[tuple[int, int], bytes], size: int) -> list[bytes]:
    level0 = b"".join(tiles[(0, n)] for n in range(-(-size // TILE_WIDTH)))
    return [level0[i : i + 32] for i in range(0, 32 * size, 32)]


@pytest.fixture(scope="module")
async def log(module_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Log]:
    tmp_path = tmp_path_factory.mktemp("conformance")
    base = Settings(
        database_url=module_db_url,
        jwt_secret=TEST_SECRET,
        background_sweep=False,
        pool_size=20,
        log_enabled=False,
    )
    configured = log_settings(base, tmp_path)
    async with Service(configured) as first, first.client() as client:  # the keys, to configure the witness
        vkeys = [(await get(client, "/v1/log/key", tenant=t, **AUDITOR)).json()["vkey"] for t in ("t1", "t2")]
    with witness(tmp_path, vkeys) as w:
        witnessed = replace(configured, log_witnesses=json.dumps([{"url": w["witness"], "vkey": w["vkey"]}]))
        async with Service(witnessed) as running, running.client() as client:
            async with httpx.AsyncClient(base_url=running.base_url, timeout=30) as http:
                keys, witnesses, quorum = {}, [], 0
                for tenant in ("t1", "t2"):
                    key = (await get(http, "/v1/log/key", tenant=tenant, **AUDITOR)).json()
                    assert key["origin"] == f"{ORIGIN}/{tenant}"
                    keys[tenant] = parse_vkey(key["vkey"])
                    witnesses = [parse_vkey(x["vkey"], COSIGNATURE_V1) for x in key["witnesses"]]
                    assert [x["name"] for x in key["witnesses"]] == [x.name for x in witnesses]
                    quorum = key["quorum"]
                assert [x.public_key for x in witnesses] == [parse_vkey(w["vkey"], COSIGNATURE_V1).public_key]
                assert quorum == 1
                ops: dict[str, list[str]] = {"t1": [], "t2": []}
                for i in range(T1_RECEIPTS):
                    ops["t1"].append(f"op-{i:03d}")
                    await committed(client, ops["t1"][-1], receipt=receipt_of(i))
                    if i % 100 == 50:  # the other tenant's commits fall between these
                        ops["t2"].append(f"other-{i}")
                        await committed(client, ops["t2"][-1], tenant="t2", receipt=receipt_of(i))
                found = Log(http, client, keys, witnesses, quorum, ops)
                await found.wait_for(T1_RECEIPTS)
                await found.wait_for(T2_RECEIPTS, "t2")
                yield found


@pytest.mark.storage_repeat  # no database: the verifier on the specs' examples
def test_the_verifier_gives_the_specs_own_answers() -> None:
    """The verifier itself, on the specs' examples and on RFC 6962's definitions of the proofs."""
    example = parse_vkey("example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k")
    signature = "Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM="
    note = f"This is an example message.\n\n\u2014 example.com/foo {signature}\n"
    assert verify_note(note, example).text == "This is an example message.\n"
    with pytest.raises(Rejected, match="bad signature"):
        verify_note(note.replace("example message", "example massage"), example)
    assert (
        tile_index(1234067) == "x001/x234/067" and tile_index(5) == "005" and tile_index(1000) == "x001/000"
    )
    assert tile_path(0, 1, 44) == "tile/0/001.p/44" and tile_path("entries", 0) == "tile/entries/000"
    # tlog-tiles: 70,000 leaves are 273 full level-0 tiles, one of width 112, one full level-1 tile, one
    # of width 17 and one level-2 tile of width 1; 256 leaves a full level-0 tile and a level-1 one of 1
    assert [t for t in tiles_of(70_000) if t[2] != TILE_WIDTH] == [(0, 273, 112), (1, 1, 17), (2, 0, 1)]
    assert len(tiles_of(70_000)) == 273 + 1 + 1 + 1 + 1
    assert tiles_of(256) == [(0, 0, 256), (1, 0, 1)]
    assert mth([]).hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    leaves = [leaf_hash(bytes([i])) for i in range(20)]
    for n in range(1, 21):
        root = mth(leaves[:n])
        for m in range(n):
            assert verify_inclusion(m, n, leaves[m], path(m, leaves[:n]), root)
            assert not verify_inclusion(m, n, leaves[(m + 1) % 20], path(m, leaves[:n]), root)
            if m:
                c = proof(m, leaves[:n])
                assert verify_consistency(m, n, mth(leaves[:m]), root, c)
                assert not verify_consistency(m, n, mth(leaves[:m]), root, [*c[:-1], leaf_hash(b"x")])
        assert verify_consistency(n, n, root, root, [])
        if n > 1:  # a proof for one size never passes for another
            assert not verify_inclusion(n - 2, n - 1, leaves[n - 2], path(n - 2, leaves[:n]), root)


async def test_checkpoint_is_signed_by_the_tenants_origin(log: Log) -> None:
    checkpoint, note, text = await log.checkpoint()
    assert (checkpoint.origin, checkpoint.size, checkpoint.extensions) == (f"{ORIGIN}/t1", T1_RECEIPTS, [])
    assert log.keys["t1"].name == f"{ORIGIN}/t1"  # the key name is the origin
    log_lines = [name for name, _ in note.signatures if name == log.keys["t1"].name]
    assert len(log_lines) == 1 and len(note.signatures) == 1 + len(log.witnesses)
    forged = text.replace(note.text, note.text.replace("\n300\n", "\n301\n"))
    with pytest.raises(Rejected, match="bad signature"):
        verify_note(forged, log.keys["t1"])
    with pytest.raises(Rejected, match="no signature"):
        verify_note(text, log.keys["t2"])
    r = await get(log.http, "/v1/log/checkpoint", **AUDITOR)
    assert "no-cache" in r.headers["cache-control"] or "max-age=0" in r.headers["cache-control"]


async def test_tiles_and_bundles_rebuild_the_signed_root(log: Log) -> None:
    checkpoint = (await log.checkpoint())[0]
    size = checkpoint.size
    tiles = await log.tiles(size)
    assert sorted(tiles) == [(0, 0), (0, 1), (1, 0)]  # 300: a full tile, one of 44, a level-1 one of 1
    leaves = leaf_hashes(tiles, size)
    entries = await log.entries(size)
    assert [leaf_hash(e) for e in entries] == leaves
    assert mth(leaves) == checkpoint.root
    # a level-1 hash is the MTH of a full level-0 tile; the root folds the highest tiles' subtrees
    assert tiles[(1, 0)] == mth(leaves[:TILE_WIDTH])

    def hash_at(level: int, i: int) -> bytes:
        blob = tiles[(level, i // TILE_WIDTH)]
        return blob[32 * (i % TILE_WIDTH) : 32 * (i % TILE_WIDTH) + 32]

    assert root_from_tiles(size, hash_at) == checkpoint.root
    # a full tile (and bundle) never changes and says so; a partial one is not promised to stay
    for level in (0, "entries"):
        full, partial = await log.tile(level, 0, TILE_WIDTH), await log.tile(level, 1, size % TILE_WIDTH)
        assert "immutable" in full.headers["cache-control"]
        # the tenant's, chosen by the token: no shared cache may keep it for another caller (RFC 9111 3.5)
        directives = {d.strip() for d in full.headers["cache-control"].split(",")}
        assert "private" in directives and "public" not in directives
        assert full.headers["vary"] == partial.headers["vary"] == "Authorization"
        max_age = [p for p in full.headers["cache-control"].split(",") if p.strip().startswith("max-age=")]
        assert len(max_age) == 1 and int(max_age[0].split("=")[1]) >= 365 * 86400
        assert "immutable" not in partial.headers["cache-control"]
    assert (await log.tile(0, 2, 1)).status_code == 404  # no tile beyond the tree
    for bad in ("tile/00/000", "tile/0/000.p/256", "tile/0/001.p/0", "tile/0/001.p/044", "tile/0/x000/001"):
        assert (await get(log.http, f"/v1/log/{bad}", **AUDITOR)).status_code == 404, bad  # not a tile path
    assert (await log.tile(0, 1, size % TILE_WIDTH + 1)).status_code == 404


async def feed(http: httpx.AsyncClient, tenant: str) -> list[dict[str, Any]]:
    """The tenant's receipts feed (API.md section 8), followed with `after` as a follower does."""
    items: list[dict[str, Any]] = []
    while True:
        params: dict[str, Any] = {"limit": 128} | ({"after": items[-1]["position"]} if items else {})
        page = (await get(http, "/v1/receipts", params, tenant=tenant, **AUDITOR)).json()["items"]
        if not page:
            return items
        items += page


async def test_leaves_are_the_feed_in_order_and_hold_digests_only(log: Log) -> None:
    size = (await log.checkpoint())[0].size
    entries = await log.entries(size)
    views = await feed(log.http, "t1")
    assert [v["operation_id"] for v in views] == log.ops["t1"]
    salts = set()
    for i, (entry, view) in enumerate(zip(entries, views, strict=True)):
        leaf = json.loads(entry)
        assert jcs(leaf) == entry  # the leaf data is the JCS form
        assert set(leaf) == LEAF_KEYS and (leaf["v"], leaf["tenant"], leaf["index"]) == (1, "t1", i)
        assert leaf["operation_id"] == view["operation_id"] and leaf["committed_at"] == view["resolved_at"]
        for field in ("principal", "tool", "tool_version", "intent_digest", "attempt"):
            assert leaf[field] == view[field], field
        digest = hashlib.sha256(jcs(view["receipt"])).hexdigest()
        assert leaf["receipt_digest"] == f"sha256:{digest}"
        assert b"secret-" not in entry  # digests only: no receipt content
        salt = b64decode(leaf["salt"])
        assert len(salt) == 32 and salt not in salts
        salts.add(salt)
    for i in (0, 149, size - 1):  # the chain head at commit: the operation's last event's hash
        events = (await get(log.http, f"/v1/operations/{views[i]['operation_id']}/events", **AUDITOR)).json()
        assert json.loads(entries[i])["chain_hash"] == events["items"][-1]["hash"]


async def test_every_read_view_carries_its_log_index(log: Log) -> None:
    # API.md 8 answers the feed (and 7 the reconciler's lists) as operation views; 14: the view of a
    # logged receipt carries its leaf index, else null
    size = (await log.checkpoint())[0].size
    views = await feed(log.http, "t1")
    got = [v.get("log_index", "absent") for v in views]
    assert got[:size] == list(range(size))
    assert all(x is None or x == i for i, x in enumerate(got[size:], size)), got[size:]
    leaf_of = {v["operation_id"]: i for i, v in enumerate(views)}  # the feed, gap-free, is the leaves
    for status in ("committed", None):
        params = {"limit": 500} | ({"status": status} if status else {})
        r = await get(log.http, "/v1/operations", params, tenant="t1", **RECONCILER)
        assert r.status_code == 200, r.text
        listed = r.json()["items"]
        assert {v["operation_id"] for v in listed} >= set(log.ops["t1"])
        for v in listed:  # the leaf once a checkpoint covers it (one may be signed between the reads)
            assert v.get("log_index", "absent") in {leaf_of.get(v["operation_id"]), None}, v
            if v["operation_id"] in leaf_of and leaf_of[v["operation_id"]] < size:
                assert v["log_index"] == leaf_of[v["operation_id"]], v


def flip(text: str, line: int) -> str:
    """The proof file with one byte of its `line`-th line (a base64 hash) changed."""
    lines = text.split("\n")
    raw = bytearray(b64decode(lines[line]))
    raw[7] ^= 0x01
    lines[line] = base64.b64encode(bytes(raw)).decode()
    return "\n".join(lines)


async def test_proof_files_verify_offline(log: Log) -> None:
    size = (await log.checkpoint())[0].size
    entries, leaves = await log.entries(size), leaf_hashes(await log.tiles(size), size)
    ops = log.ops["t1"]
    sample = sorted({0, 1, 255, 256, size - 1, *random.Random(6962).sample(range(size), 5)})
    for i in sample:
        r = await get(log.http, "/v1/log/proof", {"operation_id": ops[i]}, **AUDITOR)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
        now = int(time.time())
        proven = verify_proof(r.text, log.keys["t1"], f"{ORIGIN}/t1", log.witnesses, log.quorum, now)
        assert (proven.index, proven.checkpoint.size, proven.leaf) == (i, size, entries[i])
        assert parse_proof(r.text).checkpoint == (await log.checkpoint())[2]  # the served one, verbatim
        assert len(proven.cosigned_at) == len(log.witnesses) and all(
            now - 600 <= t <= now for t in proven.cosigned_at.values()
        )
        view = (await get(log.http, f"/v1/operations/{ops[i]}", **AUDITOR)).json()
        assert view["log_index"] == i
        digest = hashlib.sha256(jcs(view["receipt"])).hexdigest()
        assert json.loads(proven.leaf)["receipt_digest"] == f"sha256:{digest}"
        hashes = parse_proof(r.text).inclusion_path
        assert hashes == path(i, leaves)  # RFC 6962's PATH(i, D[n]), leaf's sibling first
        for line in range(3, 3 + len(hashes)):  # each changed proof hash is caught
            with pytest.raises(Rejected, match="inclusion proof"):
                verify_proof(flip(r.text, line), log.keys["t1"], f"{ORIGIN}/t1", log.witnesses, 1, now)
        moved = r.text.replace(f"\nindex {i}\n", f"\nindex {(i + 1) % size}\n")
        with pytest.raises(Rejected, match="inclusion proof"):
            verify_proof(moved, log.keys["t1"], f"{ORIGIN}/t1", log.witnesses, 1, now)
    with pytest.raises(Rejected, match="no signature"):
        verify_proof(r.text, log.keys["t2"], f"{ORIGIN}/t1", log.witnesses, 1, int(time.time()))
    uncosigned = "".join(line for line in r.text.splitlines(keepends=True) if not line.startswith("\u2014 w"))
    assert uncosigned.count("\u2014") == 1  # the log's own signature line only
    with pytest.raises(Rejected, match="quorum"):
        verify_proof(uncosigned, log.keys["t1"], f"{ORIGIN}/t1", log.witnesses, 1, int(time.time()))


async def test_tenants_have_separate_logs(log: Log) -> None:
    checkpoint, _, text = await log.checkpoint("t2")
    assert (checkpoint.origin, checkpoint.size) == (f"{ORIGIN}/t2", T2_RECEIPTS)
    assert log.keys["t2"].name == f"{ORIGIN}/t2" and log.keys["t2"].key_id != log.keys["t1"].key_id
    with pytest.raises(Rejected, match="no signature"):
        verify_note(text, log.keys["t1"])
    tiles = await log.tiles(T2_RECEIPTS, "t2")
    entries = await log.entries(T2_RECEIPTS, "t2")
    assert [leaf_hash(e) for e in entries] == leaf_hashes(tiles, T2_RECEIPTS)
    assert mth(leaf_hashes(tiles, T2_RECEIPTS)) == checkpoint.root
    leaves = [json.loads(e) for e in entries]
    assert [(x["tenant"], x["index"], x["operation_id"]) for x in leaves] == [
        ("t2", i, op) for i, op in enumerate(log.ops["t2"])
    ]
    own = await get(log.http, "/v1/log/proof", {"operation_id": log.ops["t2"][1]}, tenant="t2", **AUDITOR)
    proven = verify_proof(
        own.text, log.keys["t2"], f"{ORIGIN}/t2", log.witnesses, log.quorum, int(time.time())
    )
    assert proven.index == 1
    for tenant, op in (("t2", log.ops["t1"][0]), ("t1", log.ops["t2"][0])):
        r = await get(log.http, "/v1/log/proof", {"operation_id": op}, tenant=tenant, **AUDITOR)
        assert r.status_code == 404 and r.json()["code"] == "not_found"
    assert (await log.tile(0, 0, TILE_WIDTH, "t2")).status_code == 404  # t1 has it, t2 has not


async def test_checkpoints_are_consistent_as_the_log_grows(log: Log) -> None:
    a = (await log.checkpoint())[0]
    tiles, entries = await log.tiles(a.size), await log.entries(a.size)
    leaves = leaf_hashes(tiles, a.size)
    for i in range(7):
        await committed(log.client, f"late-{i}", receipt=receipt_of(1000 + i))
    b = await log.wait_for(a.size + 7)
    # tlog-tiles: partial tiles of a size that was checkpointed stay served until their full tile is
    assert (await log.tiles(a.size), await log.entries(a.size)) == (tiles, entries)
    assert mth(leaf_hashes(await log.tiles(b.size), b.size)[: a.size]) == a.root  # the old tree, unchanged
    r = await get(log.http, "/v1/log/consistency", {"from": a.size}, **AUDITOR)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert r.headers["effect-ledger-tree-size"] == str(b.size)  # the size the proof ends at
    c = [b64decode(line) for line in r.text.splitlines()]
    assert verify_consistency(a.size, b.size, a.root, b.root, c)
    assert not verify_consistency(a.size, b.size, a.root, b.root, [*c[:-1], bytes(32)])
    for m in (1, 2, 3, 4, 7, 8, 100, 255, 256, 257, 299):  # from any earlier tree the auditor saw
        r = await get(log.http, "/v1/log/consistency", {"from": m}, **AUDITOR)
        got = [b64decode(line) for line in r.text.splitlines()]
        assert verify_consistency(m, b.size, mth(leaves[:m]), b.root, got), m
    same = await get(log.http, "/v1/log/consistency", {"from": b.size}, **AUDITOR)
    assert (same.status_code, same.text) == (200, "")  # a tree is consistent with itself: no hashes
    above = await get(log.http, "/v1/log/consistency", {"from": b.size + 1}, **AUDITOR)
    assert above.status_code == 422 and above.json()["code"] == "validation_failed"
    # `to`: a proof to the checkpoint the auditor holds, not to whatever was signed since it read one
    for m in (1, 5, a.size - 1):
        r = await get(log.http, "/v1/log/consistency", {"from": m, "to": a.size}, **AUDITOR)
        assert r.status_code == 200 and r.headers["effect-ledger-tree-size"] == str(a.size)
        got = [b64decode(line) for line in r.text.splitlines()]
        assert verify_consistency(m, a.size, mth(leaves[:m]), a.root, got), m
        assert not verify_consistency(m, b.size, mth(leaves[:m]), b.root, got), m
    for bad in ({"from": 3, "to": b.size + 1}, {"from": a.size + 1, "to": a.size}, {"from": 0, "to": "x"}):
        r = await get(log.http, "/v1/log/consistency", bad, **AUDITOR)
        assert (r.status_code, r.json()["code"]) == (422, "validation_failed"), bad
        assert [e["field"] for e in r.json()["errors"]] == ["from" if bad["from"] == a.size + 1 else "to"]


TAMPERS = {
    "receipt": "UPDATE ledger.operations SET receipt = jsonb_set(receipt, '{external_ref}', '\"forged\"')"
    " WHERE tenant_id = 't1' AND operation_id = 'op-2'",
    "entry bundle": "UPDATE ledger.log_tiles SET data = overlay(data placing '\\x58'::bytea from 40 for 1)"
    " WHERE tenant_id = 't1' AND level = -1 AND idx = 0",
}


@pytest.mark.parametrize(
    "what",
    [
        # test_receipt_log_trust.py's tamper matrix edits a receipt on Citus too: this one the entry bundle
        pytest.param(what, marks=pytest.mark.storage_repeat if what == "receipt" else ())
        for what in sorted(TAMPERS)
    ],
)
async def test_an_edit_of_logged_history_gets_no_new_checkpoint(
    what: str, settings: Settings, db_url: str, tmp_path: Path
) -> None:
    async with Service(log_settings(settings, tmp_path)) as running, running.client() as client:
        async with httpx.AsyncClient(base_url=running.base_url, timeout=30) as http:
            key = (await get(http, "/v1/log/key", **AUDITOR)).json()
            log = Log(http, client, {"t1": parse_vkey(key["vkey"])}, [], 0, {"t1": []})
            for i in range(5):
                await committed(client, f"op-{i}", receipt=receipt_of(i))
            await log.wait_for(5)
            before = await log.checkpoint()
            saved = {}
            for i in range(5):
                saved[i] = (await get(http, "/v1/log/proof", {"operation_id": f"op-{i}"}, **AUDITOR)).text
            owner = await asyncpg.connect(db_url)  # the database's superuser
            try:
                assert await owner.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
                assert await owner.execute(TAMPERS[what]) == "UPDATE 1"
            finally:
                await owner.close()
            for i in range(12):  # three seconds of commits: three checkpoint periods, none signed
                await committed(client, f"later-{i}", receipt=receipt_of(100 + i))
                served = await log.checkpoint()
                assert (served[0], served[2]) == (before[0], before[2])
                await asyncio.sleep(0.25)
            for i, text in saved.items():  # what the auditor saved still proves what it did
                proven = verify_proof(text, log.keys["t1"], f"{ORIGIN}/t1", [], 0, int(time.time()))
                assert proven.index == i and proven.checkpoint == before[0]
            if what == "receipt":  # and it shows the edit: the receipt served is not the one logged
                view = (await get(http, "/v1/operations/op-2", **AUDITOR)).json()
                leaf = json.loads(verify_proof(saved[2], log.keys["t1"], f"{ORIGIN}/t1", [], 0, 0).leaf)
                assert leaf["receipt_digest"] != "sha256:" + hashlib.sha256(jcs(view["receipt"])).hexdigest()
            else:  # the bundle served no longer hashes to the signed tree
                entries = await log.entries(5)
                assert mth([leaf_hash(e) for e in entries]) != before[0].root
