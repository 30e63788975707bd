"""Offline verification of receipts-log proof files (API.md section 14), with no server dependency:
`effect-ledger-verify PROOF_FILE --vkey VKEY [--witness VKEY …] [--quorum n] [--receipt FILE]`, and the
same as `verify_proof_file`. Exit 0 and one line when it holds; exit 1 and the first reason when not.

`effect-ledger-verify --consistency OLD NEW PROOF --vkey VKEY [--witness VKEY …] [--quorum n]` (and
`verify_consistency_files`): that the log only grew between two signed checkpoints an auditor holds
(each a checkpoint file from GET /v1/log/checkpoint, or a proof file, whose checkpoint is taken), with
the consistency proof from GET /v1/log/consistency?from=OLD_SIZE&to=NEW_SIZE."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from effect_ledger.domain.receipt_log import (
    Consistent,
    ProofInvalid,
    Verified,
    verify_consistency_of,
    verify_proof,
)

__all__ = [
    "Consistent",
    "ProofInvalid",
    "Verified",
    "main",
    "verify_consistency_files",
    "verify_consistency_of",
    "verify_proof",
    "verify_proof_file",
]


def verify_proof_file(
    proof: str | Path,
    vkey: str,
    witnesses: Sequence[str] = (),
    quorum: int | None = None,
    receipt: str | Path | None = None,
) -> Verified:
    """Verify a `.tlog-proof` file (and optionally the receipt JSON file) against pinned keys; raises
    ProofInvalid with the first reason it does not hold. `vkey` may be GET /v1/log/key's JSON saved to
    a file: its witnesses and quorum are then pinned too, unless `witnesses` are given."""
    text = _read(proof, "proof file")
    shown: Any = None
    if receipt is not None:
        given = _read(receipt, "receipt file")
        try:
            shown = json.loads(given)
        except ValueError as exc:
            raise ProofInvalid("the receipt file is not JSON") from exc
        if isinstance(shown, dict) and "operation_id" in shown and "receipt" in shown:
            shown = shown["receipt"]  # an operation view saved whole (a receipt has no operation_id)
        if shown is None:  # `null`: a failed read saved by `jq .receipt`, or a purged receipt's view
            raise ProofInvalid("the receipt file holds no receipt (null), so nothing was checked")
    key, pinned, needed = _pins(vkey, witnesses, quorum)
    return verify_proof(text, key, pinned, needed, shown)


def verify_consistency_files(
    old: str | Path,
    new: str | Path,
    proof: str | Path,
    vkey: str,
    witnesses: Sequence[str] = (),
    quorum: int | None = None,
) -> Consistent:
    """Verify that the checkpoint in file `new` extends the one in file `old` (each a checkpoint or a
    proof file) by the consistency proof in file `proof`; raises ProofInvalid with the first reason.
    `vkey` as verify_proof_file takes it."""
    older, newer = _read(old, "old checkpoint file"), _read(new, "new checkpoint file")
    hashes = _read(proof, "consistency proof file")
    key, pinned, needed = _pins(vkey, witnesses, quorum)
    return verify_consistency_of(older, newer, hashes, key, pinned, needed)


def _read(path: str | Path, what: str) -> str:
    """A file's text; one that is not UTF-8 is a ProofInvalid naming it (until round 36, a traceback)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ProofInvalid(f"the {what} is not UTF-8 text") from exc


def _pins(vkey: str, witnesses: Sequence[str], quorum: int | None) -> tuple[str, list[str], int | None]:
    """The log's key, the witnesses' keys and the quorum to check with: as given, and where `vkey` is
    GET /v1/log/key's JSON and no witness is given, its witnesses and its quorum (unless `quorum` is):
    the README's session pins all four in key.json (until round 36 only its vkey was read, and a proof
    without the pinned witnesses' cosignatures verified)."""
    key, document = _key_given(vkey)
    if witnesses:
        return key, [_key(w) for w in witnesses], quorum
    if document is None or not document.get("witnesses"):
        return key, [], quorum
    try:
        pinned = [str(w["vkey"]) for w in document["witnesses"]]
        needed = int(document.get("quorum", len(pinned))) if quorum is None else quorum
    except (TypeError, KeyError, ValueError) as exc:
        raise ProofInvalid("the key file's witnesses are not GET /v1/log/key's") from exc
    return key, pinned, needed


def _key_given(value: str) -> tuple[str, dict[str, Any] | None]:
    """A vkey given inline, or the path of a file holding it, read once; with GET /v1/log/key's JSON
    in that file, the vkey and the whole document (its witnesses and quorum, for _pins)."""
    path = Path(value)
    if "+" in value or not path.is_file():
        return value, None
    text = _read(path, "key file").strip()
    if not text.startswith("{"):
        return text, None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ProofInvalid("the key file is not JSON") from exc
    if not isinstance(document, dict) or not isinstance(document.get("vkey"), str):
        raise ProofInvalid('the key file has no "vkey"')
    return document["vkey"], document


def _key(value: str) -> str:
    """A vkey given inline, or the path of a file holding it (or GET /v1/log/key's JSON)."""
    return _key_given(value)[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="effect-ledger-verify", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("proof", nargs="?", help="the c2sp.org/tlog-proof@v1 file (GET /v1/log/proof)")
    parser.add_argument(
        "--consistency",
        nargs=3,
        metavar=("OLD", "NEW", "PROOF"),
        help="instead: the older and the newer checkpoint (or proof files) and the consistency proof",
    )
    parser.add_argument("--vkey", required=True, help="the log's verifier key (or a file holding it)")
    parser.add_argument("--witness", action="append", default=[], help="a witness's vkey (repeatable)")
    parser.add_argument("--quorum", type=int, help="cosignatures needed (default: every --witness)")
    parser.add_argument(
        "--receipt", help="the receipt JSON (or the operation view) to check against the leaf"
    )
    args = parser.parse_args(argv)
    if (args.proof is None) == (args.consistency is None):
        parser.error("give a proof file, or --consistency OLD NEW PROOF")
    if args.consistency is not None and args.receipt is not None:
        parser.error("--receipt goes with a proof file, not with --consistency")
    try:
        if args.consistency is not None:
            old, new, proof = args.consistency
            line = verify_consistency_files(old, new, proof, args.vkey, args.witness, args.quorum).line
        else:
            line = verify_proof_file(args.proof, args.vkey, args.witness, args.quorum, args.receipt).line
    except (ProofInvalid, OSError) as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    print(line)
    return 0
