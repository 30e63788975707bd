"""Credential screening: what must be caught, what must pass, and where find_credentials points."""

from __future__ import annotations

import base64
import json
import math
import string
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effect_ledger.domain import screening
from effect_ledger.domain.screening import _screened, find_credentials, looks_like_credential

# Fake secrets are assembled from pieces so that this file holds no literal that a
# repository secret scanner would (rightly) refuse to let through a push.
MIXED = "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zC7"  # 34 chars of upper, lower and digits


def _b64url(data: dict[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


JWT = ".".join(
    [_b64url({"alg": "HS256", "typ": "JWT"}), _b64url({"sub": "op-7", "tenant": "t1"}), "Sfl" + MIXED[:24]]
)
UNSIGNED_JWT = _b64url({"alg": "none"}) + "." + _b64url({"sub": "1"}) + "."
BASIC = base64.b64encode(b"svc-user:pa55word").decode()
PEM_HEADER = "-----BEGIN " + "RSA PRIVATE KEY-----"

POSITIVES = [
    pytest.param("Bearer " + "abcdef123456", id="bearer-opaque"),
    pytest.param("bearer " + JWT, id="bearer-lowercase-jwt"),
    pytest.param("Authorization: Bearer " + MIXED[:20], id="bearer-inside-header-line"),
    pytest.param("Basic " + BASIC, id="basic-user-password"),
    pytest.param("Basic " + base64.b64encode(b"user:pass").decode(), id="basic-all-letters"),
    pytest.param(JWT, id="jwt"),
    pytest.param(UNSIGNED_JWT, id="jwt-alg-none"),
    pytest.param(f"upstream said: token {JWT} expired", id="jwt-in-prose"),
    pytest.param(PEM_HEADER + "\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----", id="pem-rsa"),
    pytest.param("-----BEGIN " + "PRIVATE KEY-----", id="pem-pkcs8"),
    pytest.param("-----BEGIN " + "OPENSSH PRIVATE KEY-----", id="pem-openssh"),
    pytest.param("AKIA" + "IOSFODNN7EXAMPLE", id="aws-akia"),
    pytest.param("ASIA" + "Y34FZKBOKMUTVV7A", id="aws-asia"),
    pytest.param("gh" + "p_" + MIXED + "01", id="github-ghp"),
    pytest.param("gh" + "s_" + MIXED + "01", id="github-ghs"),
    pytest.param("github" + "_pat_11ABCDEFG0_" + MIXED + MIXED, id="github-fine-grained"),
    pytest.param("xo" + "xb-123456789012-1234567890123-" + MIXED[:24], id="slack-bot"),
    pytest.param("sk" + "_live_" + MIXED[:24], id="stripe-live"),
    pytest.param("sk" + "_test_" + MIXED[:24], id="stripe-test"),
    pytest.param("rk" + "_live_" + MIXED[:24], id="stripe-restricted"),
    pytest.param("sk" + "-proj-" + MIXED, id="openai-project"),
    pytest.param("sk" + "-ant-api03-" + MIXED + "_" + MIXED, id="anthropic"),
    pytest.param("AI" + "za" + "SyA-1234567890abcdefghijklmnopqrstu", id="google-api-key"),
    pytest.param("wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY", id="aws-secret-access-key"),
    pytest.param("Qcb0Orv1zh30vL1MPRsbm-diHiMwcLyZvn1arpZv", id="generic-base64url"),
    pytest.param("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", id="generic-hex-64"),
    pytest.param("https://svc:" + "hunter22@db.example.com/ledger", id="url-with-password"),
    pytest.param("https://b.s3.amazonaws.com/k?X-Amz-Signature=" + "0a1b2c3d4e5f6789", id="presigned-url"),
    pytest.param("clt_" + base64.urlsafe_b64encode(bytes(range(32))).rstrip(b"=").decode(), id="claim-token"),
    pytest.param("password=" + "hunter22", id="password-assignment"),
    pytest.param("api_key: " + "a1b2c3d4e5", id="api-key-assignment"),
    # round 36 (an audit stored each of these):
    pytest.param('{"password": "' + "Hunter22x" + '"}', id="password-json-member"),
    pytest.param('{"api_key": "' + MIXED[:16] + '"}', id="api-key-json-member"),
    pytest.param("Bearer%20" + MIXED[:20], id="bearer-percent-encoded"),
    pytest.param("api key " + MIXED[:20], id="api-key-prose"),
    pytest.param(
        "https://hooks.slack.com/services/T0" + "ABCDEF/B0ABCDEF/" + MIXED[:24], id="slack-webhook-url"
    ),
    pytest.param(
        "https://discord.com/api/webhooks/123456789012345678/" + MIXED + "_-ab", id="discord-webhook-url"
    ),
]

NEGATIVES = [
    pytest.param("req_01HV8X9Z3K4M5N6P7Q8R9S0T1V", id="ulid-request-id"),
    pytest.param("req_011CSHoEeqs5C35K2UUqR7Fy", id="anthropic-request-id"),
    pytest.param("req_" + "6f0b5a3c2e1d4f7a8b9c0d1e2f3a4b5c", id="openai-request-id"),
    pytest.param("msg_01XFDUDYJgAACzvnptvVoYEL", id="message-id"),
    pytest.param("chatcmpl-" + "B9MHDbslfkBeAs8l4bebGdFOJ6PeG", id="completion-id"),
    pytest.param("550e8400-e29b-41d4-a716-446655440000", id="uuid"),
    pytest.param("F47AC10B-58CC-4372-A567-0E02B2C3D479", id="uuid-upper"),
    pytest.param("6f0b5a3c2e1d4f7a8b9c0d1e2f3a4b5c", id="hex-32-trace-id"),
    pytest.param("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", id="w3c-traceparent"),
    pytest.param(
        "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", id="intent-digest"
    ),
    pytest.param("https://api.example.com/v1/chat/completions?model=gpt-4o&limit=20", id="url-plain"),
    pytest.param("https://user@example.com/path", id="url-user-without-password"),
    pytest.param("https://example.com/cb?sort_key=created_at_desc&page_token=", id="url-harmless-params"),
    pytest.param("2024-05-01T12:34:56.789012Z", id="iso-timestamp-utc"),
    pytest.param("2024-05-01T12:34:56+02:00", id="iso-timestamp-offset"),
    pytest.param("Too Many Requests", id="status-429"),
    pytest.param("Service Unavailable", id="status-503"),
    pytest.param("OK", id="status-200"),
    pytest.param("missing Bearer token in request", id="bearer-in-prose"),
    pytest.param('Bearer error="invalid_token", error_description="expired"', id="bearer-challenge"),
    pytest.param('Basic realm="ledger"', id="basic-challenge"),
    pytest.param("perform a basic username/password check", id="basic-in-prose"),
    pytest.param("Bearer [redacted]", id="bearer-already-redacted"),
    pytest.param("password=********", id="password-masked"),
    pytest.param("token: expired", id="token-word"),
    pytest.param("max_tokens: 1024", id="max-tokens"),
    pytest.param("GetUserProfileV2ResponseHandler2024", id="camel-case-identifier"),
    pytest.param("gpt-4o-mini-2024-07-18-fine-tuned-model", id="model-slug"),
    pytest.param("claude-3-5-sonnet-20241022-v2-bedrock", id="model-slug-digits"),
    pytest.param("invalid_request_error_rate_limit_exceeded", id="snake-case-code"),
    pytest.param("/v1/chat/completions/streaming/events", id="path"),
    pytest.param("sk-learn-is-a-python-library-for-ml", id="sk-slug"),
    pytest.param("arn:aws:iam::123456789012:role/ServiceRole", id="aws-arn"),
    pytest.param("connection reset by peer after 5000ms", id="prose"),
    pytest.param("x-ratelimit-remaining-tokens", id="header-name"),
    pytest.param("", id="empty"),
    pytest.param("api key missing", id="api-key-prose-word"),
    pytest.param("the api key was rejected by upstream", id="api-key-prose-sentence"),
    pytest.param("password: Invalid", id="password-word"),
    pytest.param("see https://hooks.slack.com/ for webhooks", id="slack-docs-url"),
]


@pytest.mark.parametrize("value", POSITIVES)
def test_credentials_are_recognised(value: str) -> None:
    assert looks_like_credential(value) is True


@pytest.mark.parametrize("value", NEGATIVES)
def test_ordinary_values_pass(value: str) -> None:
    assert looks_like_credential(value) is False


def test_tables_are_large_enough() -> None:
    assert len(POSITIVES) >= 20
    assert len(NEGATIVES) >= 20


def test_jwt_shape_without_a_jose_header_passes() -> None:
    # Three dotted base64url segments are not enough: the first must decode to {"alg": ...}.
    not_a_header = _b64url({"kind": "cursor"}) + "." + _b64url({"page": "2"}) + ".x"
    assert looks_like_credential(not_a_header) is False
    assert looks_like_credential("subdomain-of-service.example.com") is False


def test_forty_hex_digits_are_flagged_but_thirty_two_are_not() -> None:
    # The boundary chosen for bare hex: 128-bit ids pass, longer hex strings are treated as keys.
    assert looks_like_credential("0a1b2c3d4e5f60718293a4b5c6d7e8f9") is False
    assert looks_like_credential("0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d") is True


def test_find_credentials_reports_paths_in_document_order() -> None:
    body = {
        "operation_id": "op-7",
        "headers": {
            "x-request-id": "req_011CSHoEeqs5C35K2UUqR7Fy",
            "authorization": "Bearer " + "abcdef123456",
            "retry-after": "30",
        },
        "attempts": [{"detail": "ok"}, {"detail": "sent " + JWT}],
        "tags": ["plain", ["AKIA" + "IOSFODNN7EXAMPLE"]],
        "we ird": "password=" + "hunter22",
        "count": 3,
        "flag": True,
        "nothing": None,
    }
    assert find_credentials(body) == [
        "$.headers.authorization",
        "$.attempts[1].detail",
        "$.tags[1][0]",
        '$["we ird"]',
    ]


def test_find_credentials_reports_keys_without_echoing_them() -> None:
    secret_key = "gh" + "p_" + MIXED + "01"
    body = {"headers": {"accept": "*/*", secret_key: {"nested": "Bearer " + "abcdef123456"}}}
    paths = find_credentials(body)
    assert paths == ["$.headers.<key 1>", "$.headers.<key 1>.nested"]
    assert all(secret_key not in path for path in paths)


def test_secret_key_with_secret_value_is_reported_once() -> None:
    assert find_credentials({"AKIA" + "IOSFODNN7EXAMPLE": "Bearer " + "abcdef123456"}) == ["$.<key 0>"]


def test_find_credentials_on_scalars_and_clean_input() -> None:
    assert find_credentials("Bearer " + "abcdef123456") == ["$"]
    assert find_credentials({"a": ["b", {"c": "d"}], "n": 1.5}) == []
    assert find_credentials(None) == []


def test_find_credentials_handles_deep_nesting() -> None:
    deep: object = "Bearer " + "abcdef123456"
    for _ in range(5000):
        deep = [deep]
    assert find_credentials(deep) == ["$" + "[0]" * 5000]


@pytest.mark.parametrize(
    "adversarial",
    ["aaaaaaaaaaaa." * 5000, "sk-" * 20000, "a:" * 30000, ("eyJ" + "a" * 20 + ".") * 3000, "-" * 65536],
    ids=["dotted-run", "sk-repeat", "colon-repeat", "jwt-like-repeat", "dashes"],
)
def test_screening_is_linear_on_64_kib_inputs(adversarial: str) -> None:
    # These once made an unbounded URL-scheme pattern backtrack for seconds; intents and
    # diagnostics may be 64 KiB, so screening must stay linear in the input size.
    started = time.perf_counter()
    assert looks_like_credential(adversarial) is False
    assert time.perf_counter() - started < 2.0


def test_deeply_nested_jwt_like_header_does_not_crash() -> None:
    header = base64.urlsafe_b64encode(b"[" * 20000).rstrip(b"=").decode()
    assert looks_like_credential(header + ".e30.") is False


# The shortcut for plain words (screening._PLAIN_WORD) against the full screen: words built from the
# plain alphabet and pieces of every shape the full screen knows (random runs, UUIDs and prefixed IDs
# among them, for words of 32 characters and more), so that both answers occur.
_PIECES = [
    "AKIA",
    "ASIA",
    "xoxb-",
    "sk_live_",
    "rk_test_",
    "sk-",
    "ghp_",
    "AIza",
    "clt_",
    "whsec_",
    "op-",
    "req_",
    "github_pat_",
    "0f8fad5b-d9cb-469f-a165-70867728950e",
    "Q7mZp2Lx9VbR4tKw8NcH3sYd6FgJ1uEa",
    "ab12" * 8,
]


# 600 examples: the pieces above make the credential shapes common, so each prefix is met many times
@settings(max_examples=600, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(alphabet=string.ascii_letters + string.digits + "_-", max_size=12),
            st.sampled_from(_PIECES),
        ),
        max_size=8,
    ).map("".join)
)
def test_the_plain_word_shortcut_answers_as_the_full_screen(word: str) -> None:
    assert looks_like_credential(word) == _screened(word)


