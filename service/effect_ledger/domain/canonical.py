"""RFC 8785 JSON Canonicalization Scheme (JCS) and the intent digest built on it."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable

import msgspec

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "MAX_EXACT_INT",
    "CanonicalizationError",
    "canonical_json",
    "canonical_json_reference",
    "encode_members",
    "intent_digest",
    "plain_scalar",
    "serialize_number",
    "sorted_encoding",
]

DEFAULT_MAX_DEPTH = 64

# Integers up to 2**53 are exactly representable as IEEE-754 doubles, so printing them
# directly gives the same text as ES6 would; beyond that ES6 would have rounded them.
MAX_EXACT_INT = 2**53

_SURROGATE = re.compile("[\ud800-\udfff]")
_ASTRAL = re.compile(rb"[\xf0-\xf4]")  # the lead byte of a UTF-8 character beyond U+FFFF
_SORTED_ENCODE = msgspec.json.Encoder(order="sorted").encode
_SCALARS = frozenset({str, bool, type(None)})  # always plain (ints are checked for their range)
_ENCODE = msgspec.json.Encoder().encode  # a Struct's fields in their declared order

# JCS uses the ES6 JSON.stringify escapes: six short forms, other C0 controls as \u00xx
# (lowercase hex), and every other character literal (no \u escapes for non-ASCII).
_ESCAPES: dict[int, str] = {code: f"\\u{code:04x}" for code in range(0x20)}
_ESCAPES.update(
    {
        ord("\b"): "\\b",
        ord("\t"): "\\t",
        ord("\n"): "\\n",
        ord("\f"): "\\f",
        ord("\r"): "\\r",
        ord('"'): '\\"',
        ord("\\"): "\\\\",
    }
)


class CanonicalizationError(ValueError):
    """A value has no RFC 8785 canonical form."""


def canonical_json(value: object, *, max_depth: int = DEFAULT_MAX_DEPTH) -> bytes:
    """Return the RFC 8785 canonical UTF-8 encoding of a JSON-like Python value.

    Values made only of dicts with str keys, lists, tuples, str, exact ints, bools and None (every
    intent, receipt and event the executor calls hash, unless they carry floats) are encoded by
    msgspec with sorted keys, which writes exactly the JCS text for them: the same escapes (the six
    short forms, other C0 controls as lowercase backslash-u00xx, everything else literal) and, without
    characters beyond the BMP, code-point order equals the UTF-16 order JCS sorts by. Anything else
    (floats, big ints, subclasses, surrogates, astral characters, other types, too deep) takes the
    reference implementation below, which also raises every CanonicalizationError.
    tests/unit/test_canonical.py checks both give the same bytes for arbitrary values."""
    if _plain(value, 0, max_depth):
        try:
            encoded = _SORTED_ENCODE(value)
        except UnicodeEncodeError:  # a surrogate: the reference combines pairs or refuses
            pass
        else:
            if encoded.isascii() or _ASTRAL.search(encoded) is None:
                return encoded
    return canonical_json_reference(value, max_depth=max_depth)


def _plain(value: object, depth: int, max_depth: int) -> bool:
    """Whether msgspec's sorted encoding of `value` is its JCS text (see canonical_json)."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return -MAX_EXACT_INT <= value <= MAX_EXACT_INT  # type: ignore[operator]
    if depth >= max_depth:
        return False
    if kind is dict:
        for key in value:  # type: ignore[attr-defined]  # a plain loop: any() over a generator cost more
            if type(key) is not str:
                return False
        members: Iterable[object] = value.values()  # type: ignore[attr-defined]
    elif kind is list or kind is tuple:
        members = value  # type: ignore[assignment]
    else:
        return False
    # scalars inline: a call per member would cost more than the encoding (an event's data is checked
    # on every hash the chain's verification recomputes)
    for item in members:
        kind = type(item)
        if kind in _SCALARS:
            continue
        if kind is int:
            if not -MAX_EXACT_INT <= item <= MAX_EXACT_INT:  # type: ignore[operator]
                return False
        elif not _plain(item, depth + 1, max_depth):
            return False
    return True


def sorted_encoding(value: object) -> bytes | None:
    """msgspec's encoding of `value` with every object's keys sorted, unchecked: the JCS text whenever
    canonical_json would take it (see there), something else for a float, an int beyond 2**53 or a key
    beyond the BMP; None when msgspec refuses the value. For comparing with a digest taken over JCS
    text, where only a mismatch needs canonical_json's answer."""
    try:
        return _SORTED_ENCODE(value)
    except (TypeError, ValueError):  # UnicodeEncodeError (a lone surrogate) is a ValueError
        return None


