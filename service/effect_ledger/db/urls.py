"""Connection URLs: the owner URL from settings, the role URLs derived from it, and several hosts.

A URL may name several hosts, libpq style (`postgresql://u:p@h1:5432,h2:5432/db?target_session_attrs=
read-write`): asyncpg and libpq try them in order and keep the first that is writable. The service
only ever works on the writable primary (it writes on every path, and a standby's reads may be
stale), so every URL it connects with asks for `read-write` unless it already asks for `primary`.

asyncpg (0.32, read in its connect_utils) tries the hosts in order: a refused or unreachable host,
or one answering "starting up / shutting down" (57P03) before authentication, passes to the next;
a connected server is accepted for `read-write` when neither `default_transaction_read_only` nor
`in_hot_standby` (reported by PostgreSQL 14+ at start-up; older servers are asked
`pg_is_in_recovery()`) is on; rejected ones are closed; no match raises
TargetServerAttributeNotMatched, which the service answers 503. libpq (psycopg, for `migrate`) does
the same with its own parser.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

RUNTIME_ROLE = "effect_ledger_runtime"
READER_ROLE = "effect_ledger_diag_reader"

WRITABLE_TARGETS = ("read-write", "primary")
TARGET_SESSION_ATTRS = "target_session_attrs"


def sqlalchemy_url(url: str) -> str:
    """The same URL for SQLAlchemy's psycopg 3 dialect (one host; see libpq_url for several)."""
    scheme, _, rest = url.partition("://")
    if scheme in ("postgres", "postgresql", "postgresql+psycopg"):
        return "postgresql+psycopg://" + rest
    raise ValueError("database URLs must start with postgresql://")


def libpq_url(url: str) -> str:
    """The URL as libpq (psycopg) reads it, several hosts included, asking for the writable one."""
    scheme, _, rest = writable_url(url).partition("://")
    if scheme in ("postgres", "postgresql", "postgresql+psycopg"):
        return "postgresql://" + rest
    raise ValueError("database URLs must start with postgresql://")


def _netloc_parts(url: str) -> tuple[str, str, str]:
    """(user, password, host list) of a URL's authority, the host list as written (`h1:5432,h2`)."""
    netloc = urlsplit(url).netloc
    credentials, _, hosts = netloc.rpartition("@")
    user, _, password = credentials.partition(":")
    return unquote(user), unquote(password), hosts


def credentials(url: str) -> tuple[str, str]:
    """(user, password) of a URL: the authority's, else the `user` and `password` query parameters,
    which libpq and asyncpg take as well (`postgresql://db/ledger?user=owner&password=…`). Until round
    24 only the authority's were read: with the password in the query, the role passwords were derived
    from the user name alone, which anyone who knows it could compute."""
    user, password, _ = _netloc_parts(url)
    query = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))
    return user or query.get("user", ""), password or query.get("password", "")


def hosts(url: str) -> list[str]:
    """The `host:port` entries a URL names, in order (a socket directory in `?host=` counts as one)."""
    listed = _netloc_parts(url)[2]
    if listed:
        return listed.split(",")
    query = dict(parse_qsl(urlsplit(url).query))
    return [query.get("host", "localhost")]


def writable_url(url: str) -> str:
    """`url` with `target_session_attrs=read-write` added when it names none.

    A URL asking for anything the service cannot work on (`read-only`, `standby`, `prefer-standby`,
    `any` with several hosts) is refused: connecting there would turn every write into a failure
    and every read into a possibly stale answer."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    wanted = [value for key, value in query if key == TARGET_SESSION_ATTRS]
    if not wanted:  # appended to the query as written: nothing else is re-encoded
        added = f"{TARGET_SESSION_ATTRS}=read-write"
        return urlunsplit(parts._replace(query=f"{parts.query}&{added}" if parts.query else added))
    if wanted[-1] in WRITABLE_TARGETS or (wanted[-1] == "any" and len(hosts(url)) == 1):
        return url
    raise ValueError(
        f"{TARGET_SESSION_ATTRS}={wanted[-1]}: the service needs the writable primary (read-write or primary)"
    )


def derived_password(owner_url: str, role: str) -> str:
    """A role password derived from the owner's credentials, so `migrate` and `serve` agree on it.

    Whoever knows the owner URL is already the owner. Neither the hosts nor the database are part
    of it: roles are cluster-wide, and the same cluster reached through another address, another
    host list or a promoted standby must derive the same password (`migrate` against the primary,
    `serve` against `primary,standby` with target_session_attrs).
    """
    user, password = credentials(owner_url)
    key = f"{user}:{password}".encode()
    return hmac.new(key, b"effect-ledger/role-password\0" + role.encode(), hashlib.sha256).hexdigest()