@pytest.mark.parametrize(
    "word",
    ["AKIA" + "ABCDEFGHIJ234567", "xoxb-" + "1234567890", "sk_live_" + MIXED[:16], "sk-" + MIXED[:22]],
)
def test_short_plain_words_of_a_credential_shape_are_still_caught(word: str) -> None:
    assert len(word) < 32 and looks_like_credential(word) and _screened(word)


@pytest.mark.parametrize(
    ("word", "credential"),
    [
        ("0f8fad5b-d9cb-469f-a165-70867728950e", False),  # a UUID operation ID
        ("icledger-1764650000000000000-12345", False),  # a long slug of words and digits
        ("op-" + MIXED[:40], False),  # a prefixed ID names something
        (MIXED[:40], True),  # a random run of 40 is key material
        ("prefix-" + MIXED[:40], True),
    ],
)
def test_long_plain_words_take_the_shortcut_with_the_full_screens_answer(word: str, credential: bool) -> None:
    assert len(word) >= 32 and looks_like_credential(word) is credential and _screened(word) is credential


# The rewritten helpers against their textbook forms: the ASCII path of the character classes
# (str.upper/lower and one digit search) and the entropy from a table of n*log2(n).
@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=string.printable, max_size=80))
def test_char_classes_of_ascii_text_are_the_textbook_count(text: str) -> None:
    textbook = sum(
        (any(c.islower() for c in text), any(c.isupper() for c in text), any(c.isdigit() for c in text))
    )
    assert screening._char_classes(text) == textbook


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=string.ascii_letters + string.digits + "+/_=-", min_size=1, max_size=300))
def test_entropy_is_the_textbook_shannon_entropy(text: str) -> None:
    counts = Counter(text)
    textbook = -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())
    assert screening._entropy_bits_per_char(text) == pytest.approx(textbook, abs=1e-12)
