"""Signed notes, checkpoints, cosignatures and proof files against the published vectors: the
c2sp.org/signed-note example, the golang.org/x/mod/sumdb/note PeterNeumann key (Ed25519 is
deterministic, so signing must reproduce the published note byte for byte)."""

from __future__ import annotations

import pytest

from effect_ledger.domain import note
from effect_ledger.domain.merkle import inclusion_proof, leaf_hash, naive_root
from effect_ledger.domain.note import (
    Checkpoint,
    NoteError,
    cosign,
    note_signed_by,
    parse_checkpoint,
    parse_note,
    parse_skey,
    parse_vkey,
    sign_note,
)
from effect_ledger.domain.receipt_log import ProofInvalid, proof_file, verify_proof

EM = "\u2014"
SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = (
    "This is an example message.\n\n"
    f"{EM} example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
)
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
)
GO_NOTE = (
    GO_TEXT
    + "\n"
    + f"{EM} PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)


def test_the_signed_note_spec_example_verifies() -> None:
    key = parse_vkey(SPEC_VKEY)
    assert key.name == "example.com/foo" and key.key_id.hex() == "530d903a"
    parsed = parse_note(SPEC_NOTE)
    assert parsed.text == "This is an example message.\n"
    assert note_signed_by(parsed, key)
    tampered = parse_note(SPEC_NOTE.replace("example message", "exemple message"))
    assert not note_signed_by(tampered, key)


def test_go_reference_key_signs_the_published_note_byte_for_byte() -> None:
    signer = parse_skey(GO_SKEY)
    assert signer.verifier.vkey == GO_VKEY
    assert note.format_skey(signer) == GO_SKEY
    assert sign_note(GO_TEXT, signer) == GO_NOTE
    assert note_signed_by(parse_note(GO_NOTE), parse_vkey(GO_VKEY))


def test_unknown_keys_are_ignored_and_a_failing_known_one_rejects() -> None:
    other = parse_vkey(SPEC_VKEY)
    assert not note_signed_by(parse_note(GO_NOTE), other)  # no signature of this key at all
    bad = GO_NOTE.replace("x08go", "x08gp")
    assert not note_signed_by(parse_note(bad), parse_vkey(GO_VKEY))


@pytest.mark.parametrize(
    "vkey",
    [
        "PeterNeumann+c74f20a4+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # wrong key ID
        "PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==",  # wrong length
        "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # unknown algorithm
        "Peter Neumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        "PeterNeumann+c74f20a3",
    ],
)
def test_malformed_vkeys_are_refused(vkey: str) -> None:
    with pytest.raises(NoteError):
        parse_vkey(vkey)


@pytest.mark.parametrize(
    "text",
    [
        "no blank line\n" + f"{EM} a AAAAAAA=\n",
        "text\n\nnot a signature\n",
        "text\n\n",
        "tab\there\n\n"
        + f"{EM} PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n",
        GO_NOTE[:-1],
    ],
)
def test_malformed_notes_are_refused(text: str) -> None:
    with pytest.raises(NoteError):
        parse_note(text)


def test_checkpoint_body_and_the_spec_example() -> None:
    body = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    cp = parse_checkpoint(body)
    assert (cp.origin, cp.size) == ("example.com/behind-the-sofa", 20852163)
    assert cp.text == body
    assert parse_checkpoint(body + "extension\n").size == 20852163
    for bad in ("o\n01\n" + body.split("\n")[2] + "\n", "o\n1\nAAAA\n", "o\n1\n", "o\n-1\nAAAA\n"):
        with pytest.raises(NoteError):
            parse_checkpoint(bad)


def test_cosignature_v1_signs_the_header_time_and_body() -> None:
    signer = parse_skey(GO_SKEY)
    witness = note.Signer("witness.example/w1", bytes(range(32)), note.ALG_COSIGNATURE_V1)
    body = Checkpoint("example.com/log", 5, bytes(32)).text
    signed = sign_note(body, signer)
    line = cosign(body, witness, 1679315147)
    assert len(line.sig) == 72 and line.sig[:8] == (1679315147).to_bytes(8, "big")
    assert witness.verifier.key_id == note.key_id(witness.name, 0x04, witness.public)
    message = b"cosignature/v1\ntime 1679315147\n" + body.encode()
    assert witness.verifier.verify(message, line.sig[8:])
    full = parse_note(signed + line.line)
    assert note_signed_by(full, parse_vkey(witness.verifier.vkey))
    assert note_signed_by(full, parse_vkey(GO_VKEY))
    later = note.Signature(line.name, line.key_id, (1679315148).to_bytes(8, "big") + line.sig[8:])
    assert not note_signed_by(parse_note(signed + later.line), witness.verifier)


def _leaf(index: int) -> bytes:
    from datetime import UTC, datetime

    from effect_ledger.domain.receipt_log import LeafFacts, leaf_data

    facts = LeafFacts(
        "t1", f"op-{index}", "exec-1", "measure", "1", "sha256:" + "0" * 64, 1,
        "sha256:" + "1" * 64, "2" * 64, datetime(2026, 12, 1, tzinfo=UTC),
    )  # fmt: skip
    return leaf_data(facts, index, bytes(32))


def test_a_proof_file_verifies_offline_and_every_change_is_caught() -> None:
    signer = parse_skey(GO_SKEY)
    log_signer = note.Signer("effect-ledger.local/t1", bytes(range(1, 33)))
    data = [_leaf(i) for i in range(5)]
    hashes = [leaf_hash(d) for d in data]
    store = {(0, 0): b"".join(hashes)}
    from effect_ledger.domain import tiles

    def read(nodes: object) -> list[bytes]:
        return tiles.read_nodes(nodes, store)  # type: ignore[arg-type]

    root = naive_root(hashes)
    cp = sign_note(Checkpoint(log_signer.name, 5, root).text, log_signer)
    text = proof_file(data[3], 3, inclusion_proof(3, 5, read), cp)
    vkey = log_signer.verifier.vkey
    ok = verify_proof(text, vkey)
    assert (ok.index, ok.size, ok.operation_id) == (3, 5, "op-3")
    assert ok.line.startswith("OK effect-ledger.local/t1 index 3 of 5")
    with pytest.raises(ProofInvalid, match="not signed"):
        verify_proof(text, note.Signer(log_signer.name, bytes(32)).verifier.vkey)  # same name, other key
    with pytest.raises(ProofInvalid, match="origin"):
        verify_proof(text, signer.verifier.vkey)
    with pytest.raises(ProofInvalid, match="inclusion"):
        verify_proof(proof_file(data[3], 3, inclusion_proof(2, 5, read), cp), vkey)
    with pytest.raises(ProofInvalid, match="index"):
        verify_proof(proof_file(data[3], 2, inclusion_proof(3, 5, read), cp), vkey)
    witness = note.Signer("w.example/1", bytes(range(2, 34)), note.ALG_COSIGNATURE_V1)
    with pytest.raises(ProofInvalid, match="quorum"):
        verify_proof(text, vkey, [witness.verifier.vkey])
    cosigned = proof_file(
        data[3], 3, inclusion_proof(3, 5, read), cp + cosign(cp.split("\n\n")[0] + "\n", witness, 7).line
    )
    assert verify_proof(cosigned, vkey, [witness.verifier.vkey]).cosigned_by == ("w.example/1",)
    # the log's own key given as a witness (either signature type) never counts towards a quorum
    own = note.Signer(log_signer.name, bytes(range(1, 33)), note.ALG_COSIGNATURE_V1)
    for as_witness in (vkey, own.verifier.vkey):
        with pytest.raises(ProofInvalid, match="the log's own key"):
            verify_proof(cosigned, vkey, [witness.verifier.vkey, as_witness], quorum=1)
    # one witness key under a second name is still one witness: a quorum of 2 is not met
    alias = note.Signer("w.example/alias", bytes(range(2, 34)), note.ALG_COSIGNATURE_V1)
    twice = cosigned + cosign(cp.split("\n\n")[0] + "\n", alias, 7).line
    counted = verify_proof(twice, vkey, [witness.verifier.vkey, alias.verifier.vkey], quorum=1)
    assert counted.cosigned_by == ("w.example/1",)  # once, under the first name it was given
    with pytest.raises(ProofInvalid, match="1 witness cosignatures verify, quorum is 2"):
        verify_proof(twice, vkey, [witness.verifier.vkey, alias.verifier.vkey], quorum=2)
    receipt = {"external_ref": "x"}
    with pytest.raises(ProofInvalid, match="receipt_digest"):
        verify_proof(text, vkey, receipt=receipt)


def test_two_checkpoints_an_auditor_holds_are_proved_consistent_offline_and_a_rewrite_is_not() -> None:
    from effect_ledger.domain import tiles
    from effect_ledger.domain.merkle import consistency_proof
    from effect_ledger.domain.note import b64
    from effect_ledger.domain.receipt_log import verify_consistency_of

    log_signer = note.Signer("effect-ledger.local/t1", bytes(range(1, 33)))
    vkey = log_signer.verifier.vkey
    witness = note.Signer("w.example/1", bytes(range(2, 34)), note.ALG_COSIGNATURE_V1)
    data = [_leaf(i) for i in range(13)]
    hashes = [leaf_hash(d) for d in data]
    store = {(0, 0): b"".join(hashes)}

    def read(nodes: object) -> list[bytes]:
        return tiles.read_nodes(nodes, store)  # type: ignore[arg-type]

    def checkpoint(size: int, leaves: list[bytes] = hashes, cosigned: bool = True) -> str:
        signed = sign_note(Checkpoint(log_signer.name, size, naive_root(leaves[:size])).text, log_signer)
        return signed + (cosign(signed.split("\n\n")[0] + "\n", witness, 7).line if cosigned else "")

    def proof(old: int, new: int) -> str:
        return "".join(b64(h) + "\n" for h in consistency_proof(old, new, read))

    witnesses = [witness.verifier.vkey]
    for old, new in ((1, 13), (4, 13), (5, 13), (8, 13), (12, 13), (5, 8), (13, 13)):
        ok = verify_consistency_of(checkpoint(old), checkpoint(new), proof(old, new), vkey, witnesses)
        assert (ok.origin, ok.old_size, ok.new_size, ok.cosigned_by) == (
            log_signer.name,
            old,
            new,
            ("w.example/1",),
        ), (old, new)
    assert ok.line == "OK effect-ledger.local/t1 size 13 -> 13: append-only (witnesses: w.example/1)"
    # the older checkpoint may come as the proof file the auditor kept (its checkpoint is taken)
    kept = proof_file(data[2], 2, inclusion_proof(2, 5, read), checkpoint(5))
    assert verify_consistency_of(kept, checkpoint(13), proof(5, 13), vkey).old_size == 5

    good = proof(5, 13)
    flipped = good.replace(good[0], "A" if good[0] != "A" else "B", 1)
    failures = {
        "does not lead from size 5 to 13": (checkpoint(5), checkpoint(13), flipped),
        "smaller than the old one's": (checkpoint(13), checkpoint(5), proof(5, 13)),
        "line 2 is not a base64 SHA-256 hash": (
            checkpoint(5),
            checkpoint(13),
            good.split("\n")[0] + "\nxyz\n",
        ),
        "old checkpoint: 0 witness cosignatures verify, quorum is 1": (
            checkpoint(5, cosigned=False),
            checkpoint(13),
            good,
        ),
    }
    for reason, (older, newer, text) in failures.items():
        with pytest.raises(ProofInvalid) as caught:
            verify_consistency_of(older, newer, text, vkey, witnesses)
        assert reason in str(caught.value), (reason, caught.value)
    # a rewrite of logged history: leaf 2 changed, the tree re-signed at the same and a larger size
    forged = [*hashes[:2], leaf_hash(b"forged"), *hashes[3:]]
    with pytest.raises(ProofInvalid, match="two different trees of size 5: the log forked"):
        verify_consistency_of(checkpoint(5), checkpoint(5, forged), "", vkey)
    forged_store = {(0, 0): b"".join(forged)}
    forged_proof = "".join(
        b64(h) + "\n"
        for h in consistency_proof(5, 13, lambda nodes: tiles.read_nodes(nodes, forged_store))  # type: ignore[arg-type]
    )
    for text in (good, forged_proof):  # neither the honest proof nor one from the forged tree links them
        with pytest.raises(ProofInvalid, match="does not lead from size 5 to 13"):
            verify_consistency_of(checkpoint(5), checkpoint(13, forged), text, vkey)
    with pytest.raises(ProofInvalid, match="new checkpoint not signed by the log key"):
        other = note.Signer(log_signer.name, bytes(32))
        verify_consistency_of(checkpoint(5), sign_note(parse_note(checkpoint(13)).text, other), good, vkey)
