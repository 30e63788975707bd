"""Retry amplification, counted on both sides: the ledger separates first attempts from re-attempts
(reclaims, replays, claims bounced by a live lease, repeats answered by a receipt or outcome_unknown),
and the client counts how many of its requests were retries."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx
import pytest

from effect_ledger.client import CallStats, LedgerClient, RateLimited, RetryPolicy
from effect_ledger.settings import Settings
from support import ledger
from support.auth import auth, token
from support.ledger import CLAIM
from support.metrics import samples
from support.server import Service

TENANT, EXECUTOR = "tenant-zz9", "exec-qq7"


async def claim(http: httpx.AsyncClient, op: str, body: dict[str, Any] | None = None) -> httpx.Response:
    """POST claim as this file's executor."""
    return await ledger.claim(http, op, body, tenant=TENANT, sub=EXECUTOR)


def attempts(text: str) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["attempt"], dict(labels)["result"]): value
        for (name, labels), value in samples(text).items()
        if name == "effect_ledger_claim_attempts_total"
    }


async def test_first_attempts_and_re_attempts_are_counted_apart(settings: Settings, db_url: str) -> None:
    async with Service(settings) as service, httpx.AsyncClient(base_url=service.base_url) as http:
        nonce = {**CLAIM, "client_nonce": "nonce-0123456789abcdef"}
        granted = (await claim(http, "op-a", nonce)).json()["claim"]["token"]  # first
        assert (await claim(http, "op-a", nonce)).status_code == 201  # replayed: its answer was "lost"
        assert (await claim(http, "op-a")).status_code == 409  # bounced by the live lease
        assert (await claim(http, "op-a")).status_code == 409  # and again
        await ledger.expire_lease(db_url, "op-a", TENANT)
        reclaimed = (await claim(http, "op-a")).json()["claim"]  # a reclaim after the lease ran out
        assert reclaimed["attempt"] == 2 and reclaimed["token"] != granted
        done = {"token": reclaimed["token"], "outcome": "committed", "receipt": {"external_ref": "r"}}
        assert (
            await http.post("/v1/operations/op-a/complete", json=done, headers=auth(TENANT, EXECUTOR))
        ).status_code == 200
        assert (await claim(http, "op-a")).json()["action"] == "reuse_receipt"  # a repeat after success
        assert (await claim(http, "op-b")).status_code == 201  # first
        assert (await claim(http, "op-a", {**CLAIM, "intent": {"other": 1}})).status_code == 422  # neither
        text = (await http.get("/metrics")).text
    assert attempts(text) == {
        ("first", "granted"): 2,
        ("retry", "replayed"): 1,
        ("retry", "in_progress"): 2,
        ("retry", "reclaimed"): 1,
        ("retry", "reuse_receipt"): 1,
        ("retry", "outcome_unknown"): 0,
    }


async def test_the_client_counts_its_retries(settings: Settings) -> None:
    """Rate limited past a burst of 1 (one token per 1,000 s): every retry is refused, exactly."""
    overrides = json.dumps({"t-amp": {"per_second": 0.001, "burst": 1}})
    config = replace(settings, rate_limit_overrides=overrides)

    async def no_wait(_: float) -> None:
        return None

    policy = RetryPolicy(maximum_attempts=3, deadline_seconds=10_000, sleep=no_wait, jitter=lambda: 0.0)
    async with (
        Service(config) as service,
        LedgerClient(service.base_url, token("t-amp", "exec-1", "ledger:execute"), retry=policy) as client,
    ):
        await client.claim("op-1", tool="t", tool_version="1", intent={})
        assert client.stats == CallStats(calls=1, requests=1, retries=0, retried_calls=0)
        with pytest.raises(RateLimited) as refused:
            await client.claim("op-2", tool="t", tool_version="1", intent={})
        assert refused.value.attempts == 3
        assert client.stats == CallStats(calls=2, requests=4, retries=2, retried_calls=1)
        text = await client.metrics()
    found = samples(text)
    key = ("effect_ledger_rate_limited_total", frozenset({("route", "/v1/operations/{operation_id}/claim")}))
    assert found[key] == 3
