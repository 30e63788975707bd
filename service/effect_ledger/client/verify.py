"""Offline verification of receipts-log proof files (API.md section 14), with no server dependency:
`effect-ledger-verify PROOF_FILE --vkey VKEY [--witness VKEY …] [--quorum n] [--receipt FILE]`, and the
same as `verify_proof_file`. Exit 0 and one line when it holds; exit 1 and the first reason when not."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from effect_ledger.domain.receipt_log import ProofInvalid, Verified, verify_proof

__all__ = ["ProofInvalid", "Verified", "main", "verify_proof", "verify_proof_file"]


def verify_proof_file(
    proof: str | Path,
    vkey: str,
    witnesses: Sequence[str] = (),
    quorum: int | None = None,
    receipt: str | Path | None = None,
) -> Verified:
    """Verify a `.tlog-proof` file (and optionally the receipt JSON file) against pinned keys; raises
    ProofInvalid with the first reason it does not hold."""
    text = Path(proof).read_text(encoding="utf-8")
    shown: Any = None
    if receipt is not None:
        try:
            shown = json.loads(Path(receipt).read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ProofInvalid("the receipt file is not JSON") from exc
        if isinstance(shown, dict) and isinstance(shown.get("receipt"), dict):
            shown = shown["receipt"]  # an operation view saved whole: its receipt member
    return verify_proof(text, _key(vkey), [_key(w) for w in witnesses], quorum, shown)


def _key(value: str) -> str:
    """A vkey given inline, or the path of a file holding it (or GET /v1/log/key's JSON)."""
    path = Path(value)
    if "+" not in value and path.is_file():
        text = path.read_text(encoding="utf-8").strip()
        if text.startswith("{"):
            return str(json.loads(text)["vkey"])
        return text
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="effect-ledger-verify", description=__doc__)
    parser.add_argument("proof", help="the c2sp.org/tlog-proof@v1 file (GET /v1/log/proof)")
    parser.add_argument("--vkey", required=True, help="the log's verifier key (or a file holding it)")
    parser.add_argument("--witness", action="append", default=[], help="a witness's vkey (repeatable)")
    parser.add_argument("--quorum", type=int, help="cosignatures needed (default: every --witness)")
    parser.add_argument(
        "--receipt", help="the receipt JSON (or the operation view) to check against the leaf"
    )
    args = parser.parse_args(argv)
    try:
        verified = verify_proof_file(args.proof, args.vkey, args.witness, args.quorum, args.receipt)
    except (ProofInvalid, OSError) as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    print(verified.line)
    return 0
