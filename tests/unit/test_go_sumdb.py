"""Proof files and consistency proofs checked by an independent implementation: Go's golang.org/x/mod/sumdb (`note`, `tlog`)
from Debian's golang-golang-x-mod-dev, through tests/support/go/verify_proof.go. Skips, saying why,
where the machine has no Go toolchain or no such package."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from effect_ledger.domain import tiles
from effect_ledger.domain.merkle import consistency_proof, inclusion_proof, leaf_hash, tree_root
from effect_ledger.domain.note import Checkpoint, Signer, b64, sign_note
from effect_ledger.domain.receipt_log import LeafFacts, leaf_data, proof_file

PROGRAM = Path(__file__).resolve().parents[1] / "support" / "go" / "verify_proof.go"
GOPATH = Path("/usr/share/gocode")


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        pytest.skip(
            "Go is not on this machine (apt-get install golang-go golang-golang-x-mod-dev runs this check)"
        )
    if not (GOPATH / "src" / "golang.org" / "x" / "mod" / "sumdb" / "tlog").is_dir():
        pytest.skip("golang.org/x/mod is not in /usr/share/gocode (Debian's golang-golang-x-mod-dev)")
    return go


def test_go_sumdb_verifies_our_proof_files_and_refuses_a_changed_one(tmp_path: Path) -> None:
    go = _go()
    signer = Signer("effect-ledger.local/t1", bytes(range(32)))
    size = 1000
    facts = [
        LeafFacts("t1", f"op-{i}", "exec-1", "tool", "1", "sha256:" + "0" * 64, 1, "sha256:" + "1" * 64,
                  "2" * 64, datetime(2026, 12, 1, tzinfo=UTC))
        for i in range(size)
    ]  # fmt: skip
    data = [leaf_data(f, i, bytes([i % 256]) * 32) for i, f in enumerate(facts)]
    store = tiles.append(0, {}, [leaf_hash(d) for d in data])

    def read(nodes: object) -> list[bytes]:
        return tiles.read_nodes(nodes, store)  # type: ignore[arg-type]

    note = sign_note(Checkpoint(signer.name, size, tree_root(size, read)).text, signer)
    paths = []
    for index in (0, 1, 255, 256, 511, 999):
        path = tmp_path / f"{index}.tlog-proof"
        path.write_text(proof_file(data[index], index, inclusion_proof(index, size, read), note))
        paths.append(str(path))
    # pure Go (no cgo: nothing here needs a C compiler)
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": str(GOPATH),
        "GOCACHE": str(tmp_path / "cache"),
        "CGO_ENABLED": "0",
    }
    run = [go, "run", str(PROGRAM), signer.verifier.vkey]
    ok = subprocess.run([*run, *paths], env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and ok.stdout.strip() == f"ok {len(paths)}", ok.stderr
    bad = tmp_path / "bad.tlog-proof"
    bad.write_text(Path(paths[2]).read_text().replace("index 255", "index 254"))
    refused = subprocess.run([*run, str(bad)], env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1, refused.stdout


def test_go_sumdb_accepts_our_consistency_proofs_and_refuses_a_changed_one(tmp_path: Path) -> None:
    """GET /v1/log/consistency's proofs (merkle.consistency_proof from tiles) checked by Go's
    tlog.CheckTree between two checkpoints signed by the log key, across tile boundaries."""
    go = _go()
    signer = Signer("effect-ledger.local/t1", bytes(range(32)))
    size = 1000
    store = tiles.append(0, {}, [leaf_hash(b"leaf %d" % i) for i in range(size)])

    def read(nodes: object) -> list[bytes]:
        return tiles.read_nodes(nodes, store)  # type: ignore[arg-type]

    def checkpoint(n: int) -> Path:
        path = tmp_path / f"{n}.checkpoint"
        path.write_text(sign_note(Checkpoint(signer.name, n, tree_root(n, read)).text, signer))
        return path

    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": str(GOPATH),
        "GOCACHE": str(tmp_path / "cache"),
        "CGO_ENABLED": "0",
    }
    for old, new in ((1, 1000), (255, 256), (256, 1000), (257, 999), (700, 1000), (999, 1000)):
        proof = tmp_path / f"{old}-{new}.consistency"
        proof.write_text("".join(b64(h) + "\n" for h in consistency_proof(old, new, read)))
        run = [go, "run", str(PROGRAM), "-consistency", signer.verifier.vkey]
        args = [str(checkpoint(old)), str(checkpoint(new)), str(proof)]
        ok = subprocess.run([*run, *args], env=env, capture_output=True, text=True, timeout=300)
        assert (ok.returncode, ok.stdout) == (0, "ok consistent\n"), (old, new, ok.stderr)
    lines = proof.read_text().splitlines()  # 999 -> 1000
    proof.write_text("\n".join([b64(bytes(32)), *lines[1:]]) + "\n")
    refused = subprocess.run([*run, *args], env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1, refused.stdout
