"""RFC 8785 canonicalization: the RFC's published vectors plus our own edge cases."""

from __future__ import annotations

import hashlib
import json
import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from effect_ledger.domain import canonical
from effect_ledger.domain.canonical import (
    CanonicalizationError,
    canonical_json,
    canonical_json_reference,
    intent_digest,
    serialize_number,
)

# RFC 8785 section 3.2.2, input text as printed in the RFC.
RFC_SAMPLE_INPUT = r"""{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}"""
RFC_SAMPLE_OUTPUT = (
    '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
    '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
)


def test_rfc_sample_object() -> None:
    assert canonical_json(json.loads(RFC_SAMPLE_INPUT)) == RFC_SAMPLE_OUTPUT.encode("utf-8")


def test_rfc_sample_output_bytes_literally() -> None:
    # The same expectation spelled as raw bytes, so a mistake in the escaping of the Python
    # literal above cannot make both sides agree by accident.
    expected = (
        b'{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        b'"string":"\xe2\x82\xac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert canonical_json(json.loads(RFC_SAMPLE_INPUT)) == expected


# RFC 8785 Appendix B: IEEE-754 bit patterns and their ES6 text (cross-checked against node).
APPENDIX_B = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


def _double(bits: str) -> float:
    value: float = struct.unpack(">d", bytes.fromhex(bits))[0]
    return value


@pytest.mark.parametrize(("bits", "expected"), APPENDIX_B)
def test_appendix_b_numbers(bits: str, expected: str) -> None:
    assert serialize_number(_double(bits)) == expected
    assert canonical_json(_double(bits)) == expected.encode("ascii")


@pytest.mark.parametrize(
    "bits", ["7ff0000000000000", "fff0000000000000", "7ff8000000000001", "7fffffffffffffff"]
)
def test_appendix_b_non_finite_numbers_raise(bits: str) -> None:
    with pytest.raises(CanonicalizationError, match="non-finite"):
        canonical_json(_double(bits))


def test_rfc_key_sorting_by_utf16_code_units() -> None:
    value = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    expected = (
        '{"\\r":"Carriage Return","1":"One","\u0080":"Control",'
        '"\u00f6":"Latin Small Letter O With Diaeresis","\u20ac":"Euro Sign",'
        '"\U0001f600":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}'
    )
    assert canonical_json(value) == expected.encode("utf-8")


def test_split_surrogate_pair_is_joined() -> None:
    # json.loads("\"\\ud83d\\ude00\"") already joins the pair; a hand-built str may not have.
    assert canonical_json("\ud83d\ude00") == '"\U0001f600"'.encode()
    assert canonical_json({"\ud83d\ude00": 1}) == '{"\U0001f600":1}'.encode()


@pytest.mark.parametrize("text", ["\ud83d", "\ude00", "a\ude00\ud83d", "x\ud800"])
def test_lone_surrogates_raise(text: str) -> None:
    with pytest.raises(CanonicalizationError, match="lone surrogate"):
        canonical_json(text)
    with pytest.raises(CanonicalizationError, match="lone surrogate"):
        canonical_json({text: 1})


def test_keys_equal_after_joining_surrogates_raise() -> None:
    with pytest.raises(CanonicalizationError, match="duplicate"):
        canonical_json({"\ud83d\ude00": 1, "\U0001f600": 2})


def test_string_escapes() -> None:
    text = "".join(chr(c) for c in range(0x20)) + '"\\/\x7f\u2028\u00e9'
    expected = (
        '"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r'
        "\\u000e\\u000f\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\\u0019"
        '\\u001a\\u001b\\u001c\\u001d\\u001e\\u001f\\"\\\\/\x7f\u2028\u00e9"'
    )
    assert canonical_json(text) == expected.encode("utf-8")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, b"0"),
        (-0.0, b"0"),
        (True, b"true"),
        (False, b"false"),
        (None, b"null"),
        (2**53, b"9007199254740992"),
        (-(2**53), b"-9007199254740992"),
        (2**53 + 1, b"9007199254740992"),  # rounds to the nearest double, as ES6 would
        (10**21, b"1e+21"),
        (10**20, b"100000000000000000000"),
        (123456789012345678901234567890, b"1.2345678901234568e+29"),
        (1.0, b"1"),
        (-1.5, b"-1.5"),
        (1e-7, b"1e-7"),
        (1.25e-6, b"0.00000125"),
        ([], b"[]"),
        ({}, b"{}"),
        ((1, "a"), b'[1,"a"]'),
        ({"b": [True, None], "a": {"d": 1, "c": 2}}, b'{"a":{"c":2,"d":1},"b":[true,null]}'),
    ],
)
def test_scalars_and_containers(value: object, expected: bytes) -> None:
    assert canonical_json(value) == expected


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [1.0, math.nan], {"a": math.inf}])
def test_non_finite_raise(value: object) -> None:
    with pytest.raises(CanonicalizationError, match="non-finite"):
        canonical_json(value)


def test_integer_beyond_double_range_raises() -> None:
    with pytest.raises(CanonicalizationError, match="double range"):
        canonical_json(10**400)


@pytest.mark.parametrize("key", [1, None, 1.5, ("a",), b"a"])
def test_non_string_keys_raise(key: object) -> None:
    with pytest.raises(CanonicalizationError, match="key is not a string"):
        canonical_json({key: 1})


