"""One JSON summary line per request, the X-Request-ID echo, quiet probes, JSON for stdlib loggers too."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from typing import Any

import httpx
import pytest

from effect_ledger.settings import Settings
from support.auth import auth, token
from support.metrics import samples
from support.server import Service

CLAIM = {"tool": "measure", "tool_version": "2.1.0", "intent": {"sensor": "s-1"}}
LINE_FIELDS = {
    "event",
    "level",
    "timestamp",
    "request_id",
    "outcome",
    "route",
    "method",
    "status",
    "code",
    "tenant",
    "principal",
    "operation_id",
    "duration_ms",
}
GENERATED_ID = re.compile(r"^[0-9a-f]{32}$")


def json_lines(out: str) -> list[dict[str, Any]]:
    """Every stdout line that is a JSON object (all of them should be)."""
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def request_lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [line for line in json_lines(capsys.readouterr().out) if line.get("event") == "request"]


async def test_summary_line_has_every_field_and_echoes_the_request_id(
    client: httpx.AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    headers = {**auth("t-log", "exec-log"), "X-Request-ID": "req-abc.123:4"}
    r = await client.post("/v1/operations/op-log/claim", json=CLAIM, headers=headers)
    assert r.status_code == 201
    assert r.headers["x-request-id"] == "req-abc.123:4"
    [line] = request_lines(capsys)
    assert set(line) == LINE_FIELDS
    assert line["event"] == "request" and line["level"] == "info"
    assert line["request_id"] == "req-abc.123:4"
    assert line["route"] == "/v1/operations/{operation_id}/claim"
    assert line["method"] == "POST" and line["status"] == 201 and line["code"] is None
    assert line["tenant"] == "t-log" and line["principal"] == "exec-log" and line["operation_id"] == "op-log"
    assert line["outcome"] == "granted"
    assert isinstance(line["duration_ms"], float) and 0 < line["duration_ms"] < 10_000
    assert line["timestamp"].endswith("Z")


async def test_problem_answers_carry_their_code(
    client: httpx.AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    await client.post("/v1/operations/op-p/claim", json=CLAIM, headers=auth())
    capsys.readouterr()
    busy = await client.post("/v1/operations/op-p/claim", json=CLAIM, headers=auth())
    anonymous = await client.post("/v1/operations/op-p/claim", json=CLAIM)
    invalid = await client.post("/v1/operations/op-p/submit", json={"token": 7}, headers=auth())
    assert (busy.status_code, anonymous.status_code, invalid.status_code) == (409, 401, 422)
    lines = request_lines(capsys)
    assert [(x["status"], x["code"], x["outcome"]) for x in lines] == [
        (409, "operation_in_progress", "in_progress"),
        (401, "unauthenticated", None),
        (422, "validation_failed", None),
    ]
    assert lines[0]["tenant"] == "t1" and lines[0]["principal"] == "exec-1"
    assert lines[1]["tenant"] is None and lines[1]["principal"] is None  # no verified caller
    for response, line in zip((busy, anonymous, invalid), lines, strict=True):
        assert GENERATED_ID.match(response.headers["x-request-id"])
        assert line["request_id"] == response.headers["x-request-id"]


@pytest.mark.parametrize("given", ["has spaces in it", "x" * 129, "semi;colon", "", "ünïcode"])
async def test_unsafe_request_ids_are_replaced(
    client: httpx.AsyncClient, capsys: pytest.CaptureFixture[str], given: str
) -> None:
    capsys.readouterr()
    r = await client.get("/v1/operations/op-none", headers={**auth(), "X-Request-ID": given.encode("utf-8")})
    assert r.status_code == 404
    assert GENERATED_ID.match(r.headers["x-request-id"])
    [line] = request_lines(capsys)
    assert line["request_id"] == r.headers["x-request-id"]


async def test_a_128_character_request_id_is_kept(client: httpx.AsyncClient) -> None:
    given = "A-z0_9.:@+=/" * 10 + "abcdefgh"
    assert len(given) == 128
    r = await client.get("/livez", headers={"X-Request-ID": given})
    assert r.headers["x-request-id"] == given


async def test_unmatched_routes_and_wrong_methods_get_the_header_and_a_line(
    client: httpx.AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    missing = await client.get("/no/such/path", headers={"X-Request-ID": "r-404"})
    wrong = await client.delete("/v1/operations/op-x/claim", headers={"X-Request-ID": "r-405"})
    assert (missing.status_code, wrong.status_code) == (404, 405)
    assert missing.headers["content-type"] == "application/problem+json"
    assert (missing.headers["x-request-id"], wrong.headers["x-request-id"]) == ("r-404", "r-405")
    lines = request_lines(capsys)
    assert [(x["request_id"], x["route"], x["code"]) for x in lines] == [
        ("r-404", "unmatched", "not_found"),
        ("r-405", "unmatched", "method_not_allowed"),
    ]
    assert "/no/such/path" not in json.dumps(lines)  # the concrete path is never logged


async def test_probes_and_scrapes_log_at_debug_only(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    async with Service(settings) as quiet, quiet.client() as http:
        capsys.readouterr()
        for path in ("/livez", "/readyz", "/metrics"):
            assert (await http.get(path)).status_code == 200
        assert request_lines(capsys) == []
    async with Service(replace(settings, log_level="debug")) as chatty, chatty.client() as http:
        capsys.readouterr()
        for path in ("/livez", "/readyz", "/metrics"):
            await http.get(path)
        lines = request_lines(capsys)
    assert [(x["route"], x["level"]) for x in lines] == [
        ("/livez", "debug"),
        ("/readyz", "debug"),
        ("/metrics", "debug"),
    ]


async def test_a_callers_repeated_429s_log_at_debug_and_are_all_counted(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first 429 of a caller is an info line; the ones it sends before its Retry-After runs out are
    debug lines (http.pacing), on the fast path and on a routed call alike; the metric counts them all."""
    limits = json.dumps({"t-flood": {"per_second": 0.001, "burst": 2}})  # Retry-After ~1,000 s
    limited = replace(settings, rate_limit_overrides=limits, rate_limit_pace_ms=0)
    flooder = auth("t-flood", "exec-flood")
    for level in ("info", "debug"):
        async with Service(replace(limited, log_level=level)) as service, service.client() as http:
            capsys.readouterr()
            claims = [
                await http.post(f"/v1/operations/f-{level}-{n}/claim", json=CLAIM, headers=flooder)
                for n in range(6)
            ]
            read = await http.get(f"/v1/operations/f-{level}-0", headers=flooder)
            scraped = (await http.get("/metrics")).text
            lines = [x for x in request_lines(capsys) if x["tenant"] == "t-flood"]
        assert [c.status_code for c in claims] == [201, 201, 429, 429, 429, 429] and read.status_code == 429
        counted = sum(
            v for (name, _), v in samples(scraped).items() if name == "effect_ledger_rate_limited_total"
        )
        assert counted == 5
        expected = [(201, "info"), (201, "info"), (429, "info")]
        if level == "debug":
            expected += [(429, "debug")] * 4
        assert [(x["status"], x["level"]) for x in lines] == expected
        assert [x["route"] for x in lines][-1] == (
            "/v1/operations/{operation_id}" if level == "debug" else "/v1/operations/{operation_id}/claim"
        )


async def test_no_token_reaches_the_log(
    client: httpx.AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    bearer = token("t-sec", "exec-sec")
    headers = {"Authorization": f"Bearer {bearer}"}
    capsys.readouterr()
    r = await client.post("/v1/operations/op-sec/claim", json=CLAIM, headers=headers)
    claim_token = r.json()["claim"]["token"]
    await client.post("/v1/operations/op-sec/submit", json={"token": claim_token}, headers=headers)
    out = capsys.readouterr().out
    assert bearer not in out and claim_token not in out
    assert len(json_lines(out)) == 2


async def test_stdlib_records_are_json_too(
    client: httpx.AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    # (serve passes log_config=None, so uvicorn's own loggers propagate here as well)
    logging.getLogger("asyncpg.pool").warning("connection %s lost", 3)
    [line] = json_lines(capsys.readouterr().out)
    assert line["event"] == "connection 3 lost"
    assert line["level"] == "warning" and line["logger"] == "asyncpg.pool"
