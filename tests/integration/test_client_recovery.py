"""POST /v1/recovery/decide over real HTTP: section 10 vectors, its 422s, its guard, the client call."""

from __future__ import annotations

import random
from dataclasses import asdict
from typing import Any

import httpx
import pytest

from effect_ledger.client import LedgerClient, RecoveryDecision, ValidationFailed
from effect_ledger.domain.recovery import MAX_SAFE_INTEGER, RecoveryInput, decide
from support.auth import auth, token
from support.server import Service

BASE: dict[str, Any] = {
    "attempts": 1,
    "maximum_attempts": 3,
    "minimum_attempt_ms": 100,
    "base_delay_ms": 100,
    "maximum_delay_ms": 1000,
    "now_ms": 0,
    "deadline_ms": 10_000,
    "jitter": 0.5,
    "cause": "transient",
    "output_visible": False,
    "effects": "none",
}

VECTORS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({}, {"action": "retry", "delay_ms": 50}),
    # Unknown effects come before everything, even a refusal, visible output or a spent budget.
    (
        {"effects": "unknown", "cause": "refused", "output_visible": True, "attempts": 3},
        {"action": "reconcile"},
    ),
    ({"cause": "refused"}, {"action": "stop", "reason": "cause"}),
    ({"cause": "cancelled", "output_visible": True}, {"action": "stop", "reason": "cause"}),
    ({"output_visible": True, "effects": "committed"}, {"action": "stop", "reason": "visible"}),
    ({"effects": "committed"}, {"action": "stop", "reason": "effects"}),
    # The initial attempt counts: three attempts of three leave none.
    ({"attempts": 3}, {"action": "stop", "reason": "budget"}),
    ({"attempts": 2}, {"action": "retry", "delay_ms": 100}),
    ({"attempts": 6, "maximum_attempts": 10, "jitter": 0.999}, {"action": "retry", "delay_ms": 999}),
    # A longer upstream Retry-After wins over the local cap...
    ({"maximum_delay_ms": 500, "jitter": 0.99, "retry_after_ms": 600}, {"action": "retry", "delay_ms": 600}),
    ({"retry_after_ms": 0, "jitter": 0}, {"action": "retry", "delay_ms": 0}),
    # ...and the deadline decides whether it fits: delay + minimum attempt must fit what is left.
    ({"retry_after_ms": 600, "now_ms": 9300}, {"action": "retry", "delay_ms": 600}),
    ({"retry_after_ms": 600, "now_ms": 9301}, {"action": "stop", "reason": "budget"}),
    ({"now_ms": 10_000, "deadline_ms": 10_000}, {"action": "stop", "reason": "budget"}),
    (
        {
            "attempts": 40,
            "maximum_attempts": MAX_SAFE_INTEGER,
            "base_delay_ms": MAX_SAFE_INTEGER,
            "maximum_delay_ms": MAX_SAFE_INTEGER,
            "deadline_ms": MAX_SAFE_INTEGER,
            "jitter": 0,
        },
        {"action": "retry", "delay_ms": 0},
    ),
]


@pytest.mark.parametrize(("changes", "expected"), VECTORS)
async def test_vectors(client: httpx.AsyncClient, changes: dict[str, Any], expected: dict[str, Any]) -> None:
    r = await client.post("/v1/recovery/decide", json={**BASE, **changes}, headers=auth())
    assert r.status_code == 200, r.text
    assert r.json() == expected


async def test_server_agrees_with_the_domain_on_random_inputs(client: httpx.AsyncClient) -> None:
    rng = random.Random(20261130)
    for _ in range(60):
        body = {
            **BASE,
            "attempts": rng.randint(1, 8),
            "maximum_attempts": rng.randint(1, 8),
            "minimum_attempt_ms": rng.randint(1, 500),
            "base_delay_ms": rng.randint(1, 400),
            "maximum_delay_ms": rng.randint(1, 3000),
            "now_ms": rng.randint(0, 5000),
            "deadline_ms": rng.randint(0, 8000),
            "jitter": rng.random(),
            "retry_after_ms": rng.choice([None, rng.randint(0, 4000)]),
            "cause": rng.choice(["transient", "transient", "refused", "invalid"]),
            "output_visible": rng.random() < 0.2,
            "effects": rng.choice(["none", "none", "committed", "unknown"]),
        }
        r = await client.post("/v1/recovery/decide", json=body, headers=auth())
        assert r.status_code == 200
        assert r.json() == decide(RecoveryInput(**body)).to_json(), body


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"attempts": 0}, "attempts"),
        ({"maximum_attempts": -1}, "maximum_attempts"),
        ({"minimum_attempt_ms": 0}, "minimum_attempt_ms"),
        ({"base_delay_ms": 1.5}, "base_delay_ms"),
        ({"maximum_delay_ms": MAX_SAFE_INTEGER + 1}, "maximum_delay_ms"),
        ({"now_ms": -1}, "now_ms"),
        ({"deadline_ms": "10"}, "deadline_ms"),
        ({"retry_after_ms": -5}, "retry_after_ms"),
        ({"attempts": True}, "attempts"),
        ({"jitter": 1}, "jitter"),
        ({"jitter": -0.1}, "jitter"),
        ({"cause": ""}, "cause"),
        ({"output_visible": 0}, "output_visible"),
        ({"effects": "some"}, "effects"),
        ({"surprise": 1}, "surprise"),
    ],
)
async def test_invalid_input_is_422_naming_the_field(
    client: httpx.AsyncClient, changes: dict[str, Any], field: str
) -> None:
    r = await client.post("/v1/recovery/decide", json={**BASE, **changes}, headers=auth())
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["code"] == "validation_failed"
    assert [e["field"] for e in r.json()["errors"]] == [field]


async def test_missing_field_is_named(client: httpx.AsyncClient) -> None:
    body = {k: v for k, v in BASE.items() if k != "deadline_ms"}
    r = await client.post("/v1/recovery/decide", json=body, headers=auth())
    assert r.status_code == 422
    assert r.json()["errors"] == [{"field": "deadline_ms", "problem": "required"}]


async def test_any_valid_token_may_ask_but_a_token_is_needed(client: httpx.AsyncClient) -> None:
    no_scopes = {"Authorization": f"Bearer {token(scope='')}"}
    assert (await client.post("/v1/recovery/decide", json=BASE, headers=no_scopes)).status_code == 200
    r = await client.post("/v1/recovery/decide", json=BASE)
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"


async def test_client_call_is_typed(service: Service) -> None:
    async with LedgerClient(service.base_url, token(scope="")) as ledger:
        answer = await ledger.decide_recovery(**{**BASE, "retry_after_ms": 700})
        assert answer == RecoveryDecision(action="retry", delay_ms=700)
        unknown = await ledger.decide_recovery(**{**BASE, "effects": "unknown"})
        assert unknown == RecoveryDecision(action="reconcile")
        with pytest.raises(ValidationFailed) as refused:
            await ledger.decide_recovery(**{**BASE, "jitter": 1.0})
        assert refused.value.errors == [{"field": "jitter", "problem": "must be float < 1.0"}]
        assert refused.value.attempts == 1


def test_the_vectors_match_the_domain() -> None:
    base = RecoveryInput(**BASE)
    for changes, expected in VECTORS:
        assert decide(RecoveryInput(**{**asdict(base), **changes})).to_json() == expected
