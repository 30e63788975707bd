"""Scenario 12: abusive bodies. Oversized, deeply nested, huge arrays, invalid UTF-8, strings the
database cannot store: each answered with its exact 4xx problem, none with a 5xx."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from support.harness import bearer, chaos_settings, check_ledger, read_state, scenario, timeout
from support.recording import History, check_answers
from support.server import Service

pytestmark = [pytest.mark.chaos, timeout(60, 300)]

HEADERS = {
    **bearer("t1", "exec-1", "ledger:execute ledger:reconcile diagnostics:write"),
    "Content-Type": "application/json",
}
CLAIM = {"tool": "t", "tool_version": "1", "intent": {"x": 1}}


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _claim(**fields: Any) -> bytes:
    return _json({**CLAIM, **fields})


def cases(token: str) -> dict[str, tuple[str, bytes, dict[str, str], int, str]]:
    """name -> (path, body, extra headers, expected status, expected problem code)."""
    deep = "[" * 100_000 + "]" * 100_000
    claim = "/v1/operations/abuse/claim"
    head = b'{"tool":"t","tool_version":"1","intent":'
    many_headers = {f"x-ratelimit-{n}": "1" for n in range(8_000)}
    return {
        "body_300_kib": (claim, _claim(intent="x" * 300 * 1024), {}, 413, "payload_too_large"),
        "body_300_kib_chunked": (
            claim,
            _claim(intent="x" * 300 * 1024),
            {"Transfer-Encoding": "chunked"},
            413,
            "payload_too_large",
        ),
        "huge_array_over_the_limit": (claim, _claim(intent=[0] * 100_000), {}, 413, "payload_too_large"),
        # nesting beyond what the decoder follows is a bad body (422), never a crashed worker
        "nested_100k_as_body": (claim, deep.encode(), {}, 422, "validation_failed"),
        "nested_100k_in_intent": (claim, head + deep.encode() + b"}", {}, 422, "validation_failed"),
        "nested_objects_in_intent": (
            claim,
            head + b'{"a":' * 20_000 + b"1" + b"}" * 20_000 + b"}",
            {},
            422,
            "validation_failed",
        ),
        "huge_array_intent": (claim, _claim(intent=[0] * 60_000), {}, 422, "validation_failed"),
        "huge_array_unknown_field": (claim, _claim(extra=[0] * 60_000), {}, 422, "validation_failed"),
        "huge_array_of_objects": (claim, _claim(intent=[{}] * 60_000), {}, 422, "validation_failed"),
        "huge_result_in_receipt": (
            "/v1/operations/abuse/complete",
            _json({"token": token, "outcome": "committed", "receipt": {"result": ["r" * 100] * 400}}),
            {},
            422,
            "validation_failed",
        ),
        "diagnostics_huge_headers": (
            "/v1/diagnostics",
            _json({"headers": many_headers}),
            {},
            422,
            "validation_failed",
        ),
        "invalid_utf8": (
            claim,
            b'{"tool":"\xff\xfe\xfd","tool_version":"1","intent":{}}',
            {},
            400,
            "malformed_request",
        ),
        "invalid_utf8_in_intent": (claim, head + b'"\xc3\x28"}', {}, 400, "malformed_request"),
        "lone_surrogate_in_tool": (
            claim,
            b'{"tool":"\\ud800","tool_version":"1","intent":{}}',
            {},
            400,
            "malformed_request",
        ),
        "lone_surrogate_in_intent": (claim, head + b'"\\udfff"}', {}, 400, "malformed_request"),
        # JSON allows U+0000; PostgreSQL text and jsonb do not: refused as a value, not a server fault
        "nul_in_tool": (claim, _claim(tool="a\u0000b"), {}, 422, "validation_failed"),
        "nul_in_intent": (claim, _claim(intent={"k": "a\u0000b"}), {}, 201, ""),  # digested, not stored
        "nul_in_effect_ref": (
            "/v1/operations/abuse/submit",
            _json({"token": token, "effect_ref": "a\u0000"}),
            {},
            422,
            "validation_failed",
        ),
        "nul_in_receipt_result": (
            "/v1/operations/abuse/complete",
            _json({"token": token, "outcome": "committed", "receipt": {"result": {"k": "\u0000"}}}),
            {},
            422,
            "validation_failed",
        ),
        "huge_integer": (claim, head + b"9" * 5000 + b"}", {}, 400, "malformed_request"),
        "float_overflow": (claim, head + b"1e999999}", {}, 400, "malformed_request"),
        "huge_lease": (claim, _claim(lease_seconds=10**30), {}, 422, "validation_failed"),
        "nan_literal": (claim, head + b"NaN}", {}, 400, "malformed_request"),
        "not_json": (claim, b"hello", {}, 400, "malformed_request"),
        "json_array_body": (claim, b"[1,2,3]", {}, 400, "malformed_request"),
        "json_null_body": (claim, b"null", {}, 400, "malformed_request"),
        "truncated_json": (claim, b'{"tool":"t","tool_ver', {}, 400, "malformed_request"),
        "duplicate_keys": (claim, b'{"tool":"t","tool":"u","tool_version":"1","intent":{}}', {}, 201, ""),
        "long_operation_id": (
            "/v1/operations/" + "a" * 201 + "/claim",
            _claim(),
            {},
            422,
            "validation_failed",
        ),
    }


async def test_abusive_bodies_get_their_4xx_and_never_a_5xx(
    request: pytest.FixtureRequest, db_url: str
) -> None:
    history = History()
    settings = chaos_settings(db_url)
    with scenario(request, "body_abuse") as figures:
        async with (
            Service(settings) as service,
            httpx.AsyncClient(base_url=service.base_url, transport=history.transport(), timeout=30) as http,
        ):
            r = await http.post("/v1/operations/abuse/claim", content=_claim(), headers=HEADERS)
            assert r.status_code == 201, r.text
            token = r.json()["claim"]["token"]
            table = cases(token)
            for name, (path, body, extra, status, code) in table.items():
                if extra.get("Transfer-Encoding") == "chunked":

                    async def chunks(data: bytes = body) -> Any:
                        for start in range(0, len(data), 16384):
                            yield data[start : start + 16384]

                    content: Any = chunks()
                else:
                    content = body
                r = await http.post(
                    path.replace("abuse", f"abuse-{name}") if code == "" else path,
                    content=content,
                    headers={**HEADERS, **extra},
                )
                got = r.json().get("code", "") if r.status_code >= 400 else ""
                if (r.status_code, got) != (status, code):
                    figures.violations.append(f"{name}: {r.status_code} {got}, expected {status} {code}")
            state = await read_state(db_url)
        figures.operations = len(history.calls)
        figures.faults = len(table)
        figures.extra = {"answers": dict(sorted(history.statuses().items()))}
        figures.check(check_answers(history, allowed_5xx=frozenset()))
        figures.check(check_ledger(state))
    figures.assert_clean()


async def test_empty_body_is_a_malformed_request(db_url: str) -> None:
    settings = chaos_settings(db_url)
    async with Service(settings) as service, service.client() as http:
        r = await http.post("/v1/operations/empty/claim", content=b"", headers=HEADERS)
    assert r.status_code == 400 and r.json()["code"] == "malformed_request", r.text
