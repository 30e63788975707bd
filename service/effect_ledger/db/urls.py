"""Connection URLs: the owner URL from settings, and the role URLs derived from it."""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

RUNTIME_ROLE = "effect_ledger_runtime"
READER_ROLE = "effect_ledger_diag_reader"


def sqlalchemy_url(url: str) -> str:
    """The same URL for SQLAlchemy's psycopg 3 dialect."""
    scheme, _, rest = url.partition("://")
    if scheme in ("postgres", "postgresql", "postgresql+psycopg"):
        return "postgresql+psycopg://" + rest
    raise ValueError("database URLs must start with postgresql://")


def derived_password(owner_url: str, role: str) -> str:
    """A role password derived from the owner's credentials, so `migrate` and `serve` agree on it.

    Whoever knows the owner URL is already the owner; the database name is left out so that every
    database of one cluster (roles are cluster-wide) derives the same password.
    """
    parts = urlsplit(owner_url)
    key = f"{parts.username}:{parts.password}@{parts.hostname}:{parts.port}".encode()
    return hmac.new(key, b"effect-ledger/role-password\0" + role.encode(), hashlib.sha256).hexdigest()
