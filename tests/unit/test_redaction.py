"""Log redaction: secret-named fields, credential-shaped values and bearer substrings are masked."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
import structlog

from effect_ledger.domain.redaction import REDACTED, is_sensitive_key, redact_secrets, redact_value

# Fake secrets are assembled from pieces so that no literal here trips a secret scanner.
JWT = ".".join(
    [
        base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=").decode(),
        base64.urlsafe_b64encode(b'{"sub":"executor-1","tenant":"t1"}').rstrip(b"=").decode(),
        "Sfl" + "KxwRJSMeKKF2QT4fwpMeJf36POk6yJV",
    ]
)
AWS_KEY_ID = "AKIA" + "IOSFODNN7EXAMPLE"
CLAIM_TOKEN = "clt_" + base64.urlsafe_b64encode(bytes(range(32))).rstrip(b"=").decode()


def run(event_dict: dict[str, Any]) -> dict[str, Any]:
    return redact_secrets(None, "info", event_dict)


def test_secret_named_fields_are_masked_at_every_level() -> None:
    event = {
        "event": "claim.granted",
        "Authorization": "Bearer " + JWT,
        "operation_id": "op-7",
        "headers": {"X-Api-Key": "k-1", "accept": "application/json", "Set-Cookie": "sid=1"},
        "attempts": [{"password": "hunter2", "n": 1}, {"claim_token": None, "n": 2}],
        "jwt": {"nested": "whole value goes"},
    }
    assert run(event) == {
        "event": "claim.granted",
        "Authorization": REDACTED,
        "operation_id": "op-7",
        "headers": {"X-Api-Key": REDACTED, "accept": "application/json", "Set-Cookie": REDACTED},
        "attempts": [{"password": REDACTED, "n": 1}, {"claim_token": REDACTED, "n": 2}],
        "jwt": REDACTED,
    }


SENSITIVE_NAMES = [
    "authorization",
    "Proxy-Authorization",
    "TOKEN",
    "claim_token",
    "claimToken",
    "refresh_token",
    "client_secret",
    "Password",
    "db_passwd",
    "jwt",
    "cookie",
    "api_key",
    "x-api-key",
    "apiKey",
    "private_key",
]


@pytest.mark.parametrize("name", SENSITIVE_NAMES)
def test_sensitive_names(name: str) -> None:
    assert is_sensitive_key(name) is True


@pytest.mark.parametrize(
    "name",
    ["max_tokens", "input_tokens", "author", "request_id", "intent_digest", "primary_key", "monkey", "event"],
)
def test_ordinary_names(name: str) -> None:
    assert is_sensitive_key(name) is False


def test_credential_shaped_values_are_replaced_under_any_name() -> None:
    event = {
        "event": "provider.failed",
        "detail": JWT,
        "sent": ["ok", AWS_KEY_ID, ("tuple", CLAIM_TOKEN)],
        "note": "upstream echoed " + AWS_KEY_ID + " back",
    }
    assert run(event) == {
        "event": "provider.failed",
        "detail": REDACTED,
        "sent": ["ok", REDACTED, ("tuple", REDACTED)],
        "note": REDACTED,
    }


def test_bearer_substrings_are_masked_inside_longer_strings() -> None:
    event = {
        "event": "auth.rejected",
        "reason": "header was Bearer abc, expected a JWT",
        "hint": "send bearer xyz-1 again",
        "twice": "Bearer a and Bearer b",
    }
    assert run(event) == {
        "event": "auth.rejected",
        "reason": "header was Bearer [redacted], expected a JWT",
        "hint": "send bearer [redacted] again",
        "twice": "Bearer [redacted] and Bearer [redacted]",
    }


def test_ordinary_values_pass_through_unchanged() -> None:
    event = {
        "event": "request.finished",
        "request_id": "req_01HV8X9Z3K4M5N6P7Q8R9S0T1V",
        "tenant": "t1",
        "principal": "executor-1",
        "operation_id": "550e8400-e29b-41d4-a716-446655440000",
        "intent_digest": "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "outcome": "Too Many Requests",
        "status": 429,
        "duration_ms": 12.5,
        "retryable": True,
        "attempt": None,
        "max_tokens": 1024,
        "timestamp": "2024-05-01T12:34:56.789012Z",
    }
    assert run(event) == event


def test_credential_shaped_keys_are_hidden() -> None:
    event = {"event": "x", "headers": {"accept": "*/*", AWS_KEY_ID: "value"}}
    assert run(event) == {"event": "x", "headers": {"accept": "*/*", "[redacted]#1": REDACTED}}


def test_the_input_is_not_modified() -> None:
    body = {"password": "hunter2", "items": [{"detail": JWT}]}
    event = {"event": "body.logged", "body": body}
    before = copy.deepcopy(event)
    result = run(event)
    assert event == before
    assert result["body"] is not body
    assert result == {"event": "body.logged", "body": {"password": REDACTED, "items": [{"detail": REDACTED}]}}


def test_redaction_is_idempotent() -> None:
    event = {"event": "e", "token": "t", "detail": JWT, "text": "Bearer abc here", "n": 3}
    once = run(event)
    assert (
        run(once)
        == once
        == {"event": "e", "token": REDACTED, "detail": REDACTED, "text": "Bearer [redacted] here", "n": 3}
    )


class _Opaque:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"_Opaque({self.text!r})"


def test_other_objects_are_judged_by_their_rendered_text() -> None:
    harmless = _Opaque("fine")
    event = {
        "event": "e",
        "obj": harmless,
        "leak": _Opaque(JWT),
        "raw": AWS_KEY_ID.encode(),
        "bytes": b"plain",
    }
    result = run(event)
    assert result == {"event": "e", "obj": harmless, "leak": REDACTED, "raw": REDACTED, "bytes": b"plain"}
    assert result["obj"] is harmless


def test_nesting_beyond_the_limit_is_replaced() -> None:
    deep: object = "leaf"
    for _ in range(40):
        deep = [deep]
    expected: object = REDACTED
    for _ in range(31):  # the event dict is level 1; lists below it are kept to level 31
        expected = [expected]
    assert run({"event": "deep", "value": deep}) == {"event": "deep", "value": expected}


def test_redact_value_on_scalars() -> None:
    assert redact_value("Bearer " + JWT) == REDACTED
    assert redact_value("plain text") == "plain text"
    assert redact_value(7) == 7


def test_structlog_renders_no_secret() -> None:
    # The processor as structlog runs it, ahead of the JSON renderer, without global config.
    logger = structlog.wrap_logger(
        structlog.ReturnLogger(),
        processors=[redact_secrets, structlog.processors.JSONRenderer(sort_keys=True)],
    )
    line = logger.info(
        "claim.granted",
        operation_id="op-7",
        claim_token=CLAIM_TOKEN,
        headers={"authorization": "Bearer " + JWT},
        detail="used " + CLAIM_TOKEN,
    )
    assert json.loads(line) == {
        "claim_token": REDACTED,
        "detail": REDACTED,
        "event": "claim.granted",
        "headers": {"authorization": REDACTED},
        "operation_id": "op-7",
    }
    for secret in (CLAIM_TOKEN, JWT, "eyJ"):
        assert secret not in line
