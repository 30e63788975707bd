"""The verifiable receipts log (API.md section 14) in the client: an auditor's calls, and the two
checks an auditor makes with what it fetched, offline, against keys it pinned out of band.

`client.log` is a ReceiptsLog over the client's connection, token and retry policy. The fetches
answer the service's texts as they are (checkpoints, proof files, consistency proofs: keep them, they
verify later with `effect-ledger-verify` and no service). `prove_receipt` and `prove_growth` fetch
and verify in one call, always against the `vkey` (and witnesses) the caller passes: the key the
service shows (`key()`) is for pinning once, never for checking the same service's answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

from msgspec import Struct

from effect_ledger.client.transport import Transport
from effect_ledger.domain.note import NoteError
from effect_ledger.domain.receipt_log import (
    Consistent,
    ProofInvalid,
    Verified,
    checkpoint_note_of,
    checkpoint_of,
    verify_consistency_of,
    verify_proof,
)

__all__ = ["Consistent", "LogKey", "LogWitness", "ProofInvalid", "ReceiptsLog", "Verified"]


class LogWitness(Struct, kw_only=True):
    """A witness the service submits checkpoints to: its name and verifier key."""

    name: str
    vkey: str


class LogKey(Struct, kw_only=True):
    """GET /v1/log/key: the tenant's log origin, verifier key, witnesses and quorum (pin them)."""

    origin: str
    vkey: str
    witnesses: list[LogWitness]
    quorum: int


class ReceiptsLog:
    """The caller's tenant's receipts log (scope `ledger:audit`)."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    async def key(self) -> LogKey:
        """The log's verifier key, witnesses and quorum, to pin out of band once."""
        return self._client.decode(await self._client.request("GET", "/v1/log/key"), LogKey)

    async def checkpoint(self) -> str:
        """The latest signed checkpoint with its witness cosignatures (a signed note); NotFound until
        the first receipt is logged."""
        return (await self._client.request("GET", "/v1/log/checkpoint")).text

    async def proof(self, operation_id: str) -> str:
        """A committed operation's c2sp.org/tlog-proof@v1 file; NotYetLogged (with its Retry-After)
        until a checkpoint covers it."""
        response = await self._client.request("GET", "/v1/log/proof", params={"operation_id": operation_id})
        return response.text

    async def consistency(self, old_size: int, new_size: int | None = None) -> str:
        """The consistency proof (one base64 hash a line) from `old_size` to `new_size` (the size of a
        checkpoint the caller holds), or to the current checkpoint's size."""
        params: dict[str, str | int] = {"from": old_size}
        if new_size is not None:
            params["to"] = new_size
        return (await self._client.request("GET", "/v1/log/consistency", params=params)).text

    async def prove_receipt(
        self, operation_id: str, vkey: str, witnesses: Sequence[str] = (), quorum: int | None = None
    ) -> Verified:
        """Fetch the operation's proof file and its receipt, and verify both against the pinned keys:
        the checkpoint's signature and cosignatures, the inclusion proof, and that the receipt the
        service shows is the one the log committed to. Raises ProofInvalid with the first reason."""
        proof = await self.proof(operation_id)
        # the view's JSON as the service sent it: the digest is over its exact texts (a decoded
        # and re-encoded timestamp could differ from the one the service hashed)
        view = await self._client.request("GET", f"/v1/operations/{quote(operation_id, safe='')}")
        receipt = view.json().get("receipt")
        if receipt is None:  # a purged receipt's view, or a service that hides it: nothing to check
            raise ProofInvalid(f"the service shows no receipt for {operation_id!r}, so it was not checked")
        return verify_proof(proof, vkey, witnesses, quorum, receipt)

    async def prove_growth(
        self, held: str, vkey: str, witnesses: Sequence[str] = (), quorum: int | None = None
    ) -> tuple[str, Consistent]:
        """From a checkpoint the caller holds (a signed note or a proof file), to the current one: fetch
        it and the consistency proof between the two sizes, and verify that the log only grew. Answers
        the current checkpoint (keep it for the next call) and what was proved; raises ProofInvalid."""
        current = await self.checkpoint()
        try:  # the sizes choose what to fetch; the signatures are checked below
            old_size = checkpoint_of(checkpoint_note_of(held)).size
            new_size = checkpoint_of(current).size
        except NoteError as exc:
            raise ProofInvalid(str(exc)) from exc
        # a smaller current tree has no proof to ask for: the check names the shrink
        proof = await self.consistency(old_size, new_size) if new_size >= old_size else ""
        return current, verify_consistency_of(held, current, proof, vkey, witnesses, quorum)
