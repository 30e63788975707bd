"""`serve` under granian's RSGI interface (http/rsgi.py) answers exactly as under its ASGI interface.

Two `serve` processes on one database, one per interface, get the same requests over real HTTP: the
executor calls (grants, replays, conflicts, refusals 401/403/429), bodies that are empty, not JSON, too
large, or sent without a length (chunked), non-executor routes (the receipts feed with a query string,
a console page, a redirect, a 404, a streamed static file). Statuses, every header (except the request
ID, the date and hyper's connection header) and bodies must be equal, with what differs by nature masked (claim tokens, times,
the random parts of a page); the summary log lines must name the same routes, statuses, codes and
callers.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.auth import auth
from support.serve_process import Served, kill_quietly, start_serve

pytestmark = pytest.mark.slow

MAX_BODY = 4096
CLAIM = {"tool": "t", "tool_version": "1", "intent": {"n": 1}, "lease_seconds": 60}
# Same length, so that content-length headers compare equal once the prefix is masked.
PREFIXES = {"asgi": "asgi", "rsgi": "rsgi"}
LEDGER_PREFIX = "ownh"  # serve's own server (EFFECT_LEDGER_HTTP_SERVER=ledger), against granian's ASGI
_TIME = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
_HEX = re.compile(rb"\b[0-9a-f]{32,}\b")
_TOKEN = re.compile(rb"[A-Za-z0-9_-]{24,}")  # claim tokens, CSRF values, sealed cookies
# `connection: close` is hyper's, per connection: it may close one when an answer leaves before the
# request's body was read (a refusal), depending on whether the body's bytes had arrived by then.
_UNEQUAL = {"x-request-id", "date", "connection"}

Answer = tuple[int, list[tuple[str, str]], bytes]


async def _two_servers(tmp_path: Path, db_url: str) -> tuple[Served, Served]:
    common = {
        "database_url": db_url,
        "background_sweep": "false",
        # the receipts feed's log_index says whether the integrator has reached the receipt yet: with
        # the log on, that depends on when each server's integrator ran (null in one answer, 0 in the
        # other); off, it is null in both
        "log_enabled": "false",
        "max_body_bytes": str(MAX_BODY),
        "rate_limit_overrides": json.dumps(
            {
                f"lim-{prefix}": {"per_second": 0.001, "burst": 2}
                for prefix in (*PREFIXES.values(), LEDGER_PREFIX)
            }
        ),
    }
    for interface in PREFIXES:
        (tmp_path / interface).mkdir()
    asgi, rsgi = await asyncio.gather(
        start_serve(tmp_path / "asgi", http_server="granian", granian_interface="asgi", **common),
        start_serve(tmp_path / "rsgi", http_server="granian", granian_interface="rsgi", **common),
    )
    return asgi, rsgi


async def _asgi_and_ledger(tmp_path: Path, db_url: str) -> tuple[Served, Served]:
    asgi, rsgi = await _two_servers(tmp_path, db_url)
    await kill_quietly(rsgi)
    (tmp_path / "ledger").mkdir()
    common = {
        "database_url": db_url,
        "background_sweep": "false",
        "log_enabled": "false",
        "max_body_bytes": str(MAX_BODY),
        "rate_limit_overrides": json.dumps({f"lim-{LEDGER_PREFIX}": {"per_second": 0.001, "burst": 2}}),
    }
    return asgi, await start_serve(tmp_path / "ledger", http_server="ledger", **common)


def _masked(answer: httpx.Response, prefix: str) -> Answer:
    def mask(raw: bytes) -> bytes:
        raw = raw.replace(prefix.encode(), b"<prefix>")
        raw = _TIME.sub(b"<time>", raw)
        raw = _HEX.sub(b"<hex>", raw)
        return _TOKEN.sub(b"<token>", raw)

    headers = []
    for raw_name, raw_value in answer.headers.raw:
        name, value = raw_name.decode("latin-1").lower(), mask(raw_value).decode("latin-1")
        if name == "allow":  # Litestar lists the methods from a set: in each process's hash order
            value = ", ".join(sorted(value.split(", ")))
        if name not in _UNEQUAL:
            headers.append((name, value))
    return answer.status_code, headers, mask(answer.content)


async def _chunked(body: bytes, parts: int = 3) -> AsyncIterator[bytes]:
    """A request body without Content-Length (httpx sends it chunked)."""
    step = max(1, len(body) // parts)
    for start in range(0, len(body), step):
        yield body[start : start + step]


async def _abandoned(base_url: str, path: str, headers: dict[str, str], sent: bytes) -> None:
    """A request announcing 100 bytes of body, of which `sent` arrive before the connection closes."""
    host, port = base_url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n"
    )
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    writer.write(head.encode() + b"\r\n" + sent)
    await writer.drain()
    await asyncio.sleep(0.3)  # the server is reading the body
    writer.close()
    await writer.wait_closed()
    await asyncio.sleep(0.3)  # and has noticed the client is gone: its summary line comes before the next


async def script(base_url: str, prefix: str) -> list[Answer]:
    """The same requests, in the same order, against one server (its own tenants: t-<prefix> ...)."""
    exec_ = auth(f"t-{prefix}", "exec-1", "ledger:execute")
    other = auth(f"t-{prefix}", "exec-2", "ledger:execute")
    auditor = auth(f"t-{prefix}", "audit-1", "ledger:audit")
    limited = auth(f"lim-{prefix}", "exec-1", "ledger:execute")
    answers: list[Answer] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:

        async def call(method: str, path: str, headers: dict[str, str], **kwargs: Any) -> httpx.Response:
            answer = await http.request(method, path.replace("{p}", prefix), headers=headers, **kwargs)
            answers.append(_masked(answer, prefix))
            return answer

        async def post(
            op: str, name: str, body: Any, headers: dict[str, str] | None = None, **kw: Any
        ) -> Any:
            headers = exec_ if headers is None else headers
            if body is not None:
                kw["json"] = body
            return await call("POST", f"/v1/operations/{{p}}-{op}/{name}", headers, **kw)

        nonce = {"client_nonce": "nonce-0123456789abcdef"}
        granted = (await post("a", "claim", {**CLAIM, **nonce})).json()
        token = granted["claim"]["token"]
        await post("a", "claim", {**CLAIM, **nonce})  # replayed
        await post("a", "claim", CLAIM, other)  # another binding: 422
        await post("a", "claim", {**CLAIM, "intent": {"n": 2}})  # intent conflict
        await post("a", "heartbeat", {"token": token, "lease_seconds": 30})
        await post("a", "submit", {"token": "wrong-token"})  # stale claim: 409
        await post("a", "submit", {"token": token, "effect_ref": "ref-1"})
        done = {"token": token, "outcome": "committed", "receipt": {"external_ref": "r"}}
        await post("a", "complete", done)
        await post("a", "claim", CLAIM)  # reuse_receipt
        # refusals decided before the body is read
        await post("b", "claim", CLAIM, {})  # no token: 401
        await post("b", "claim", CLAIM, {"Authorization": "Bearer not-a-jwt"})  # bad token: 401
        await post("b", "claim", CLAIM, auditor)  # scope: 403
        for n in range(3):  # burst 2, then 429 with Retry-After
            await post(f"lim-{n}", "claim", CLAIM, limited)
        # bodies: empty, not JSON, not an object, too large, chunked (plain, invalid, too large)
        raw = {**exec_, "content-type": "application/json"}
        await post("c", "claim", None, raw, content=b"")
        await post("c", "claim", None, raw, content=b"{not json")
        await post("c", "claim", None, raw, content=b"[1, 2]")
        oversized = json.dumps({**CLAIM, "intent": {"pad": "x" * MAX_BODY}}).encode()
        await post("c", "claim", None, raw, content=oversized)
        await post("d", "claim", None, raw, content=_chunked(json.dumps(CLAIM).encode()))
        await post("c", "claim", None, raw, content=_chunked(b"{not json"))
        await post("c", "claim", None, raw, content=_chunked(oversized, 8))
        await post("c", "claim", None, {**exec_, "content-type": "text/plain"}, content=json.dumps(CLAIM))
        # a client that goes away before its body is complete: 500 in the log (nobody gets the answer)
        for sent in (b"", b'{"tool": "t"'):
            await _abandoned(base_url, f"/v1/operations/{prefix}-gone/claim", exec_, sent)
        # not the executor calls: Litestar through the adapter
        await call("GET", "/v1/receipts?limit=1", auditor)
        await call("GET", "/v1/receipts?limit=zero", auditor)  # a query-string problem: 422
        await call("GET", "/v1/operations/{p}-a/events", auditor)
        await call("GET", "/console/login", {})
        await call("GET", "/console/login?token=secret", {})  # a token in the URL: 303 back to the form
        await call("GET", "/console/", {})  # no session: to the sign-in page
        await call("GET", "/v1/nothing-here", exec_)  # 404
        await call("DELETE", "/v1/operations/{p}-a/claim", exec_)  # 405
        await call("GET", "/schema/assets/swagger-ui.css", {})  # a static file: streamed in parts
        await call("HEAD", "/livez", {})  # GET only: 405, and no body
    return answers


def _summaries(log: str, prefix: str) -> list[tuple[Any, ...]]:
    """The request summary lines' fields, sorted: a line is written when the app's call returns, after
    its last byte went out, so a client that sends its next request on receiving that byte can see
    the next line written first (a streamed static file followed by a HEAD did, once): the servers must
    write the same lines, not in the same order."""
    lines = []
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("event") == "request" and entry["route"] != "/readyz":
            fields = ("method", "route", "status", "code", "outcome", "tenant", "principal", "operation_id")
            values = [entry[name] for name in fields]
            lines.append(tuple(v.replace(prefix, "<prefix>") if isinstance(v, str) else v for v in values))
    return sorted(lines, key=repr)


def _by_status(answers: Iterable[Answer]) -> list[int]:
    return [status for status, _, _ in answers]


async def test_rsgi_answers_exactly_as_asgi_over_http(tmp_path: Path, db_url: str) -> None:
    asgi, rsgi = await _two_servers(tmp_path, db_url)
    try:
        through_asgi = await script(asgi.base_url, PREFIXES["asgi"])
        through_rsgi = await script(rsgi.base_url, PREFIXES["rsgi"])
    finally:
        await asyncio.gather(kill_quietly(asgi), kill_quietly(rsgi))
    assert _by_status(through_rsgi) == [
        201, 201, 422, 422, 200, 409, 200, 200, 200,  # the executor calls
        401, 401, 403, 201, 201, 429,  # refusals
        400, 400, 400, 413, 201, 400, 413, 201,  # bodies
        200, 422, 200, 200, 303, 303, 404, 405, 200, 405,  # the rest
    ]  # fmt: skip
    for n, (a, r) in enumerate(zip(through_asgi, through_rsgi, strict=True)):
        assert a == r, f"request {n}"
    assert through_rsgi[-2][2][:11] == b".swagger-ui"  # the whole file, not a part of it
    summaries = _summaries(rsgi.log(), "rsgi")
    assert summaries == _summaries(asgi.log(), "asgi")
    assert len(summaries) == len(through_rsgi) + 2  # the abandoned requests have a line, not an answer
    abandoned = ("POST", "/v1/operations/{operation_id}/claim", 500, "internal", None, "t-<prefix>")
    assert [line[:6] for line in summaries if line[2] == 500] == [abandoned, abandoned]


@pytest.mark.parametrize("interface", ["asgi", "rsgi"])
async def test_an_oversized_chunked_body_gets_its_413_on_every_route_under_granian(
    interface: str, tmp_path: Path, db_url: str
) -> None:
    """granian closes a connection whose body the app did not read to its end, and the kernel's reset
    can destroy the answer (httpx: ReadError). The app drains it instead (http.linger), as serve's own
    server lingers: an executor call (the fast path) and a Litestar route (POST /v1/sessions) each get
    their 413, five times over fresh connections. Round 20 first drained the executor calls only."""
    served = await start_serve(
        tmp_path,
        http_server="granian",
        granian_interface=interface,
        database_url=db_url,
        background_sweep="false",
        log_enabled="false",
        max_body_bytes=str(MAX_BODY),
    )
    pad = "x" * MAX_BODY
    cases = [
        ("/v1/operations/big/claim", {**CLAIM, "intent": {"pad": pad}}),
        ("/v1/sessions", {"labels": {"pad": pad}}),
    ]
    headers = {**auth("t-big", "w-1", "ledger:execute journal:write"), "content-type": "application/json"}
    statuses = []
    try:
        for path, body in cases:
            for _ in range(5):
                async with httpx.AsyncClient(base_url=served.base_url, timeout=30) as http:
                    answer = await http.post(
                        path, headers=headers, content=_chunked(json.dumps(body).encode(), 8)
                    )
                    statuses.append((path, answer.status_code, answer.json()["code"]))
    finally:
        await kill_quietly(served)
    assert statuses == [(path, 413, "payload_too_large") for path, _ in cases for _ in range(5)]


async def test_the_ledger_server_answers_exactly_as_granian_asgi_over_http(
    tmp_path: Path, db_url: str
) -> None:
    asgi, ledger = await _asgi_and_ledger(tmp_path, db_url)
    try:
        through_asgi = await script(asgi.base_url, PREFIXES["asgi"])
        through_ledger = await script(ledger.base_url, LEDGER_PREFIX)
    finally:
        await asyncio.gather(kill_quietly(asgi), kill_quietly(ledger))
    assert len(through_ledger) == len(through_asgi) == 33
    for n, ((status, headers, body), r) in enumerate(zip(through_asgi, through_ledger, strict=True)):
        # granian adds "server: granian" and writes content-length last (hyper's order); the rest is equal
        named = sorted((name, value) for name, value in headers if name != "server")
        assert (status, named, body) == (r[0], sorted(r[1]), r[2]), f"request {n}"
    summaries = _summaries(ledger.log(), LEDGER_PREFIX)
    # the abandoned requests (a length of 100, fewer bytes, then gone) never reach the app under the
    # ledger server, which reads a body within the limit whole before calling it: no line, no incident
    abandoned = ("POST", "/v1/operations/{operation_id}/claim", 500, "internal", None, "t-<prefix>")
    assert [line for line in _summaries(asgi.log(), "asgi") if line[:6] != abandoned] == summaries
    assert len(summaries) == len(through_ledger)
