"""Log redaction: a structlog processor that removes tokens and secrets before rendering."""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from functools import lru_cache
from typing import Any

from effect_ledger.domain.screening import looks_like_credential

__all__ = ["REDACTED", "is_sensitive_key", "redact_secrets", "redact_value"]

REDACTED = "[redacted]"

# Deeper than this, a value is not inspected but replaced: a log line never needs it, and
# an unbounded walk could exhaust the recursion limit inside the logging call.
_MAX_DEPTH = 32

# Words that make a field name sensitive wherever they appear in it ("X-Auth-Token",
# "proxy_authorization", "claimToken"). Plurals such as "max_tokens" are counts, not secrets.
_SENSITIVE_WORDS = frozenset(
    {"authorization", "auth", "token", "secret", "secrets", "password", "passwd", "jwt", "cookie", "cookies"}
)
# Names whose words are harmless alone ("api", "key") or that are run together ("authtoken"),
# judged on the lower-cased words joined without separators.
_SENSITIVE_SUFFIXES = ("token", "apikey", "privatekey", "accesskey", "secret", "password", "cookie", "jwt")

_NAME_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
# A bearer credential inside longer text is masked but keeps its scheme, so the line stays
# readable. "[redacted]" is outside the token alphabet, so masking twice changes nothing.
_BEARER_CREDENTIAL = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/-]+=*")


# Log lines repeat the same few strings (routes, tenants, principals, event names): remembering
# the verdicts keeps the credential check off the request path's CPU budget. Bounded.
_looks_like_credential = lru_cache(maxsize=8192)(looks_like_credential)


@lru_cache(maxsize=4096)
def is_sensitive_key(name: str) -> bool:
    """Return True if a field with this name holds a secret, whatever its value looks like."""
    words = [word.lower() for word in _NAME_WORDS.findall(name)]
    if any(word in _SENSITIVE_WORDS for word in words):
        return True
    return "".join(words).endswith(_SENSITIVE_SUFFIXES)


def redact_value(value: object, depth: int = 0) -> object:
    """Return a copy of value with secret-named fields and credential-shaped strings masked."""
    if type(value) is str:  # the common case first: log lines are mostly plain strings
        return _redact_text(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return _redact_text(value)
    if depth >= _MAX_DEPTH:
        return REDACTED
    if isinstance(value, Mapping):
        return _redact_mapping(value, depth + 1)
    if isinstance(value, list | tuple):
        items = [redact_value(item, depth + 1) for item in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, bytes | bytearray):
        return REDACTED if _looks_like_credential(bytes(value).decode("utf-8", "replace")) else value
    # Anything else is rendered through repr() by the JSON renderer, so judge that text.
    return REDACTED if _looks_like_credential(repr(value)) else value


def redact_secrets(logger: object, method_name: str, event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """structlog processor: return the event with secrets masked; the input is left untouched."""
    # New containers all the way down: the caller's own objects (a request body that was
    # logged, say) must not be altered by logging them.
    return _redact_mapping(event_dict, 1)


def _redact_mapping(mapping: Mapping[Any, Any], depth: int) -> dict[Any, Any]:
    redacted: dict[Any, Any] = {}
    for position, (key, item) in enumerate(mapping.items()):
        name = key if isinstance(key, str) else str(key)
        if _looks_like_credential(name):
            # The key itself is the secret: keep the field visible, but not its name.
            redacted[f"{REDACTED}#{position}"] = REDACTED
        elif is_sensitive_key(name):
            redacted[key] = REDACTED
        else:
            redacted[key] = redact_value(item, depth)
    return redacted


@lru_cache(maxsize=8192)
def _redact_text(text: str) -> str:
    """A string's masked form; remembered, like the verdicts: log lines repeat their strings."""
    if _looks_like_credential(text):
        return REDACTED
    # Bearer values too short or too plain to be judged secrets on their own are still
    # masked in logs: a false positive here costs a word, a miss costs a token.
    return _BEARER_CREDENTIAL.sub(lambda match: match.group(1) + REDACTED, text)