@pytest.mark.parametrize("value", [b"bytes", {1, 2}, object(), 1j, {"a": [bytearray(b"x")]}])
def test_unsupported_types_raise(value: object) -> None:
    with pytest.raises(CanonicalizationError, match="unsupported type"):
        canonical_json(value)


def _nested(levels: int) -> object:
    value: object = 0
    for index in range(levels):
        value = [value] if index % 2 else {"k": value}
    return value


def test_depth_limit_default_is_64_containers() -> None:
    assert canonical_json(_nested(64)).count(b"{") == 32
    with pytest.raises(CanonicalizationError, match="deeper than 64"):
        canonical_json(_nested(65))


def test_depth_limit_is_a_parameter() -> None:
    assert canonical_json([[1]], max_depth=2) == b"[[1]]"
    with pytest.raises(CanonicalizationError, match="deeper than 2"):
        canonical_json([[[1]]], max_depth=2)
    assert canonical_json(5, max_depth=0) == b"5"


def test_cycles_are_stopped_by_the_depth_limit() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    with pytest.raises(CanonicalizationError, match="deeper than"):
        canonical_json(cycle)


def test_intent_digest_vector_checked_by_hand() -> None:
    value = {"note": None, "items": [{"sku": "a\nb", "qty": 2}], "currency": "\u20ac", "amount": 10**21}
    hand_written = '{"amount":1e+21,"currency":"\u20ac","items":[{"qty":2,"sku":"a\\nb"}],"note":null}'
    # Computed separately with `printf '%s' '<hand_written>' | sha256sum`.
    expected_hex = "3cc526b83a9fa1b1aabe20f44ed1495bf9b4b76de8531d10ce4a689afb46e962"
    assert canonical_json(value) == hand_written.encode("utf-8")
    assert hashlib.sha256(hand_written.encode("utf-8")).hexdigest() == expected_hex
    assert intent_digest(value) == "sha256:" + expected_hex


def test_intent_digest_ignores_key_order_and_number_spelling() -> None:
    assert intent_digest(json.loads('{"a": 1.0, "b": 2e0}')) == intent_digest({"b": 2, "a": 1})


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_canonical_form_is_a_fixed_point(value: object) -> None:
    first = canonical_json(value)
    assert canonical_json(json.loads(first)) == first


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_number_text_round_trips_to_the_same_double(value: float) -> None:
    assert float(serialize_number(value)) == value or value == 0


# --- the msgspec fast path (canonical_json) against the rule-by-rule reference --------------------

any_text = st.text(st.characters(blacklist_categories=()))  # surrogates and astral characters too
odd_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**54), max_value=2**54)
    | st.floats(allow_nan=False, allow_infinity=False)
    | any_text
    | st.sampled_from(["\ud83d\ude00", "\U0001f600", "\ue000", "\x7f", "\u2028", '\x00\x1f\b\\"']),
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(
            any_text | st.sampled_from(["\ue000", "\U0001f600", "a", "B"]), children, max_size=5
        )
    ),
    max_leaves=24,
)


def _either(value: object, encode: object) -> tuple[str, object]:
    try:
        return "ok", encode(value)  # type: ignore[operator]
    except CanonicalizationError as refused:
        return "refused", str(refused)


@given(odd_values)
def test_the_fast_path_writes_exactly_what_the_reference_writes(value: object) -> None:
    assert _either(value, canonical_json) == _either(value, canonical_json_reference)


@given(json_values)
def test_the_fast_path_agrees_on_plain_json_values(value: object) -> None:
    assert canonical_json(value) == canonical_json_reference(value)


EVENT = {
    "operation_id": "op-7",
    "seq": 2,
    "at": "2026-11-30T10:00:30.120Z",
    "kind": "submitted",
    "actor": "exec-1",
    "from_status": "pending",
    "to_status": "submitted",
    "attempt": 1,
    "data": {"effect_ref": "remote-req-19", "lease_expires_at": None, "flags": [True, False], "n": -(2**53)},
}


@pytest.mark.parametrize(
    ("value", "fast"),
    [
        (EVENT, True),
        ({"b": [1, "x", None], "a": {"\u00e9": 1, "e": 2}}, True),
        ((1, 2), True),
        ({"a": 1.5}, False),  # floats: ES6 number text
        ([2**53 + 1], False),  # beyond exact doubles
        ({1: "a"}, False),  # msgspec would write the key as a string; the reference refuses
        ([[[]]], True),
    ],
)
def test_which_values_take_the_fast_path(value: object, fast: bool) -> None:
    assert canonical._plain(value, 0, canonical.DEFAULT_MAX_DEPTH) is fast
    assert _either(value, canonical_json) == _either(value, canonical_json_reference)


def test_astral_keys_sort_by_utf16_code_units_not_code_points() -> None:
    # U+E000 is one code unit 0xE000; U+1F600 is the pair 0xD83D 0xDE00, which sorts first in UTF-16
    value = {"\ue000": 1, "\U0001f600": 2}
    assert canonical._plain(value, 0, canonical.DEFAULT_MAX_DEPTH)  # plain, but msgspec's order is wrong
    assert canonical_json(value) == '{"\U0001f600":2,"\ue000":1}'.encode()
    assert canonical_json(value) == canonical_json_reference(value)


def test_too_deep_is_refused_by_either_path() -> None:
    nested: object = "x"
    for _ in range(3):
        nested = [nested]
    assert canonical._plain(nested, 0, 2) is False
    with pytest.raises(CanonicalizationError, match="deeper than 2"):
        canonical_json(nested, max_depth=2)
