"""The executor calls served before routing (http/fastpath.py) answer exactly as the routed handlers do,
decide 401/403/429 before reading the body, and charge the rate limit once per request.

The comparison runs one script of executor calls twice on one database: through the app as built
(fast path on) and through the same app with the fast path unwrapped (every call routed by Litestar),
and compares statuses, header names and bodies with the values that differ by nature (claim tokens,
timestamps, request IDs) masked.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from typing import Any

import httpx
from opentelemetry.sdk.trace import TracerProvider

from effect_ledger import tracing
from effect_ledger.http.fastpath import ExecutorFastPath, direct_entry
from effect_ledger.http.server import Connection, Worker
from effect_ledger.settings import Settings
from support.auth import auth, token
from support.server import Service
from support.transport import Transport

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


class Signalling(Transport):
    """A recording transport that signals each write."""

    def __init__(self) -> None:
        super().__init__()
        self.wrote = asyncio.Event()

    def write(self, data: bytes) -> None:
        super().write(data)
        self.wrote.set()


class Counting:
    """The ASGI app, with the HTTP requests that reach it counted."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.paths: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.paths.append(scope["path"])
        await self.app(scope, receive, send)


Request = tuple[str, str, bytes, dict[str, str]]  # operation, call, body (with <token>), headers


async def through_own_server(
    service: Service, requests: list[Request], direct: bool, prefix: str
) -> tuple[list[Any], list[str]]:
    """Raw requests through serve's own server (http.server) on a recording transport, with the app's
    direct entry (as `serve` runs it) or without: the answers (status line, headers but the date and
    the request ID, body masked) and the paths that reached the ASGI app."""
    counting = Counting(service.app)
    entry = direct_entry(service.app) if direct else None
    assert direct is (entry is not None)  # the app as http.app builds it has one
    worker = Worker(
        counting, {}, max_body_bytes=service.settings.max_body_bytes, keep_alive_seconds=5,
        request_timeout_seconds=5, direct=entry,
    )  # fmt: skip
    connection = Connection(worker)
    transport = Signalling()
    connection.connection_made(transport)  # type: ignore[arg-type]
    answers: list[Any] = []
    claim_token = ""
    for op, call, body, headers in requests:
        transport.wrote.clear()
        path = f"/v1/operations/{prefix}-{op}/{call}"
        connection.data_received(_post(path, body.replace(b"<token>", claim_token.encode()), headers))
        async with asyncio.timeout(30):
            await transport.wrote.wait()
        head, _, answer = transport.written[-1].partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        named = [line.replace(prefix.encode(), b"<prefix>") for line in lines[1:]]
        kept = [line for line in named if not line.startswith((b"date: ", b"x-request-id: "))]
        content = json.loads(answer)
        if isinstance(content, dict) and isinstance(content.get("claim"), dict):
            claim_token = content["claim"]["token"]
        answers.append((lines[0], kept, _masked(content, claim_token or "<none>", prefix)))
    return answers, counting.paths


def _post(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (
        f"POST {path} HTTP/1.1\r\nhost: x\r\n{head}"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


async def test_serves_own_server_hands_executor_calls_over_directly_with_the_same_answers(
    settings: Settings,
) -> None:
    """`serve`'s own server gives the executor calls to the app's direct entry (no ASGI messages): the
    answers are the ASGI path's to the byte (but the date, the request ID, tokens and times), and only
    a body that does not decode into its struct enters the app through its ASGI entry (where the fast
    path admits the caller and hands it to Litestar, as under any server)."""
    claim = json.dumps(CLAIM).encode()
    replayable = json.dumps({**CLAIM, "client_nonce": "nonce-0123456789abcdef"}).encode()
    done = b'{"token": "<token>", "outcome": "committed", "receipt": {"external_ref": "x"}}'
    requests: list[Request] = [
        ("a", "claim", replayable, EXEC),
        ("a", "claim", replayable, EXEC),  # replayed
        ("a", "submit", b'{"token": "<token>", "effect_ref": "r-1"}', EXEC),
        ("a", "complete", done, EXEC),
        ("a", "claim", claim, EXEC),  # reuse_receipt
        ("b", "claim", b'{"tool": "t"}', EXEC),  # does not decode: Litestar's 422
        ("b", "claim", claim, READER),  # 403
        ("b", "claim", claim, {}),  # 401
    ]
    async with Service(settings) as service:
        direct, direct_paths = await through_own_server(service, requests, True, "own-dir")
    async with Service(settings) as service:
        asgi, asgi_paths = await through_own_server(service, requests, False, "own-asg")
    assert [status for status, _, _ in direct] == [
        b"HTTP/1.1 201 Created", b"HTTP/1.1 201 Created", b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK", b"HTTP/1.1 422 Unprocessable Entity", b"HTTP/1.1 403 Forbidden",
        b"HTTP/1.1 401 Unauthorized",
    ]  # fmt: skip
    assert direct == asgi
    assert direct_paths == ["/v1/operations/own-dir-b/claim"]
    assert asgi_paths == [f"/v1/operations/own-asg-{op}/{call}" for op, call, _, _ in requests]


async def test_while_tracing_the_own_servers_executor_calls_take_the_asgi_path(settings: Settings) -> None:
    """The server span is the ASGI path's (http.telemetry): with tracing on, the direct entry declines
    and the request enters the app through its ASGI entry."""
    provider = TracerProvider()
    tracing.use_provider(provider)
    try:
        async with Service(settings) as service:
            answers, paths = await through_own_server(
                service, [("a", "claim", json.dumps(CLAIM).encode(), EXEC)], True, "own-trc"
            )
    finally:
        tracing.use_provider(None)
        provider.shutdown()
    assert [status for status, _, _ in answers] == [b"HTTP/1.1 201 Created"]
    assert paths == ["/v1/operations/own-trc-a/claim"]
