"""Scenario 10: schemathesis against /schema/openapi.json, with valid tokens of every scope. No 5xx;
every error is problem+json; every 2xx conforms to the schema and every operation view to docs/api.md."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from effect_ledger.domain.errors import PROBLEMS
from effect_ledger.http.auth import ALL_SCOPES
from support.auth import token
from support.harness import LONG, TOKEN_TTL_SECONDS, chaos_settings, scale, scenario, timeout
from support.ledger import VIEW_KEYS
from support.server import Service

pytestmark = [pytest.mark.chaos, timeout(150, 1800)]

EXAMPLES = scale(1000, 6000)

# one token per scope, and a token of another tenant; half of the cases carry every scope
FULL = token("t1", "fuzz-1", ttl=TOKEN_TTL_SECONDS)
TOKENS = [
    *(token("t1", "fuzz-1", scope, ttl=TOKEN_TTL_SECONDS) for scope in ALL_SCOPES),
    token("t2", "fuzz-2", ttl=TOKEN_TTL_SECONDS),
]


def problems_in(status: int, content_type: str, body: Any) -> list[str]:
    """What is wrong with an error answer, by docs/api.md section 4."""
    if not content_type.startswith("application/problem+json") or not isinstance(body, dict):
        return [f"{status} is not problem+json ({content_type})"]
    found = []
    code = body.get("code")
    if code not in PROBLEMS or PROBLEMS[code][0] != status:
        found.append(f"{status} with code {code!r}")
    if body.get("type") != f"urn:effect-ledger:problem:{code}" or body.get("status") != status:
        found.append(f"{status}: type/status members {body.get('type')!r} {body.get('status')!r}")
    if not isinstance(body.get("title"), str) or not isinstance(body.get("detail"), str):
        found.append(f"{status}: title or detail missing")
    return found


def views_in(body: Any) -> list[dict[str, Any]]:
    """Every operation view an answer carries."""
    if isinstance(body, dict) and isinstance(body.get("items"), list):
        return [v for v in body["items"] if isinstance(v, dict) and "intent_digest" in v]
    if isinstance(body, dict) and isinstance(body.get("operation"), dict):
        return [body["operation"]]
    if isinstance(body, dict) and "intent_digest" in body:
        return [body]
    return []


def fuzz(schema: Any, base_url: str, examples: int, seen: Counter[str], found: list[str]) -> None:
    """Generate cases (positive and negative) for every operation and check each answer."""
    cases = st.one_of(
        schema.as_strategy(generation_mode=GenerationMode.POSITIVE),
        schema.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=not LONG,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases, bearer=st.one_of(st.just(FULL), st.sampled_from(TOKENS)))
    def one(case: Any, bearer: str) -> None:
        response = case.call(base_url=base_url, headers={"Authorization": f"Bearer {bearer}"}, timeout=30)
        status = response.status_code
        seen[f"{status}"] += 1
        where = f"{case.method} {case.formatted_path}"
        content_type = (response.headers.get("content-type") or [""])[0]
        try:
            body = json.loads(response.content) if response.content else None
        except ValueError:
            body = None
        if status >= 500:
            found.append(f"{where}: {status}")
        if status >= 400:
            found.extend(f"{where}: {p}" for p in problems_in(status, content_type, body))
        try:  # the answer, error or not, is documented: its status, media type and body schema
            checks = [status_code_conformance, content_type_conformance, response_schema_conformance]
            case.validate_response(response, checks=checks)
        except Exception as failure:  # schemathesis raises a group of failed checks
            found.append(f"{where}: {status} does not conform: {str(failure).splitlines()[0]}")
        if status < 400:
            for view in views_in(body):
                # members a view may add: incident (section 6), position (the feed), a tombstone's (9a)
                extra = (
                    set(view) - VIEW_KEYS - {"incident", "position", "purged", "receipt_digest", "log_index"}
                )
                if VIEW_KEYS - set(view) or extra:
                    found.append(f"{where}: operation view keys {sorted(set(view) ^ VIEW_KEYS)}")

    one()


async def _seed(base_url: str) -> None:
    """A few operations in every state, so generated IDs and lists sometimes find something."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        headers = {"Authorization": f"Bearer {token('t1', 'fuzz-1')}"}
        for n in range(5):
            r = await http.post(
                f"/v1/operations/seed-{n}/claim",
                headers=headers,
                json={"tool": "t", "tool_version": "1", "intent": {"n": n}},
            )
            claim_token = r.json()["claim"]["token"]
            if n >= 1:
                submit = {"token": claim_token}
                await http.post(f"/v1/operations/seed-{n}/submit", headers=headers, json=submit)
            if n >= 2:
                outcome = {2: "committed", 3: "not_applied", 4: "unknown"}[n]
                extra = {"receipt": {"external_ref": "e"}} if n == 2 else {}
                extra = {"reason": {"category": "rejected"}} if n == 3 else extra
                await http.post(
                    f"/v1/operations/seed-{n}/complete",
                    headers=headers,
                    json={"token": claim_token, "outcome": outcome, **extra},
                )


async def test_fuzzed_requests_never_get_a_5xx_and_errors_are_problems(
    request: pytest.FixtureRequest, db_url: str
) -> None:
    config = chaos_settings(db_url)
    seen: Counter[str] = Counter()
    found: list[str] = []
    with scenario(request, "api_fuzzing") as figures:
        async with Service(config) as service:
            await _seed(service.base_url)
            async with httpx.AsyncClient(base_url=service.base_url) as http:
                document = (await http.get("/schema/openapi.json")).json()
            schema = schemathesis.openapi.from_dict(document)
            operations = sum(1 for _ in schema.get_all_operations())
            await asyncio.to_thread(fuzz, schema, service.base_url, EXAMPLES, seen, found)
        figures.operations = sum(seen.values())
        figures.faults = figures.operations  # every request is generated input
        figures.extra = {
            "api_operations": operations,
            "tokens": len(TOKENS) + 1,
            "answers": dict(sorted(seen.items())),
        }
        figures.check(sorted(set(found)))
    figures.assert_clean()
    assert operations >= 15 and figures.operations >= EXAMPLES * 0.9


async def test_openapi_documents_the_problem_answers(db_url: str) -> None:
    config = chaos_settings(db_url)
    async with Service(config) as service, service.client() as http:
        document = (await http.get("/schema/openapi.json")).json()
    claim = document["paths"]["/v1/operations/{operation_id}/claim"]["post"]["responses"]
    for status in ("401", "403", "409", "422", "503"):
        assert "application/problem+json" in claim.get(status, {}).get("content", {}), status
