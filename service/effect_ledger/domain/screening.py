"""Credential screening: recognise values shaped like secrets before they are stored or logged."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections import Counter
from urllib.parse import parse_qsl, urlsplit

__all__ = ["find_credentials", "looks_like_credential"]

# --- Shapes that are credentials wherever they appear --------------------------------------

# Issuer-specific prefixes: the vendors chose them so that leaked keys can be recognised.
_VENDOR_KEYS = re.compile(
    r"""
    (?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])              # AWS access key id
    | (?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{30,}                          # GitHub tokens
    | (?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{30,}                        # GitHub fine-grained PAT
    | (?<![A-Za-z0-9])xox[abprs]-[A-Za-z0-9-]{10,}                         # Slack
    | (?<![A-Za-z0-9_])(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}            # Stripe secret/restricted
    | (?<![A-Za-z0-9_])whsec_[A-Za-z0-9+/=]{24,}                           # Stripe webhook secret
    | (?<![A-Za-z0-9_-])AIza[0-9A-Za-z_-]{35}(?![A-Za-z0-9_-])             # Google API key
    | -----BEGIN\ [A-Z0-9 ]*PRIVATE\ KEY(?:\ BLOCK)?-----                  # PEM / PGP private key
    | (?<![A-Za-z0-9_])clt_[A-Za-z0-9_-]{40,}                              # claim tokens, domain/tokens
    | hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_-]{20,}  # Slack webhook (its path)
    | discord(?:app)?\.com/api/webhooks/[0-9]+/[A-Za-z0-9_-]{30,}         # Discord webhook token
    """,
    re.VERBOSE,
)

# OpenAI and Anthropic keys ("sk-…", "sk-proj-…", "sk-ant-api03-…") share one prefix with
# ordinary slugs, so the body is checked for the mixed classes a random key has.
_SK_KEY = re.compile(r"(?<![A-Za-z0-9_-])sk-([A-Za-z0-9_-]{20,})")

# RFC 7235 credentials: scheme, whitespace, token68.
# A percent-encoded space (a header value pasted from a URL) is a space (round 36).
_AUTH_SCHEME = re.compile(r"(?i)(?<![A-Za-z0-9])(bearer|basic)(?:\s+|%20)([A-Za-z0-9._~+/-]+=*)")

_JWT = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z0-9_-]{10,})\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*")

# "password=hunter22" or "api_key: abc123" inside free text, a config dump or a query string; also a
# JSON member ('"password": "hunter22"': the key's closing quote before the colon) and "api key X"
# written as prose (round 36: both were stored). The value must still look like one (_is_secret_value).
_ASSIGNMENT = re.compile(
    r"(?i)(?<![A-Za-z0-9])(?:(?:password|passwd|pwd|secret|client_secret|api[_-]?key|access[_-]?key"
    r"|(?:access|refresh|auth|id)[_-]?token|token)['\"]?\s*[=:]|api[ _-]?key\s)\s*['\"]?"
    r"([^\s'\"&,;<>()\[\]{}]{6,})"
)

_URL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]{0,31}://[^\s\"'<>]+")
_SENSITIVE_PARAM = re.compile(
    r"(?i)^(?:.*[_-])?(?:token|secret|password|passwd|pwd|key|apikey|sig|signature|credential|session)$"
)

# --- Identifier shapes that are fine to store ---------------------------------------------

# A UUID names something; it does not authorise anything by itself, and providers use them
# as request ids, which the diagnostics contract collects on purpose.
_UUID = re.compile(r"(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
# A labelled digest is a one-way hash of content (our own intent digests among them): it
# reveals nothing of what was hashed and cannot be presented as a credential.
_DIGEST = re.compile(
    r"(?i)\b(?:sha1|sha224|sha256|sha384|sha512|sha3-256|sha3-512|md5|blake2b)[:=][0-9a-f]{32,128}\b"
)
# Provider object and request ids ("req_…", "msg_…", "chatcmpl-…") are printed in responses
# and logs by design; they are long and random but are names, not keys.
_ID_PREFIXED = re.compile(
    r"(?<![A-Za-z0-9])(?:req|request|msg|resp|run|call|toolu|chatcmpl|cmpl|batch|file|job|ftjob"
    r"|trace|span|evt|inc|op)[_-][A-Za-z0-9_-]+"
)

_TOKEN = re.compile(r"[A-Za-z0-9+/_=-]{32,}")
_PIECES = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_HEX_GROUPS = re.compile(r"[0-9a-f-]+|[0-9A-F-]+")
_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_SECRET_KEY = object()  # stack marker: report this path, the key itself is the secret
_PLACEHOLDER = re.compile(r"(?i)[*x•.]+|\[redacted]|<redacted>|redacted")


# A plain word (letters, digits, `_`, `-`) can match only the shapes below that need no other
# character: AWS key IDs (AKIA/ASIA), Slack (xox…), Stripe (sk_/rk_), sk- keys, and the longer vendor
# prefixes (GitHub, Google, webhook, claim tokens). Every other shape needs whitespace, `.`, `:`, `=`,
# `/`, `+` or `://` (bearer and basic credentials, JWTs, assignments, URLs, labelled digests, PEM).
# Such words are most of what is screened (operation IDs, tenants, principals in every request's log
# line), so a plain word free of those prefixes skips the vendor, bearer, JWT, assignment and URL scans:
# under 32 characters it is harmless (the random-token rule needs 32), longer it is judged by shape
# alone, as the full screen judges it (UUIDs and prefixed IDs blanked first).
# tests/unit/test_screening.py checks the shortcut against the full screen.
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_-]*")
_SHAPE_PREFIX = re.compile(r"AKIA|ASIA|xox|sk_|rk_|sk-|gh|AIza|clt_|whsec_|github_pat_")
_HARMLESS = (_URL, _DIGEST, _UUID, _ID_PREFIXED)
_HARMLESS_IN_WORDS = (_UUID, _ID_PREFIXED)  # URLs and labelled digests need `:` or `=`


def looks_like_credential(value: str) -> bool:
    """Return True if the string is, or contains, something shaped like a credential."""
    if _PLAIN_WORD.fullmatch(value) is not None and _SHAPE_PREFIX.search(value) is None:
        return len(value) >= 32 and _random_remainder(value, _HARMLESS_IN_WORDS)
    return _screened(value)


def _screened(value: str) -> bool:
    """looks_like_credential without its shortcut: every shape scanned."""
    if _VENDOR_KEYS.search(value):
        return True
    if any(_is_random_body(match.group(1)) for match in _SK_KEY.finditer(value)):
        return True
    if any(_is_auth_credential(match.group(1), match.group(2)) for match in _AUTH_SCHEME.finditer(value)):
        return True
    if any(_has_jose_header(match.group(1)) for match in _JWT.finditer(value)):
        return True
    if any(_is_secret_value(match.group(1)) for match in _ASSIGNMENT.finditer(value)):
        return True
    if any(_url_carries_secret(match.group(0)) for match in _URL.finditer(value)):
        return True
    return _random_remainder(value)


def _random_remainder(value: str, blanked: tuple[re.Pattern[str], ...] = _HARMLESS) -> bool:
    """What remains is judged by shape alone, so first blank out what is known to be harmless."""
    remainder = value
    for harmless in blanked:
        remainder = harmless.sub(" ", remainder)
    return any(_is_random_token(match.group(0)) for match in _TOKEN.finditer(remainder))


def find_credentials(obj: object) -> list[str]:
    """Return JSONPath-style paths of every key or string value that looks like a credential."""
    found: list[str] = []
    # An explicit stack, so that deep input cannot exhaust the interpreter's recursion limit.
    stack: list[tuple[str, object]] = [("$", obj)]
    while stack:
        path, node = stack.pop()
        if node is _SECRET_KEY or (isinstance(node, str) and looks_like_credential(node)):
            found.append(path)
        elif isinstance(node, dict):
            members: list[tuple[str, object]] = []
            for position, (key, child) in enumerate(node.items()):
                if not isinstance(key, str):
                    continue
                if looks_like_credential(key):
                    # The key is the secret, so the path names its position, never the key.
                    member = f"{path}.<key {position}>"
                    members.append((member, _SECRET_KEY))
                else:
                    member = _member_path(path, key)
                members.append((member, child))
            stack.extend(reversed(members))
        elif isinstance(node, list | tuple):
            stack.extend(reversed([(f"{path}[{index}]", child) for index, child in enumerate(node)]))
    # A secret key holding a secret string would otherwise be listed twice.
    return list(dict.fromkeys(found))


def _member_path(parent: str, key: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{parent}.{key}"
    return f"{parent}[{json.dumps(key, ensure_ascii=False)}]"


def _char_classes(text: str) -> int:
    """How many of lower case, upper case and digits occur in `text`."""
    if text.isascii():  # the usual case (every token shape is ASCII): three C-level passes
        return (text.upper() != text) + (text.lower() != text) + (_ASCII_DIGIT.search(text) is not None)
    return sum(
        (any(c.islower() for c in text), any(c.isupper() for c in text), any(c.isdigit() for c in text))
    )


_ASCII_DIGIT = re.compile(r"[0-9]")


def _is_placeholder(text: str) -> bool:
    return _PLACEHOLDER.fullmatch(text) is not None


def _is_plain_word(text: str) -> bool:
    return text.isascii() and text.isalpha()


def _is_random_body(body: str) -> bool:
    return _char_classes(body) >= 2


def _is_auth_credential(scheme: str, token: str) -> bool:
    bare = token.rstrip("=")
    if _is_placeholder(bare):
        return False
    # RFC 7617: Basic credentials are base64 of "user:password"; anything else is prose
    # ("a basic username/password check") or a challenge ("Basic realm=...").
    if scheme.lower() == "basic":
        return b":" in _b64decode(token, urlsafe=False)
    # A short or purely alphabetic word after the scheme is prose ("Bearer token", "Bearer
    # error=..." in a WWW-Authenticate challenge), not a credential.
    return len(bare) >= 8 and (not _is_plain_word(bare) or len(bare) >= 20)


def _has_jose_header(segment: str) -> bool:
    try:
        header = json.loads(_b64decode(segment, urlsafe=True))
    # ValueError covers JSONDecodeError and UnicodeDecodeError; a segment of 64 KiB can
    # decode to "[[[[..." deep enough to exhaust the parser's recursion.
    except (ValueError, RecursionError):
        return False
    return isinstance(header, dict) and "alg" in header


def _b64decode(text: str, *, urlsafe: bool) -> bytes:
    padded = text.rstrip("=") + "=" * (-len(text.rstrip("=")) % 4)
    try:
        if urlsafe:
            return base64.urlsafe_b64decode(padded)
        return base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        return b""


def _is_secret_value(text: str) -> bool:
    # Mixed classes keep out words, colours and constants ("Expired", "#cccccc", "FG_DEFAULT");
    # a dotted name is code ("token = Name.Builtin"), not a secret.
    if _is_placeholder(text) or _is_plain_word(text) or _DOTTED_NAME.fullmatch(text):
        return False
    return len(text) >= 6 and _char_classes(text) >= 2


def _url_carries_secret(url: str) -> bool:
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a malformed port or bracket; the shape checks still see the text
        return False
    if password and not _is_placeholder(password):
        return True
    return any(
        # Mixed character classes separate key material from values like "created_at_desc".
        _SENSITIVE_PARAM.match(name) and len(val) >= 8 and _char_classes(val) >= 2
        for name, val in parse_qsl(parts.query, keep_blank_values=True)
    )


def _entropy_bits_per_char(text: str) -> float:
    """Shannon entropy per character: log2(L) - sum(n * log2(n)) / L over the characters' counts n
    (the n * log2(n) of the counts a token has, up to 256, from a table)."""
    counts = Counter(text).values()
    length = len(text)
    if length <= _XLOGX_MAX:
        spread = sum(map(_XLOGX.__getitem__, counts))
    else:
        spread = sum(n * math.log2(n) for n in counts)
    return math.log2(length) - spread / length


_XLOGX_MAX = 256
_XLOGX = [0.0, *(n * math.log2(n) for n in range(1, _XLOGX_MAX + 1))]


def _is_random_hex(text: str) -> bool:
    # 32 hex digits (128 bits) is the commonest request- and trace-id format (W3C trace-id,
    # nginx $request_id), as harmless as a UUID; hex-encoded secrets are usually longer.
    return len(text) >= 40 and _char_classes(text) >= 2 and _entropy_bits_per_char(text) >= 3.0


def _is_random_token(token: str) -> bool:
    """Return True for a long token whose shape is that of random key material."""
    bare = token.rstrip("=")
    if len(bare) < 32:
        return False
    if _HEX_GROUPS.fullmatch(bare):
        # Dashed hex groups are structured ids (UUIDs, W3C traceparent), judged group by group.
        return any(_is_random_hex(group) for group in bare.split("-"))
    if _char_classes(bare) < 2 or _entropy_bits_per_char(bare) < 3.5:
        return False
    # Identifiers split into word-sized pieces ("GetUserProfileV2"); random text into
    # fragments of one or two characters.
    pieces = _PIECES.findall(bare)
    mean_piece = sum(map(len, pieces)) / len(pieces)
    # Separators every few characters mean words: slugs, paths, snake_case
    # ("gpt-4o-mini-2024-07-18", "EVP_PKEY_CTX_set0"). Random base64 has about one per 32
    # characters, so only fragments that are clearly random still count.
    if bare.count("-") + bare.count("_") + bare.count("/") + bare.count("+") > len(bare) // 10:
        single_case = bare.lower() == bare or bare.upper() == bare
        return not single_case and mean_piece <= 2.5
    return mean_piece <= 3.25
