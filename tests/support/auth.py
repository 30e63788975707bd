"""The tests' signing secret and tokens minted with it."""

from __future__ import annotations

from effect_ledger.http.auth import ALL_SCOPES, mint_token
from effect_ledger.settings import Settings

TEST_SECRET = "test-secret-for-effect-ledger-tests-only-0123456789-abcdefghijklmnopqrstuvwxyz"


def token(
    tenant: str = "t1", sub: str = "exec-1", scope: str = " ".join(ALL_SCOPES), ttl: int = 6 * 3600
) -> str:
    """A valid test token; it outlives any run, because modules mint theirs at import."""
    return mint_token(TEST_SECRET, tenant, sub, scope, Settings(), ttl)


def auth(tenant: str = "t1", sub: str = "exec-1", scope: str = " ".join(ALL_SCOPES)) -> dict[str, str]:
    """Authorization headers for a test caller."""
    return {"Authorization": f"Bearer {token(tenant, sub, scope)}"}
