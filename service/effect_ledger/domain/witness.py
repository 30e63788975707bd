"""c2sp.org/tlog-witness add-checkpoint: the request format and the witness's decision (no I/O).

`decide` takes the witness's recorded (size, root) for the origin and the request body and answers
the HTTP status, the body and the new record: every answer code of the spec (400, 403, 404, 409,
422, 200). The caller persists the new record before answering, atomically with the check.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from effect_ledger.domain.merkle import EMPTY_ROOT, verify_consistency
from effect_ledger.domain.note import (
    NoteError,
    Signer,
    Verifier,
    b64,
    cosign,
    note_signed_by,
    parse_checkpoint,
    parse_note,
    parse_vkey,
    unb64,
)

MAX_PROOF_LINES = 63
SIZE_TYPE = "text/x.tlog.size"


def parse_witnesses(text: str) -> list[tuple[str, str, Verifier]]:
    """LOG_WITNESSES: a JSON list of {"url": str, "vkey": a signed-note verifier key}, as (url, vkey,
    its parsed key); raises ValueError (NoteError for a key) naming what is wrong."""
    configured = json.loads(text or "[]")
    if not isinstance(configured, list) or not all(
        isinstance(w, dict) and isinstance(w.get("url"), str) and isinstance(w.get("vkey"), str)
        for w in configured
    ):
        raise ValueError('must be a JSON list of {"url": …, "vkey": …}')
    return [(w["url"], w["vkey"], parse_vkey(w["vkey"])) for w in configured]


def add_checkpoint_body(old: int, proof: Sequence[bytes], checkpoint_note: str) -> bytes:
    """The request body: `old N`, the proof lines, an empty line, the signed checkpoint."""
    lines = [f"old {old}", *(b64(h) for h in proof)]
    return ("\n".join(lines) + "\n\n" + checkpoint_note).encode()


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: str
    content_type: str = "text/plain; charset=utf-8"
    record: tuple[str, int, bytes] | None = None  # (origin, size, root) to persist before answering


def _parse(body: bytes) -> tuple[int, list[bytes], str]:
    text = body.decode("utf-8")
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise NoteError("no empty line before the checkpoint")
    lines = head.split("\n")
    if not lines[0].startswith("old "):
        raise NoteError("no old size line")
    old_text = lines[0][4:]
    if not old_text.isdigit() or not old_text.isascii() or (old_text != "0" and old_text[0] == "0"):
        raise NoteError("old size not a decimal")
    proof = [unb64(line) for line in lines[1:]]
    if len(proof) > MAX_PROOF_LINES or any(len(p) != 32 for p in proof):
        raise NoteError("bad consistency proof lines")
    return int(old_text), proof, note


def decide(
    body: bytes,
    logs: Mapping[str, Verifier],
    records: Mapping[str, tuple[int, bytes]],
    cosigner: Signer,
    now: int,
) -> Answer:
    """The witness's answer to one add-checkpoint request."""
    try:
        old, proof, note_text = _parse(body)
        note = parse_note(note_text)
        checkpoint = parse_checkpoint(note.text)
    except (NoteError, UnicodeDecodeError):
        return Answer(400, "malformed request\n")
    key = logs.get(checkpoint.origin)
    if key is None:
        return Answer(404, "unknown log origin\n")
    if not note_signed_by(note, key):
        return Answer(403, "checkpoint not signed by the log's key\n")
    if old > checkpoint.size:
        return Answer(400, "old size above the checkpoint size\n")
    size, root = records.get(checkpoint.origin, (0, EMPTY_ROOT))
    if old != size:
        return Answer(409, f"{size}\n", SIZE_TYPE)
    if checkpoint.size == 0 and checkpoint.root != EMPTY_ROOT:
        return Answer(422, "a size 0 checkpoint has the empty tree's root\n")
    if old == 0:
        if proof:
            return Answer(422, "a proof from size 0 must be empty\n")
    elif old == checkpoint.size:
        if checkpoint.root != root:  # a fork: c2sp.org/tlog-witness answers it 409 Conflict
            return Answer(409, "same size, another root\n")
        if proof:  # from a size to itself the consistency proof is empty
            return Answer(422, "a proof between equal sizes must be empty\n")
    elif not verify_consistency(old, checkpoint.size, root, checkpoint.root, proof):
        return Answer(422, "consistency proof does not verify\n")
    line = cosign(note.text, cosigner, now).line
    return Answer(200, line, record=(checkpoint.origin, checkpoint.size, checkpoint.root))
