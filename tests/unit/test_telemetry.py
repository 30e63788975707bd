"""RequestTelemetry without a database: request IDs, the last-resort 500, and the ledger observer's counts."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from effect_ledger.domain.model import EventDraft
from effect_ledger.http.metrics import Metrics
from effect_ledger.http.telemetry import RequestTelemetry, request_id_from


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        (b"abc-123", True),
        (b"A" * 128, True),
        (b"A" * 129, False),
        (b"a b", False),
        (b"x\x00y", False),
        (b"caf\xc3\xa9", False),
        (b"", False),
        (b"trace:01/span=2+3@host_4.5", True),
    ],
)
def test_request_ids_are_kept_only_when_short_and_plain(given: bytes, kept: bool) -> None:
    found = request_id_from([(b"content-type", b"text/plain"), (b"X-Request-ID", given)])
    assert (found == given.decode("latin-1")) is kept
    assert len(found) <= 128


def test_a_missing_request_id_is_generated_fresh_each_time() -> None:
    assert request_id_from([]) != request_id_from([])


async def failing_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    raise RuntimeError("exception handlers failed too")


async def test_an_exception_that_escapes_still_gets_a_problem_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from effect_ledger.logs import configure_logging

    configure_logging("info")
    metrics = Metrics()
    app = RequestTelemetry(failing_app, metrics)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        capsys.readouterr()
        r = await http.get("/anything", headers={"X-Request-ID": "r-500"})
    assert r.status_code == 500
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["x-request-id"] == "r-500"
    assert r.json()["code"] == "internal"
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["event"], x["request_id"]) for x in lines] == [
        ("unhandled_exception", "r-500"),
        ("request", "r-500"),
    ]
    assert lines[0]["exception_type"] == "RuntimeError" and "failed too" not in json.dumps(lines)
    assert (lines[1]["status"], lines[1]["code"], lines[1]["route"]) == (500, "internal", "unmatched")


def test_sweeps_and_events_are_counted_once_by_kind() -> None:
    metrics = Metrics()
    expired = EventDraft("lease_expired", "effect-ledger", "submitted", "unknown", 1, {})
    metrics.observe("sweep", "unknown", [expired])
    metrics.observe("sweep", "unknown", [expired])
    metrics.observe("heartbeat", "pending", [])
    metrics.observe("claim", "no-such-verdict", [])  # unknown verdicts make no new series
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }
    assert values[("effect_ledger_lease_expiries_total", (("via", "sweep"),))] == 2
    assert values[("effect_ledger_unknown_outcomes_recorded_total", (("cause", "lease_expired"),))] == 2
    edge = (("from_status", "submitted"), ("to_status", "unknown"))
    assert values[("effect_ledger_transitions_total", edge)] == 2
    assert not any(name == "effect_ledger_refusals_total" for name, _ in values)
    assert not any(dict(labels).get("result") == "no-such-verdict" for _, labels in values)


async def test_context_bound_by_other_code_still_reaches_the_summary_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The summary line reads its own two variables directly only while structlog has no others; a
    variable bound by anything else (here inside the request) is on the line as before."""
    import structlog

    from effect_ledger.logs import configure_logging

    configure_logging("info")
    tokens: list[Any] = []

    async def binding_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        tokens.append(structlog.contextvars.bind_contextvars(job_kind="sweep-7"))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app = RequestTelemetry(binding_app, Metrics())  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            capsys.readouterr()
            r = await http.get("/anything", headers={"X-Request-ID": "r-ctx"})
    finally:
        for bound in tokens:
            structlog.contextvars.reset_contextvars(**bound)
    assert r.status_code == 204
    (line,) = [json.loads(text) for text in capsys.readouterr().out.splitlines()]
    assert (line["event"], line["request_id"], line["job_kind"], line["outcome"]) == (
        "request",
        "r-ctx",
        "sweep-7",
        None,
    )
