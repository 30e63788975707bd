"""The witness's add-checkpoint decision (c2sp.org/tlog-witness), every answer code of the spec."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from effect_ledger.domain import tiles
from effect_ledger.domain.merkle import EMPTY_ROOT, consistency_proof, leaf_hash, tree_root
from effect_ledger.domain.note import (
    ALG_COSIGNATURE_V1,
    Checkpoint,
    Signer,
    b64,
    note_signed_by,
    parse_note,
    sign_note,
)
from effect_ledger.domain.witness import SIZE_TYPE, add_checkpoint_body, decide
from effect_ledger.witness import WitnessState

LOG = Signer("example.com/log", bytes(range(32)))
WITNESS = Signer("witness.example/w1", bytes(range(1, 33)), ALG_COSIGNATURE_V1)
LOGS = {LOG.name: LOG.verifier}
STORE = tiles.append(0, {}, [leaf_hash(bytes([i])) for i in range(20)])


def read(nodes: object) -> list[bytes]:
    return tiles.read_nodes(nodes, STORE)  # type: ignore[arg-type]


def note_of(size: int, signer: Signer = LOG) -> str:
    return sign_note(Checkpoint(LOG.name, size, tree_root(size, read)).text, signer)


def body(old: int, size: int, signer: Signer = LOG) -> bytes:
    return add_checkpoint_body(old, consistency_proof(old, size, read) if old else [], note_of(size, signer))


def records(size: int) -> dict[str, tuple[int, bytes]]:
    return {LOG.name: (size, tree_root(size, read))}


def test_a_first_checkpoint_is_cosigned_and_recorded() -> None:
    answer = decide(body(0, 7), LOGS, {}, WITNESS, 1700000000)
    assert answer.status == 200 and answer.record == (LOG.name, 7, tree_root(7, read))
    assert answer.body.startswith("\u2014 witness.example/w1 ") and answer.body.endswith("\n")
    assert note_signed_by(parse_note(note_of(7) + answer.body), WITNESS.verifier)


def test_a_consistent_extension_is_cosigned() -> None:
    answer = decide(body(7, 20), LOGS, records(7), WITNESS, 1700000001)
    assert answer.status == 200 and answer.record is not None and answer.record[1] == 20


def test_unknown_origin_is_404_and_a_bad_signature_403() -> None:
    assert decide(body(0, 3), {}, {}, WITNESS, 1).status == 404
    other = Signer(LOG.name, bytes(32))  # same name, another key: no trusted signature
    assert decide(body(0, 3, other), LOGS, {}, WITNESS, 1).status == 403
    forged = body(0, 3).replace(b"\n3\n", b"\n4\n", 1)
    assert decide(forged, LOGS, {}, WITNESS, 1).status == 403


def test_old_size_not_the_recorded_one_is_409_with_the_size() -> None:
    answer = decide(body(5, 20), LOGS, records(7), WITNESS, 1)
    assert (answer.status, answer.body, answer.content_type, answer.record) == (409, "7\n", SIZE_TYPE, None)
    answer = decide(body(0, 20), LOGS, records(7), WITNESS, 1)
    assert (answer.status, answer.body) == (409, "7\n")


def test_bad_requests_are_400() -> None:
    assert decide(b"not a request", LOGS, {}, WITNESS, 1).status == 400
    assert decide(add_checkpoint_body(9, [], note_of(3)), LOGS, records(9), WITNESS, 1).status == 400
    assert decide(b"old 01\n\n" + note_of(3).encode(), LOGS, {}, WITNESS, 1).status == 400


def test_bad_proofs_are_422() -> None:
    good = consistency_proof(7, 20, read)
    broken = [good[0][:-1] + bytes([good[0][-1] ^ 1]), *good[1:]]
    assert decide(add_checkpoint_body(7, broken, note_of(20)), LOGS, records(7), WITNESS, 1).status == 422
    with_proof = add_checkpoint_body(0, good, note_of(20))
    assert decide(with_proof, LOGS, {}, WITNESS, 1).status == 422  # a proof from size 0 must be empty
    # the same size and root with a proof: between equal sizes it is empty
    assert decide(add_checkpoint_body(20, good[:1], note_of(20)), LOGS, records(20), WITNESS, 1).status == 422
    empty = sign_note(Checkpoint(LOG.name, 0, leaf_hash(b"not empty")).text, LOG)
    assert decide(add_checkpoint_body(0, [], empty), LOGS, {}, WITNESS, 1).status == 422
    ok_empty = sign_note(Checkpoint(LOG.name, 0, EMPTY_ROOT).text, LOG)
    assert decide(add_checkpoint_body(0, [], ok_empty), LOGS, {}, WITNESS, 1).status == 200


def test_the_same_size_with_another_root_is_a_409_conflict() -> None:
    """c2sp.org/tlog-witness: "If the old size matches the checkpoint size, the witness MUST check
    that the root hashes are also identical. If they don't match, the witness MUST respond with a
    '409 Conflict'" (a fork); its body is no size, so a submitter does not retry from it."""
    fork = {LOG.name: (20, leaf_hash(b"fork"))}
    answer = decide(add_checkpoint_body(20, [], note_of(20)), LOGS, fork, WITNESS, 1)
    assert (answer.status, answer.body, answer.record) == (409, "same size, another root\n", None)
    assert not answer.body.strip().isdigit()


