"""Logs never leak: everything a full lifecycle makes the service log holds no bearer or claim token."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
import structlog

from effect_ledger.logs import configure_logging
from effect_ledger.settings import Settings
from support.auth import token
from support.server import Service

CLAIM = {"tool": "measure", "tool_version": "2.1.0", "intent": {"sensor": "s-1"}, "client_nonce": "n" * 24}


@pytest.fixture
def debug_logging() -> Iterator[None]:
    """The service's own logging pipeline at debug level, restored afterwards."""
    root = logging.getLogger()
    level, handlers, config = root.level, list(root.handlers), structlog.get_config()
    configure_logging("debug")
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.configure(**config)


async def lifecycle(http: httpx.AsyncClient, bearer: str) -> list[str]:
    """Claim, replay, submit, heartbeat, a stale and a malformed call, complete; the claim tokens seen."""
    headers = {"Authorization": f"Bearer {bearer}", "X-Request-ID": "lifecycle-1"}
    seen: list[str] = []
    for op in ("op-a", "op-b"):
        r = await http.post(f"/v1/operations/{op}/claim", json=CLAIM, headers=headers)
        assert r.status_code == 201
        seen.append(r.json()["claim"]["token"])
    replay = await http.post("/v1/operations/op-a/claim", json=CLAIM, headers=headers)
    assert replay.status_code == 201 and replay.json()["claim"]["token"] == seen[0]
    for op, tok in zip(("op-a", "op-b"), seen, strict=True):
        sent = await http.post(f"/v1/operations/{op}/submit", json={"token": tok}, headers=headers)
        assert sent.status_code == 200
        beat = await http.post(
            f"/v1/operations/{op}/heartbeat", json={"token": tok, "lease_seconds": 60}, headers=headers
        )
        assert beat.status_code == 200
    # Refusals whose bodies carry a token: a stale one, and one beside an unknown field.
    stale = await http.post("/v1/operations/op-a/submit", json={"token": seen[1]}, headers=headers)
    assert stale.status_code == 409
    odd = await http.post(
        "/v1/operations/op-a/complete", json={"token": seen[0], "outcome": "x"}, headers=headers
    )
    assert odd.status_code == 422
    done = await http.post(
        "/v1/operations/op-a/complete",
        headers=headers,
        json={"token": seen[0], "outcome": "committed", "receipt": {"external_ref": "r-1"}},
    )
    assert done.status_code == 200
    unknown = await http.post(
        "/v1/operations/op-b/complete",
        headers=headers,
        json={"token": seen[1], "outcome": "unknown", "diagnostics": {"phase": "stream", "cause": "aborted"}},
    )
    assert unknown.status_code == 200 and unknown.json()["incident"].startswith("inc_")
    assert (await http.get("/v1/operations/op-a", headers=headers)).status_code == 200
    # A wrong token in the header is logged about too (401), and must not appear either.
    wrong = await http.get("/v1/operations/op-a", headers={"Authorization": f"Bearer {bearer}x"})
    assert wrong.status_code == 401
    return seen


async def test_a_full_lifecycle_logs_no_token(
    settings: Settings, debug_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    bearer = token()
    capsys.readouterr()
    async with Service(replace(settings, log_level="debug")) as service, service.client() as http:
        claim_tokens = await lifecycle(http, bearer)
        # The pipeline is the one under test: a line that names secrets outright is redacted too.
        structlog.get_logger("probe").info(
            "probe",
            authorization=f"Bearer {bearer}",
            claim_token=claim_tokens[0],
            note=f"sent {claim_tokens[1]}",
        )
        logging.getLogger("probe.stdlib").warning("header was Bearer %s", bearer)
    captured = capsys.readouterr()
    out = captured.out + captured.err
    lines = [line for line in captured.out.splitlines() if line.strip()]
    assert len(lines) >= 10  # the lifecycle did log: this is not a test of silence
    records = [json.loads(line) for line in lines]  # every line is JSON
    probe = next(r for r in records if r.get("event") == "probe")
    assert probe["authorization"] == probe["claim_token"] == "[redacted]"
    stdlib = next(r for r in records if r.get("logger") == "probe.stdlib")
    assert stdlib["event"] == "[redacted]"  # a credential-shaped message is masked whole
    bodies = [t.removeprefix("clt_") for t in claim_tokens]
    for secret in (bearer, *bearer.split("."), *claim_tokens, *bodies):
        assert secret not in out
    assert "clt_" not in out
