"""/metrics after a scripted lifecycle: every counter has exactly the value the script implies."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import asyncpg
import httpx

from support.auth import auth
from support.metrics import by_label, samples, scrape
from support.server import Service
from support.waiting import until

TENANT, EXECUTOR, RECONCILER = "tenant-zz9", "exec-qq7", "recon-kk4"
CLAIM = {"tool": "measure", "tool_version": "2.1.0", "intent": {"sensor": "s-1"}, "lease_seconds": 30}
RECEIPT = {"external_ref": "m-7", "observed_at": "2026-11-30T10:00:00Z"}
EVIDENCE = {"source": "provider-api", "lookup_ref": "q-1", "checked_at": "2026-11-30T10:00:00Z"}


async def claim(http: httpx.AsyncClient, op: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return await http.post(f"/v1/operations/{op}/claim", json=body or CLAIM, headers=auth(TENANT, EXECUTOR))


async def call(http: httpx.AsyncClient, op: str, name: str, body: dict[str, Any], sub: str = EXECUTOR) -> int:
    r = await http.post(f"/v1/operations/{op}/{name}", json=body, headers=auth(TENANT, sub))
    return r.status_code


async def expire_lease(db_url: str, op: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            "UPDATE ledger.operations SET lease_expires_at = now() - interval '1 second'"
            " WHERE tenant_id = $1 AND operation_id = $2",
            TENANT,
            op,
        )
    finally:
        await conn.close()


async def lifecycle(http: httpx.AsyncClient, db_url: str) -> None:
    """The script; each step's expected status is asserted, so a miscount can't hide a wrong answer."""
    # op-ma: granted, in progress, submitted, committed, receipt reused, a foreign intent refused
    token = (await claim(http, "op-ma")).json()["claim"]["token"]
    assert (await claim(http, "op-ma")).status_code == 409
    assert await call(http, "op-ma", "submit", {"token": token, "effect_ref": "r-1"}) == 200
    committed = {"outcome": "committed", "receipt": RECEIPT}
    assert await call(http, "op-ma", "complete", {"token": token, **committed}) == 200
    assert (await claim(http, "op-ma")).json()["action"] == "reuse_receipt"
    assert (await claim(http, "op-ma", {**CLAIM, "intent": {"sensor": "s-2"}})).status_code == 422
    # op-mb: granted with a nonce, replayed, reclaimed after its lease ran out; the old token is stale
    nonce = {**CLAIM, "client_nonce": "nonce-0123456789abcdef"}
    old = (await claim(http, "op-mb", nonce)).json()["claim"]["token"]
    assert (await claim(http, "op-mb", nonce)).headers["idempotent-replayed"] == "true"
    await expire_lease(db_url, "op-mb")
    assert (await claim(http, "op-mb")).json()["claim"]["attempt"] == 2
    assert await call(http, "op-mb", "submit", {"token": old}) == 409
    # op-mc: reported unknown, claimed (outcome_unknown), an unresolved look-up, resolved, contradicted
    token = (await claim(http, "op-mc")).json()["claim"]["token"]
    assert await call(http, "op-mc", "submit", {"token": token}) == 200
    assert await call(http, "op-mc", "complete", {"token": token, "outcome": "unknown"}) == 200
    assert (await claim(http, "op-mc")).status_code == 409
    unresolved = {"outcome": "unresolved", "evidence": EVIDENCE}
    assert await call(http, "op-mc", "resolve", unresolved, RECONCILER) == 200
    resolved = {"outcome": "committed", "receipt": RECEIPT, "evidence": EVIDENCE}
    assert await call(http, "op-mc", "resolve", resolved, RECONCILER) == 200
    reason = {"category": "rejected", "detail_code": None}
    contradiction = {"outcome": "not_applied", "reason": reason, "evidence": EVIDENCE}
    assert await call(http, "op-mc", "resolve", contradiction, RECONCILER) == 409
    # op-md: submitted lease expires unswept; a late report materialises the expiry, then commits
    token = (await claim(http, "op-md")).json()["claim"]["token"]
    assert await call(http, "op-md", "submit", {"token": token}) == 200
    await expire_lease(db_url, "op-md")
    assert await call(http, "op-md", "complete", {"token": token, **committed}) == 200
    # op-me: not_applied, then a new attempt
    token = (await claim(http, "op-me")).json()["claim"]["token"]
    not_applied = {"outcome": "not_applied", "reason": reason}
    assert await call(http, "op-me", "complete", {"token": token, **not_applied}) == 200
    assert (await claim(http, "op-me")).status_code == 201


async def test_counters_after_a_scripted_lifecycle(service: Service, db_url: str) -> None:
    async with service.client() as http:
        await lifecycle(http, db_url)
        scrape = await http.get("/metrics")
    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain")
    found = samples(scrape.text)

    assert by_label(found, "effect_ledger_claims_total", "result") == {
        "granted": 5,
        "reclaimed": 2,
        "replayed": 1,
        "reuse_receipt": 1,
        "in_progress": 1,
        "outcome_unknown": 1,
        "intent_conflict": 1,
        "approval_required": 0,
        "approval_denied": 0,
    }
    transitions = {
        (dict(labels)["from_status"], dict(labels)["to_status"]): value
        for (name, labels), value in found.items()
        if name == "effect_ledger_transitions_total"
    }
    assert transitions == {
        ("none", "pending"): 5,
        ("pending", "submitted"): 3,
        ("pending", "committed"): 0,
        ("pending", "not_applied"): 1,
        ("submitted", "committed"): 1,
        ("submitted", "not_applied"): 0,
        ("submitted", "unknown"): 2,
        ("unknown", "committed"): 2,
        ("unknown", "not_applied"): 0,
        ("not_applied", "pending"): 1,
    }
    assert by_label(found, "effect_ledger_unknown_outcomes_recorded_total", "cause") == {
        "reported": 1,
        "lease_expired": 1,
    }
    assert by_label(found, "effect_ledger_unknown_outcomes_resolved_total", "outcome") == {
        "committed": 2,
        "not_applied": 0,
    }
    assert by_label(found, "effect_ledger_reconciliations_total", "outcome") == {
        "committed": 1,
        "not_applied": 0,
        "unresolved": 1,
        "conflicting": 1,
    }
    assert by_label(found, "effect_ledger_lease_expiries_total", "via") == {"sweep": 0, "transition": 1}
    refusals = {
        (dict(labels)["call"], dict(labels)["code"]): value
        for (name, labels), value in found.items()
        if name == "effect_ledger_refusals_total"
    }
    assert refusals == {("submit", "stale_claim"): 1, ("resolve", "conflicting_outcome"): 1}


async def test_request_histogram_by_route_template_method_and_status_class(
    service: Service, db_url: str
) -> None:
    async with service.client() as http:
        await lifecycle(http, db_url)
        assert (await http.get("/nowhere")).status_code == 404
        found = samples((await http.get("/metrics")).text)
    counts = {
        (d["route"], d["method"], d["status"]): value
        for (name, labels), value in found.items()
        if name == "effect_ledger_http_request_duration_seconds_count" and (d := dict(labels))
    }
    claim_route = "/v1/operations/{operation_id}/claim"
    assert counts[(claim_route, "POST", "2xx")] == 9
    assert counts[(claim_route, "POST", "4xx")] == 3
    assert counts[("/v1/operations/{operation_id}/submit", "POST", "4xx")] == 1
    assert counts[("unmatched", "GET", "4xx")] == 1
    assert all(route.startswith("/") or route == "unmatched" for route, _, _ in counts)
    assert not any("op-m" in route for route, _, _ in counts)  # templates, never concrete paths


async def test_no_tenant_principal_or_operation_in_any_series(service: Service, db_url: str) -> None:
    async with service.client() as http:
        await lifecycle(http, db_url)
        text = (await http.get("/metrics")).text
    labels = {name for (_, pairs) in samples(text) for name, _ in pairs}
    assert labels.isdisjoint({"tenant", "tenant_id", "principal", "sub", "operation", "operation_id"})
    for value in (TENANT, EXECUTOR, RECONCILER, "op-ma", "op-mb", "op-mc", "op-md", "op-me"):
        assert value not in text


async def test_pool_gauges_are_read_at_scrape_time(service: Service) -> None:
    async with service.client() as http:
        found = samples((await http.get("/metrics")).text)
    pools = {
        (d["pool"], d["state"]): value
        for (name, labels), value in found.items()
        if name == "effect_ledger_db_pool_connections" and (d := dict(labels))
    }
    assert pools[("runtime", "in_use")] == 0 and pools[("reader", "in_use")] == 0
    assert pools[("runtime", "idle")] >= 1 and pools[("reader", "idle")] >= 1
    assert by_label(found, "effect_ledger_db_pool_max_connections", "pool") == {
        "runtime": 20,
        "audit": 3,
        "reader": 2,
    }
    # a connection held outside a request shows as in use
    ledger = service.app.state.ledger
    async with ledger.pool.acquire():
        async with service.client() as http:
            held = samples((await http.get("/metrics")).text)
    key = ("effect_ledger_db_pool_connections", frozenset({("pool", "runtime"), ("state", "in_use")}))
    assert held[key] == 1


async def test_metrics_needs_no_token_and_is_not_cached_per_app(settings: Any) -> None:
    # two apps in one process keep separate counts (each test's service starts from zero)
    async with Service(settings) as first, first.client() as http:
        assert (await claim(http, "op-one")).status_code == 201
        one = samples((await http.get("/metrics")).text)
    async with Service(settings) as second, second.client() as http:
        two = samples((await http.get("/metrics")).text)
    key = ("effect_ledger_claims_total", frozenset({("result", "granted")}))
    assert one[key] == 1 and two[key] == 0


async def test_the_background_sweep_counts_its_expiries(settings: Any, db_url: str) -> None:
    sweeping = replace(settings, background_sweep=True, sweep_interval_seconds=1)
    async with Service(sweeping) as running, running.client() as http:
        token = (await claim(http, "op-sweep")).json()["claim"]["token"]
        assert await call(http, "op-sweep", "submit", {"token": token}) == 200
        await expire_lease(db_url, "op-sweep")
        swept = await until(  # the sweeper runs every second
            lambda: scrape(http),
            "the sweeper's expiry counted",
            holds=lambda found: by_label(found, "effect_ledger_lease_expiries_total", "via")["sweep"],
        )
        expiries = by_label(swept, "effect_ledger_lease_expiries_total", "via")
        found = samples((await http.get("/metrics")).text)
    assert expiries == {"sweep": 1, "transition": 0}
    assert by_label(found, "effect_ledger_unknown_outcomes_recorded_total", "cause") == {
        "reported": 0,
        "lease_expired": 1,
    }
    edge = frozenset({("from_status", "submitted"), ("to_status", "unknown")})
    assert found[("effect_ledger_transitions_total", edge)] == 1