def test_a_repeat_of_the_recorded_checkpoint_is_cosigned_again() -> None:
    answer = decide(add_checkpoint_body(20, [], note_of(20)), LOGS, records(20), WITNESS, 5)
    assert answer.status == 200


def fsyncs_recorded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every os.fsync from now on, as "dir" or "file" (the real fsync still runs)."""
    seen: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        seen.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return seen


def test_the_witness_records_durably_before_it_cosigns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A witness that forgot its record after a crash could cosign a rollback: the state file is
    fsynced, renamed over the old one and then its directory fsynced (the rename is the directory's)."""
    state = WitnessState(tmp_path / "witness")
    seen = fsyncs_recorded(monkeypatch)
    status, _, _ = state.add_checkpoint(body(0, 7), LOGS, WITNESS)
    assert status == 200
    assert seen == ["file", "dir"]
    assert json.loads((tmp_path / "witness" / "state.json").read_text()) == {
        LOG.name: {"size": 7, "root": b64(tree_root(7, read))}
    }
    assert sorted(p.name for p in (tmp_path / "witness").iterdir()) == ["lock", "state.json"]
    # a refusal writes nothing
    status, _, _ = state.add_checkpoint(body(3, 9), LOGS, WITNESS)
    assert status == 409 and seen == ["file", "dir"]


def test_only_cosignatures_that_verify_are_served_and_named() -> None:
    """db.receipt_log.witnessed: of the lines kept for a checkpoint, the ones that verify against a
    configured witness's key, and those witnesses' names (what the checkpoint, proofs and the console's
    overview show); a line in a configured witness's name with a signature no key made, and a line of a
    witness no longer configured, are left out."""
    from effect_ledger.db.receipt_log import Witness, Witnesses, witnessed
    from effect_ledger.domain.note import Signature, cosign

    text = Checkpoint(LOG.name, 7, tree_root(7, read)).text
    note = sign_note(text, LOG)
    other = Signer("witness.example/w2", bytes(range(2, 34)), ALG_COSIGNATURE_V1)
    real = cosign(text, WITNESS, 1_700_000_000).line
    forged = Signature(WITNESS.name, WITNESS.verifier.key_id, bytes(72)).line
    unconfigured = cosign(text, other, 1_700_000_000).line
    config = Witnesses([Witness("http://w1", WITNESS.verifier.vkey, WITNESS.verifier)], quorum=1)
    assert witnessed(note, forged + real + unconfigured, config) == (real, (WITNESS.name,))
    assert witnessed(note, forged + unconfigured, config) == ("", ())
