"""Bearer JWT verification and per-route scope guards; tenant and principal come only from the token."""

from __future__ import annotations

import json
import re
import time
import warnings
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import jwt
from jwt.warnings import InsecureKeyLengthWarning
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard

from effect_ledger.domain.errors import LedgerError
from effect_ledger.http.pacing import REPEATED_KEY, Pacer
from effect_ledger.http.ratelimit import RateLimiter
from effect_ledger.settings import Settings

EXECUTE = "ledger:execute"
RECONCILE = "ledger:reconcile"
AUDIT = "ledger:audit"
DIAG_WRITE = "diagnostics:write"
DIAG_READ = "diagnostics:read"
JOURNAL_WRITE = "journal:write"
JOURNAL_READ = "journal:read"
APPROVE = "ledger:approve"
ALL_SCOPES = (EXECUTE, RECONCILE, AUDIT, DIAG_WRITE, DIAG_READ, JOURNAL_WRITE, JOURNAL_READ, APPROVE)
MAX_TOKEN_BYTES = 8192
VERIFIED_TOKENS = 4096  # verified tokens remembered per process (LRU)
REQUIRED_CLAIMS = ["sub", "tenant", "exp", "iat", "aud", "iss"]
# API.md section 3: `tenant` and `sub` become keys and log fields, so they are bounded like IDs.
IDENTITY = re.compile(r"[A-Za-z0-9._:@~-]{1,128}")


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling, as the verified token says."""

    tenant: str
    principal: str
    scopes: frozenset[str]

    @property
    def reads_tenant(self) -> bool:
        """Reconcilers and auditors read every operation of the tenant; executors only their own."""
        return not self.scopes.isdisjoint((RECONCILE, AUDIT))


def _unauthenticated(detail: str) -> LedgerError:
    return LedgerError("unauthenticated", detail)


def signing_keys(jwks: jwt.PyJWKSet, algorithm: str) -> list[jwt.PyJWK]:
    """The keys of a JWKS that can verify `algorithm`'s signatures: of its key type (an RSA key for
    RS256, an EC key for ES256, an OKP key for EdDSA) and not marked for encryption (`"use": "enc"`,
    RFC 7517 section 4.2). Until round 36 every key was tried: a key of another type raised instead of
    failing the signature, and a token without `kid` in a set that mixes key types was refused unless
    its key came first. A set with none is a configuration error, said at start-up."""
    verifier = jwt.get_algorithm_by_name(algorithm)
    keys = []
    for key in jwks.keys:
        if key.public_key_use == "enc":
            continue
        try:
            verifier.prepare_key(key.key)
        except (TypeError, ValueError, jwt.InvalidKeyError):
            continue
        keys.append(key)
    if not keys:
        raise ValueError(f"the JWKS holds no signature key for {algorithm}")
    return keys


class TokenVerifier:
    """Verifies bearer tokens with exactly one configured algorithm and key."""

    def __init__(self, settings: Settings, secret: str | None = None) -> None:
        self.algorithm = settings.jwt_algorithm
        self.audience = settings.jwt_audience
        self.issuer = settings.jwt_issuer
        self.max_ttl = settings.jwt_max_ttl_seconds
        # Tokens that passed every check, with their exp: an executor sends one token with every call,
        # and the signature check was a fifth of the service's CPU per cycle (profiled). Bounded, LRU.
        self._verified: OrderedDict[str, tuple[Caller, float]] = OrderedDict()
        # Tokens that failed for good (bad signature, expired, malformed), with their 401's detail: a
        # flood of one bad token costs a dict lookup per request, not a signature check. Bounded, FIFO.
        self._refused: dict[str, str] = {}
        self._jwks: list[jwt.PyJWK] | None = None
        self._key: Any
        if self.algorithm == "HS256":
            key = secret or settings.jwt_secret
            if not key:
                raise ValueError("HS256 needs EFFECT_LEDGER_JWT_SECRET")
            self._key = key
        elif self.algorithm in ("RS256", "ES256", "EdDSA"):
            if not settings.jwt_public_key_file:
                raise ValueError(f"{self.algorithm} needs EFFECT_LEDGER_JWT_PUBLIC_KEY_FILE")
            text = Path(settings.jwt_public_key_file).read_text()
            if text.lstrip().startswith("{"):
                self._jwks = signing_keys(jwt.PyJWKSet.from_dict(json.loads(text)), self.algorithm)
            else:
                self._key = text
        else:
            raise ValueError(f"unsupported JWT algorithm {self.algorithm!r}")

    def _keys_for(self, token: str) -> list[Any]:
        """The keys a token's signature may be checked with: the configured one; of a JWKS, the one its
        `kid` names, or, without a `kid`, each in turn (until round 24 only the first: while a key
        rotation put two keys in the set, tokens signed with the second were refused)."""
        if self._jwks is None:
            return [self._key]
        kid = jwt.get_unverified_header(token).get("kid")
        keys = [key.key for key in self._jwks if kid is None or key.key_id == kid]
        if not keys:
            raise _unauthenticated("The token's key is not known.")
        return keys

    def _decode(self, token: str) -> dict[str, Any]:
        """jwt.decode with the first of the token's keys whose signature verifies."""
        keys = self._keys_for(token)
        for key in keys[:-1]:
            try:
                return self._decode_with(token, key)
            except jwt.InvalidSignatureError:
                continue
        return self._decode_with(token, keys[-1])

    def _decode_with(self, token: str, key: Any) -> dict[str, Any]:
        claims: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=[self.algorithm],
            audience=self.audience,
            issuer=self.issuer,
            options={"require": REQUIRED_CLAIMS, "verify_iat": True},
        )
        return claims

    def verify(self, token: str) -> Caller:
        """The caller of a valid token; every failure is the same 401 with a controlled detail.
        A token verified before is taken from memory until its exp (the only check time can change)."""
        remembered = self._verified.get(token)
        if remembered is not None:
            caller, expires = remembered
            if time.time() < expires:
                self._verified.move_to_end(token)
                return caller
            del self._verified[token]
        refused = self._refused.get(token)
        if refused is not None:
            raise _unauthenticated(refused)
        try:
            caller, expires = self._verify_fully(token)
        except LedgerError as error:
            if not isinstance(error.__context__, jwt.ImmatureSignatureError):  # only time makes that one good
                self._refused[token] = error.detail
                if len(self._refused) > VERIFIED_TOKENS:
                    self._refused.pop(next(iter(self._refused)))
            raise
        self._verified[token] = (caller, expires)
        if len(self._verified) > VERIFIED_TOKENS:
            self._verified.popitem(last=False)
        return caller

    def _verify_fully(self, token: str) -> tuple[Caller, float]:
        """Signature, algorithm, audience, issuer, times and claim bounds; the caller and its exp."""
        if len(token) > MAX_TOKEN_BYTES:
            raise _unauthenticated("The bearer token is too large.")
        try:
            with warnings.catch_warnings():
                # a short HS256 secret is reported once at start-up, not on every request
                warnings.simplefilter("ignore", InsecureKeyLengthWarning)
                claims = self._decode(token)
        except jwt.ExpiredSignatureError:
            raise _unauthenticated("The bearer token has expired.") from None
        except (jwt.PyJWTError, ValueError, TypeError):
            raise _unauthenticated("The bearer token is not valid for this service.") from None
        return self._caller(claims), float(claims["exp"])

    def _caller(self, claims: dict[str, Any]) -> Caller:
        """Bound the claims the service keys on; any violation is the same 401 as a bad signature."""
        tenant, subject, scope = claims.get("tenant"), claims.get("sub"), claims.get("scope", "")
        if not _is_identity(tenant) or not _is_identity(subject):
            raise _unauthenticated("The bearer token's tenant or subject is missing or malformed.")
        if not isinstance(scope, str):
            raise _unauthenticated("The bearer token's scope is not a string.")
        issued, expires = claims["iat"], claims["exp"]  # both required
        # NumericDate is a JSON number: PyJWT also accepts a string of digits (it calls int() on it),
        # which made the subtraction below a TypeError and the answer a 500 until round 24; a bool is
        # an int in Python, and no time at all here
        if type(issued) not in (int, float) or type(expires) not in (int, float):
            raise _unauthenticated("The bearer token's iat or exp is not a number.")
        if expires - issued > self.max_ttl:
            raise _unauthenticated("The bearer token lives longer than this service accepts.")
        return Caller(tenant, subject, frozenset(scope.split()))


