"""The claim command (docs/api.md section 6). The claim rules themselves are executed once, by the
database function ledger.claim (alembic/functions/10_claim.sql); domain/outcomes.py builds the answer."""

from __future__ import annotations

from dataclasses import dataclass

from effect_ledger.domain.model import Binding


@dataclass(frozen=True, slots=True)
class AttemptMaterial:
    """The new attempt's secrets as stored: the token's hash and, with a nonce, the sealed token."""

    token_hash: bytes
    sealed_token: bytes | None


NO_MATERIAL = AttemptMaterial(b"", None)


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """The claim command: what the executor asked for, with tenant and principal from the token.

    `material` is the token the claim grants if it grants one (made before the one round trip);
    `submit` asks for pending -> submitted in the same transaction when an attempt is granted.
    """

    operation_id: str
    binding: Binding
    lease_seconds: int
    nonce_hash: bytes | None
    material: AttemptMaterial = NO_MATERIAL
    submit: bool = False
    effect_ref: str | None = None
