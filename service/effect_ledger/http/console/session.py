"""The console's sign-in session: a sealed cookie that carries the bearer token, checked on every request.

The cookie holds the token and a per-session CSRF secret, sealed with AES-GCM under a key only the
server knows, so the raw JWT never sits in the browser's cookie jar (or a proxy's log) in clear. On
every request the token inside is verified again by the API's own `TokenVerifier`: the console sees
exactly what the API would, expiry included, and a session ends no later than its token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

import jwt
import structlog
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from litestar import Request, Response
from litestar.datastructures import Cookie

from effect_ledger.domain.errors import LedgerError
from effect_ledger.http.auth import Caller, TokenVerifier, charge

SESSION_COOKIE = "effect_ledger_console"
LOGIN_COOKIE = "effect_ledger_console_login"  # ties the sign-in form's CSRF token to this browser
COOKIE_PATH = "/console"
LOGIN_FORM_SECONDS = 3600
MAX_CONSOLE_TOKEN_BYTES = 2500  # a sealed cookie must stay under the browsers' 4 KiB per cookie
_AAD_SESSION = b"effect-ledger console session v1"
_AAD_LOGIN = b"effect-ledger console login v1"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "[::1]", "localhost"})
CALLER_KEY = "effect_ledger.caller"
log = structlog.get_logger("effect_ledger.console")


def session_key(configured: str | None, jwt_secret: str | None) -> bytes:
    """The 256-bit sealing key: the configured one, else derived from the HS256 secret, else random.

    A random key lives as long as the process: sessions end at a restart, and several workers need
    EFFECT_LEDGER_CONSOLE_SESSION_KEY so that each can open the others' cookies.
    """
    if configured:
        return hashlib.sha256(b"effect-ledger console key\x00" + configured.encode("utf-8")).digest()
    if jwt_secret:
        return hmac.new(jwt_secret.encode("utf-8"), b"effect-ledger console session key", "sha256").digest()
    log.warning(
        "console_session_key_random", hint="set EFFECT_LEDGER_CONSOLE_SESSION_KEY for several workers"
    )
    return secrets.token_bytes(32)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """A signed-in console user: the verified caller, the CSRF secret of the session, and its end."""

    caller: Caller
    csrf: str
    expires_at: int


class Sealer:
    """Seals and opens the console's cookies (AES-GCM, a fresh 96-bit nonce per cookie)."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, content: dict[str, Any], aad: bytes) -> str:
        """The content as an opaque, authenticated cookie value."""
        nonce = secrets.token_bytes(12)
        plain = json.dumps(content, separators=(",", ":")).encode("utf-8")
        return _b64(nonce + self._aead.encrypt(nonce, plain, aad))

    def open(self, value: str | None, aad: bytes) -> dict[str, Any] | None:
        """The content of a cookie this server sealed, or None for anything else."""
        if not value or len(value) > 6000:
            return None
        try:
            raw = _unb64(value)
            plain = self._aead.decrypt(raw[:12], raw[12:], aad)
            content = json.loads(plain)
        except (ValueError, InvalidTag):
            return None
        return content if isinstance(content, dict) else None


def is_loopback(request: Request[Any, Any, Any]) -> bool:
    """True when the console is served on loopback over plain HTTP (cookies then go without Secure)."""
    host = (request.url.hostname or "").lower()
    return request.url.scheme == "http" and (host in LOOPBACK_HOSTS or host.endswith(".localhost"))


def _cookie(request: Request[Any, Any, Any], name: str, value: str, max_age: int) -> Cookie:
    return Cookie(
        key=name,
        value=value,
        path=COOKIE_PATH,
        max_age=max(0, max_age),
        httponly=True,
        samesite="strict",
        secure=not is_loopback(request),
    )


def sealer_of(request: Request[Any, Any, Any]) -> Sealer:
    """The process's cookie sealer."""
    sealer: Sealer = request.app.state.console_sealer
    return sealer


