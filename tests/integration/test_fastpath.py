"""The executor calls served before routing (http/fastpath.py) answer exactly as the routed handlers do,
decide 401/403/429 before reading the body, and charge the rate limit once per request.

The comparison runs one script of executor calls twice on one database: through the app as built
(fast path on) and through the same app with the fast path unwrapped (every call routed by Litestar),
and compares statuses, header names and bodies with the values that differ by nature (claim tokens,
timestamps, request IDs) masked.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import httpx

from effect_ledger.http.fastpath import ExecutorFastPath
from effect_ledger.settings import Settings
from support.auth import auth, token
from support.server import Service

EXEC = auth("t1", "exec-1", "ledger:execute")
OTHER = auth("t1", "exec-2", "ledger:execute")
READER = auth("t1", "audit-1", "ledger:audit")
CLAIM = {"tool": "t", "tool_version": "1", "intent": {"n": 1}, "lease_seconds": 60}
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def routed_only(service: Service) -> None:
    """Take the fast path out of the service's app: every call goes through Litestar's routing."""
    telemetry = service.app.asgi_handler
    assert isinstance(telemetry.app, ExecutorFastPath)  # type: ignore[attr-defined]
    telemetry.app = telemetry.app.app  # type: ignore[attr-defined]


async def script(http: httpx.AsyncClient, prefix: str) -> list[tuple[int, list[str], Any]]:
    """Every kind of executor answer: grants, replays, refusals, validation problems, auth problems."""
    answers: list[httpx.Response] = []

    async def post(
        op: str,
        call: str,
        body: Any,
        headers: dict[str, str] = EXEC,
        raw: bytes | None = None,
        media: str = "application/json",
    ) -> Any:
        path = f"/v1/operations/{prefix}-{op}/{call}"
        if raw is not None:
            r = await http.post(path, content=raw, headers={**headers, "content-type": media})
        else:
            r = await http.post(path, json=body, headers=headers)
        answers.append(r)
        return r.json()

    nonce = {"client_nonce": "nonce-0123456789abcdef"}
    granted = await post("a", "claim", {**CLAIM, **nonce})
    claim_token = granted["claim"]["token"]
    await post("a", "claim", {**CLAIM, **nonce})  # replayed: Idempotent-Replayed
    await post("a", "claim", CLAIM, OTHER)  # another principal: another binding, 422
    await post("a", "claim", {**CLAIM, "intent": {"n": 2}})  # intent conflict
    await post("a", "heartbeat", {"token": claim_token, "lease_seconds": 30})
    await post("a", "submit", {"token": "wrong-token"})  # stale claim
    await post("a", "submit", {"token": "wrong-token"}, OTHER)  # stale, another principal: not found
    await post("a", "submit", {"token": claim_token, "effect_ref": "ref-1"})
    await post(
        "a", "complete", {"token": claim_token, "outcome": "committed", "receipt": {"external_ref": "r"}}
    )
    await post("a", "claim", CLAIM)  # reuse_receipt
    await post("a", "heartbeat", {"token": claim_token})  # after commit: a refusal
    await post("b", "claim", {**CLAIM, "submit": {"effect_ref": "x"}})  # claim and submit
    await post("c", "claim", {"tool": "t"})  # missing field: 422 (handed to Litestar)
    await post("c", "claim", {**CLAIM, "lease_seconds": "30"})  # strict types: 422
    await post("c", "claim", None, raw=b"[1, 2]")  # not an object: 400
    await post("c", "claim", None, raw=b"{not json")  # not JSON: 400
    await post("c", "claim", None, raw=b"")  # empty: 400
    await post("c", "claim", {**CLAIM, "surprise": 1})  # unknown field: 422
    await post("c", "complete", {"token": "t", "outcome": "committed"})  # no receipt: 422
    await post("d", "claim", None, raw=json.dumps(CLAIM).encode(), media="text/plain")  # another media type
    await post("e", "claim", None, raw=json.dumps(CLAIM).encode(), media="application/json; charset=utf-8")
    await post("c", "claim", CLAIM, READER)  # scope: 403
    await post("c", "claim", CLAIM, {})  # no token: 401
    await post("c", "claim", CLAIM, {"Authorization": "Bearer not-a-jwt"})  # bad token: 401
    return [
        (
            r.status_code,
            sorted(h for h in r.headers if h not in ("x-request-id", "content-length")),
            _masked(r.json(), claim_token, prefix),
        )
        for r in answers
    ]


def _masked(value: Any, claim_token: str, prefix: str) -> Any:
    text = json.dumps(value, sort_keys=True).replace(claim_token, "<token>").replace(prefix, "<prefix>")
    text = _TIME.sub("<time>", text)
    masked = json.loads(text)
    if isinstance(masked, dict) and isinstance(masked.get("claim"), dict):
        masked["claim"]["token"] = "<token>"
    if isinstance(masked, dict) and isinstance(masked.get("incident"), str):
        masked["incident"] = "<incident>"
    return masked


async def test_the_fast_path_answers_exactly_as_the_routed_handlers(settings: Settings) -> None:
    async with Service(settings) as fast, fast.client() as http:
        through_fast = await script(http, "fast")
    async with Service(settings) as routed, routed.client() as http:
        routed_only(routed)
        through_litestar = await script(http, "routed")
    assert [status for status, _, _ in through_fast] == [
        201, 201, 422, 422, 200, 409, 404, 200, 200, 200, 409, 201,
        422, 422, 400, 400, 400, 422, 422, 201, 201, 403, 401, 401,
    ]  # fmt: skip
    assert through_fast == through_litestar


async def test_a_request_handed_to_litestar_is_charged_once(settings: Settings) -> None:
    limits = json.dumps({"t-lim": {"per_second": 0.001, "burst": 2}})  # two requests, then 429
    headers = auth("t-lim", "exec-1", "ledger:execute")
    async with Service(replace(settings, rate_limit_overrides=limits)) as service, service.client() as http:
        bad = await http.post("/v1/operations/fp-1/claim", json={"tool": "t"}, headers=headers)
        assert bad.status_code == 422  # decoded by Litestar after the fast path admitted it
        good = await http.post("/v1/operations/fp-1/claim", json=CLAIM, headers=headers)
        assert good.status_code == 201
        limited = await http.post("/v1/operations/fp-2/claim", content=b"{not json", headers=headers)
        assert limited.status_code == 429 and limited.json()["code"] == "rate_limited"  # before the body
        assert limited.headers["retry-after"].isdigit()


async def test_a_bad_token_is_refused_from_memory_the_second_time(service: Service) -> None:
    forged = token("t1", "exec-1", "ledger:execute")[:-4] + "AAAA"  # the signature no longer matches
    async with service.client() as http:
        first = await http.post(
            "/v1/operations/fp-3/claim", json=CLAIM, headers={"Authorization": f"Bearer {forged}"}
        )
        verifier = service.app.state.verifier
        assert forged in verifier._refused  # remembered with its detail
        second = await http.post(
            "/v1/operations/fp-3/claim", json=CLAIM, headers={"Authorization": f"Bearer {forged}"}
        )
    assert first.status_code == second.status_code == 401
    assert first.json() == second.json() and first.headers["www-authenticate"] == "Bearer"
