"""domain/tokens.seal and unseal: the salt, then the token XOR the nonce's pad, byte for byte."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from effect_ledger.domain import tokens


@given(
    st.binary(min_size=tokens.TOKEN_BYTES, max_size=tokens.TOKEN_BYTES),
    st.binary(min_size=tokens.SALT_BYTES, max_size=tokens.SALT_BYTES),
    st.text(min_size=16, max_size=40),
    st.text(min_size=1, max_size=20),
)
def test_seal_is_the_salt_then_the_bytewise_xor_and_unseal_inverts_it(
    raw: bytes, salt: bytes, nonce: str, operation_id: str
) -> None:
    sealed = tokens.seal(raw, nonce, "t1", operation_id, salt)
    pad = tokens._pad(nonce, "t1", operation_id, salt)
    assert sealed == salt + bytes(a ^ b for a, b in zip(raw, pad, strict=True))
    assert tokens.unseal(sealed, nonce, "t1", operation_id) == raw
    assert len(sealed) == tokens.SALT_BYTES + tokens.TOKEN_BYTES