def same(a: str | None, b: str | None) -> bool:
    """Constant-time equality of two CSRF tokens (absent never matches)."""
    return bool(a) and bool(b) and hmac.compare_digest(str(a).encode(), str(b).encode())


def sign_in(request: Request[Any, Any, Any], token: str) -> tuple[ConsoleSession, Cookie]:
    """Verify a pasted token like the API does and make the session cookie that carries it."""
    if len(token) > MAX_CONSOLE_TOKEN_BYTES:
        raise LedgerError("unauthenticated", "This token is too large to keep in a browser session.")
    verifier: TokenVerifier = request.app.state.verifier
    caller = verifier.verify(token)
    charge(request.app.state, caller)  # signing in is a request of this caller like any other
    # The token is verified: reading its exp claim now is not a second verification.
    expires_at = int(jwt.decode(token, options={"verify_signature": False})["exp"])
    csrf = secrets.token_urlsafe(32)
    value = sealer_of(request).seal({"t": token, "c": csrf}, _AAD_SESSION)
    cookie = _cookie(request, SESSION_COOKIE, value, expires_at - int(time.time()))
    return ConsoleSession(caller, csrf, expires_at), cookie


def current_session(request: Request[Any, Any, Any]) -> ConsoleSession:
    """The signed-in session of this request; unauthenticated when there is none or its token ended."""
    cached = request.scope.get("effect_ledger.console_session")
    if isinstance(cached, ConsoleSession):
        return cached
    content = sealer_of(request).open(request.cookies.get(SESSION_COOKIE), _AAD_SESSION)
    if content is None or not isinstance(content.get("t"), str) or not isinstance(content.get("c"), str):
        raise LedgerError("unauthenticated", "Sign in to use the console.")
    verifier: TokenVerifier = request.app.state.verifier
    token = content["t"]
    caller = verifier.verify(token)
    expires_at = int(jwt.decode(token, options={"verify_signature": False})["exp"])
    session = ConsoleSession(caller, content["c"], expires_at)
    request.scope["effect_ledger.console_session"] = session  # type: ignore[typeddict-unknown-key]
    request.scope[CALLER_KEY] = caller  # type: ignore[literal-required]  # the summary line names who
    # Under the API's rate limit, once per request (the session is remembered first, so that the
    # 429 page itself can still show who is signed in without being charged again).
    charge(request.app.state, caller)
    return session


def sign_out(request: Request[Any, Any, Any], response: Response[Any]) -> None:
    """Make the browser drop the session cookie."""
    response.set_cookie(_cookie(request, SESSION_COOKIE, "", 0))


def login_csrf(request: Request[Any, Any, Any]) -> tuple[str, Cookie | None]:
    """The sign-in form's CSRF token, and the cookie that ties it to this browser when it is new."""
    content = sealer_of(request).open(request.cookies.get(LOGIN_COOKIE), _AAD_LOGIN)
    if content is not None and isinstance(content.get("c"), str) and content.get("x", 0) > time.time():
        return str(content["c"]), None
    csrf = secrets.token_urlsafe(32)
    value = sealer_of(request).seal({"c": csrf, "x": int(time.time()) + LOGIN_FORM_SECONDS}, _AAD_LOGIN)
    return csrf, _cookie(request, LOGIN_COOKIE, value, LOGIN_FORM_SECONDS)


def login_csrf_matches(request: Request[Any, Any, Any], submitted: str | None) -> bool:
    """True when the sign-in form's token is the one this browser's login cookie holds."""
    content = sealer_of(request).open(request.cookies.get(LOGIN_COOKIE), _AAD_LOGIN)
    if content is None or content.get("x", 0) <= time.time():
        return False
    return same(content.get("c"), submitted)


def forget_login_form(request: Request[Any, Any, Any], response: Response[Any]) -> None:
    """Drop the sign-in form's cookie once it has served."""
    response.set_cookie(_cookie(request, LOGIN_COOKIE, "", 0))