def plain_scalar(value: object) -> bool:
    """Whether `value` is a scalar msgspec writes exactly as JCS does: a str, a bool, None, or an int of
    at most 2**53 in magnitude. A str holding a lone surrogate passes here; msgspec then refuses to
    encode it, and encode_members answers None."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    return kind is int and -MAX_EXACT_INT <= value <= MAX_EXACT_INT  # type: ignore[operator]


def encode_members(members: msgspec.Struct) -> bytes | None:
    """The JCS text of an object with fixed ASCII keys, given as a Struct whose fields are declared in
    sorted order, whose scalar members passed plain_scalar and whose other members are msgspec.Raw
    holding their canonical_json (or, for chain.link_holds and model.receipt_digest_is, members not
    checked at all); None when msgspec cannot write it, a string holding a lone surrogate or a member
    of a type it does not encode (the caller then takes canonical_json of the object as a dict, which
    combines a pair or refuses).

    For the hashes of every event, receipt and leaf the receipts log recomputes: no dict built per
    object, and no walk over members already known to be plain (tests/unit/test_log_hashing.py checks
    the bytes against canonical_json_reference)."""
    try:
        return _ENCODE(members)
    except (UnicodeEncodeError, TypeError):
        return None


def canonical_json_reference(value: object, *, max_depth: int = DEFAULT_MAX_DEPTH) -> bytes:
    """The RFC 8785 encoding written out rule by rule: every value, every refusal."""
    parts: list[str] = []
    try:
        _write(value, parts, 0, max_depth)
    except RecursionError as exc:  # only reachable when a caller raises max_depth very high
        raise CanonicalizationError("value is nested too deeply") from exc
    return "".join(parts).encode("utf-8")


def intent_digest(value: object, *, max_depth: int = DEFAULT_MAX_DEPTH) -> str:
    """Return "sha256:" plus the lowercase hex SHA-256 of the value's canonical JSON."""
    return digest_of_canonical(canonical_json(value, max_depth=max_depth))


def digest_of_canonical(canonical: bytes) -> str:
    """The intent digest of an already canonical encoding (see intent_digest)."""
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def _write(value: object, parts: list[str], depth: int, max_depth: int) -> None:
    # bool before int: bool is a subclass of int, but JSON has distinct literals for it.
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif isinstance(value, str):
        parts.append(_serialize_string(value))
    elif isinstance(value, int):
        parts.append(_serialize_int(value))
    elif isinstance(value, float):
        parts.append(serialize_number(value))
    elif isinstance(value, dict):
        _check_depth(depth, max_depth)
        _write_object(value, parts, depth + 1, max_depth)
    elif isinstance(value, list | tuple):
        _check_depth(depth, max_depth)
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            _write(item, parts, depth + 1, max_depth)
        parts.append("]")
    else:
        raise CanonicalizationError(f"unsupported type: {type(value).__name__}")


def _check_depth(depth: int, max_depth: int) -> None:
    if depth >= max_depth:
        raise CanonicalizationError(f"nesting deeper than {max_depth} levels")


def _write_object(value: dict[object, object], parts: list[str], depth: int, max_depth: int) -> None:
    members: dict[str, object] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise CanonicalizationError(f"object key is not a string: {type(key).__name__}")
        name = _well_formed(key)
        # Two Python keys can denote one JSON name (a split surrogate pair and the combined
        # character); JCS output must not repeat a name, so that input has no canonical form.
        if name in members:
            raise CanonicalizationError("duplicate object key after normalisation")
        members[name] = item
    parts.append("{")
    # RFC 8785 section 3.2.3: sort by UTF-16 code units; big-endian UTF-16 bytes compare
    # in exactly that order (unlike code points, which misorder astral vs. U+E000..U+FFFF).
    for index, name in enumerate(sorted(members, key=lambda k: k.encode("utf-16-be"))):
        if index:
            parts.append(",")
        parts.append(_serialize_string(name))
        parts.append(":")
        _write(members[name], parts, depth, max_depth)
    parts.append("}")


def _well_formed(text: str) -> str:
    """Return text with surrogate pairs combined, or raise on a lone surrogate."""
    if _SURROGATE.search(text) is None:
        return text
    try:
        # Round-tripping through UTF-16 joins valid pairs and rejects lone halves.
        return text.encode("utf-16-be", "surrogatepass").decode("utf-16-be")
    except UnicodeDecodeError as exc:
        raise CanonicalizationError("string contains a lone surrogate") from exc


def _serialize_string(text: str) -> str:
    return '"' + _well_formed(text).translate(_ESCAPES) + '"'


def _serialize_int(value: int) -> str:
    if -MAX_EXACT_INT <= value <= MAX_EXACT_INT:
        return str(value)
    try:
        as_float = float(value)
    except OverflowError as exc:
        raise CanonicalizationError("integer is outside the IEEE-754 double range") from exc
    return serialize_number(as_float)


def serialize_number(value: float) -> str:
    """Return the ES6 Number.prototype.toString text of a finite double."""
    if not math.isfinite(value):
        raise CanonicalizationError(f"non-finite number: {value!r}")
    if value == 0:
        return "0"  # covers -0.0, which ES6 also prints as "0"
    sign = "-" if value < 0 else ""
    digits, point = _shortest_digits(abs(value))
    return sign + _es6_layout(digits, point)


def _shortest_digits(magnitude: float) -> tuple[str, int]:
    """Return (digits, n) with magnitude == 0.digits * 10**n, digits shortest round-trip."""
    # repr() yields the shortest digit string that round-trips, the same digits ES6
    # requires (both pick the one closest to the exact value when several are shortest).
    mantissa, _, exponent_text = repr(magnitude).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + (int(exponent_text) if exponent_text else 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    return stripped.rstrip("0"), point


def _es6_layout(digits: str, n: int) -> str:
    # The four cases of ECMA-262 Number::toString, with k digits and value = 0.digits * 10**n.
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * -n + digits
    exponent = n - 1
    exponent_text = ("+" if exponent >= 0 else "-") + str(abs(exponent))
    if k == 1:
        return digits + "e" + exponent_text
    return digits[0] + "." + digits[1:] + "e" + exponent_text