def _is_identity(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and IDENTITY.fullmatch(value) is not None


CALLER_KEY = "effect_ledger.caller"  # the verified caller, in the request's scope
ADMITTED_KEY = "effect_ledger.admitted"  # the rate limit was charged already (http.fastpath)


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The bearer token of a request's raw ASGI headers, or 401 (the first Authorization header counts)."""
    for name, value in headers:
        if len(name) == 13 and (name == b"authorization" or name.lower() == b"authorization"):
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            break
    raise _unauthenticated("A bearer token is required.")


def admit(scope: Any, state: Any, scopes: Iterable[str]) -> Caller:
    """The whole admission of one request from its scope: the token (from the verifier's cache once
    seen), the scope check (403) and the rate limit (429), in that order. Used before routing by
    http.fastpath and, through `requires`, by every guarded route."""
    caller = scope.get(CALLER_KEY)
    if not isinstance(caller, Caller):
        token = bearer_token(scope["headers"])  # a missing token is refused before anything else
        verifier: TokenVerifier = state.verifier
        caller = verifier.verify(token)
        scope[CALLER_KEY] = caller
    if scopes and caller.scopes.isdisjoint(scopes):
        raise LedgerError("forbidden", "The token lacks the scope this call needs.")
    # After the token, before the body is read and before any database work (docs/api.md section 4).
    if not scope.get(ADMITTED_KEY):
        charge(state, caller)
    return caller


async def paced(scope: Any, state: Any, refused: LedgerError) -> LedgerError:
    """The refusal to send for an `admit` that raised `refused`: a 429 is first held by the worker's
    pacer when its caller keeps sending while refused (http.pacing), and its summary line is quiet
    (debug) then; anything else as it is."""
    pacer: Pacer | None = getattr(state, "pacer", None)
    if refused.code != "rate_limited" or pacer is None:
        return refused
    caller: Caller = scope[CALLER_KEY]  # the limit is charged only after the token was verified
    if pacer.repeating(caller.tenant, caller.principal):
        scope[REPEATED_KEY] = True
    return await pacer.pace(refused, caller.tenant, caller.principal)


def charge(state: Any, caller: Caller) -> None:
    """Take one request from the caller's rate limit (429 rate_limited when it is spent); the API's
    guards and the console's sessions share the one bucket of each tenant and principal."""
    limiter: RateLimiter | None = getattr(state, "limiter", None)
    if limiter is not None:
        limiter.check(caller.tenant, caller.principal)


def authenticate(connection: ASGIConnection[Any, Any, Any, Any]) -> Caller:
    """Verify the request's bearer token once and remember the caller on the connection."""
    cached = connection.scope.get(CALLER_KEY)
    if isinstance(cached, Caller):
        return cached
    token = bearer_token(connection.scope["headers"])
    verifier: TokenVerifier = connection.app.state.verifier
    caller = verifier.verify(token)
    connection.scope[CALLER_KEY] = caller  # type: ignore[literal-required]
    return caller


def requires(*scopes: str) -> Guard:
    """A guard admitting a valid token holding any of `scopes` (none named: any valid token)."""

    # async (it awaits only to hold a paced 429): Litestar runs a sync guard in a worker thread on
    # every request, and that hop (plus the GIL hand-over back) cost more than verifying the token here.
    async def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        try:
            admit(connection.scope, connection.app.state, scopes)
        except LedgerError as refused:
            sent = await paced(connection.scope, connection.app.state, refused)
            if sent is refused:
                raise
            raise sent from None

    return guard


def mint_token(
    secret: str,
    tenant: str,
    subject: str,
    scope: str,
    settings: Settings,
    ttl_seconds: int = 3600,
    now: int | None = None,
) -> str:
    """A development HS256 token with the claims the service requires."""
    issued = int(time.time()) if now is None else now
    claims = {
        "sub": subject,
        "tenant": tenant,
        "scope": scope,
        "iat": issued,
        "exp": issued + ttl_seconds,
        "aud": settings.jwt_audience,
        "iss": settings.jwt_issuer,
    }
    return jwt.encode(claims, secret, algorithm="HS256")
