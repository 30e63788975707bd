"""The console over plain HTTP (docs/api.md section 13): sign-in, cookie flags, headers, CSRF, scopes,
tenants, error pages, and that no token ever shows up in a page, a URL or a log line."""

from __future__ import annotations

import json
import re
import time
from http.cookies import SimpleCookie

import httpx
import pytest

from effect_ledger.http.auth import mint_token
from effect_ledger.http.console.session import SESSION_COOKIE, Sealer, session_key
from effect_ledger.settings import Settings
from support.auth import TEST_SECRET, token
from support.console import COMMITTED_FORM, csrf_of, resolve_form, sign_in, signed_in
from support.ledger import committed, events_of, pending, stored_status, unknown
from support.server import Service

RECONCILER = "ledger:reconcile ledger:audit diagnostics:read"
PAGES = [
    "/console/",
    "/console/unknown",
    "/console/operations",
    "/console/operations/op-1",
    "/console/receipts",
    "/console/access-log",
    "/console/incidents",
    "/console/sessions/ses_x",
    "/console/logout",
]


def set_cookie(response: httpx.Response, name: str) -> dict[str, str]:
    """The attributes of one Set-Cookie header, names lower-cased; flags map to ''."""
    for header in response.headers.get_list("set-cookie"):
        if header.startswith(name + "="):
            parts = [p.strip() for p in header.split(";")]
            attrs = {"value": parts[0].split("=", 1)[1]}
            for part in parts[1:]:
                key, _, value = part.partition("=")
                attrs[key.lower()] = value
            return attrs
    raise AssertionError(f"no Set-Cookie for {name}: {response.headers.get_list('set-cookie')}")


def assert_console_headers(response: httpx.Response) -> None:
    csp = response.headers["content-security-policy"]
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "form-action 'self'" in csp
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"


async def test_signed_out_requests_of_every_page_go_to_the_login_page(client: httpx.AsyncClient) -> None:
    for path in PAGES:
        r = await client.get(path)
        assert r.status_code == 303, path
        assert r.headers["location"].startswith("/console/login?next=/console"), path
        assert_console_headers(r)
    login = await client.get("/console/login?next=/console/unknown")
    assert login.status_code == 200 and login.headers["content-type"].startswith("text/html")
    assert 'value="/console/unknown"' in login.text
    assert_console_headers(login)


async def test_sign_in_sets_a_sealed_httponly_strict_cookie_ending_with_the_token(
    client: httpx.AsyncClient,
) -> None:
    bearer = token(sub="rec-1", scope=RECONCILER, ttl=900)
    r = await sign_in(client, bearer, "/console/unknown")
    assert r.status_code == 303 and r.headers["location"] == "/console/unknown"
    cookie = set_cookie(r, SESSION_COOKIE)
    assert "httponly" in cookie and cookie["samesite"].lower() == "strict" and cookie["path"] == "/console"
    assert "secure" not in cookie  # served on loopback over plain HTTP
    assert 0 < int(cookie["max-age"]) <= 900
    for secret in (bearer, *bearer.split(".")):
        assert secret not in cookie["value"]  # sealed, not the JWT in clear
    page = await client.get("/console/unknown")
    assert page.status_code == 200 and "Unknown queue" in page.text
    assert_console_headers(page)
    assert page.headers["cache-control"] == "no-store"


async def test_the_cookie_is_secure_when_not_served_on_loopback(service: Service) -> None:
    async with service.client(headers={"Host": "ledger.example.com"}) as http:
        form = await http.get("/console/login")
        login_cookie = set_cookie(form, "effect_ledger_console_login")
        assert "secure" in login_cookie
        # A client keeps a Secure cookie away from plain HTTP: hand it over as a browser behind TLS would.
        r = await http.post(
            "/console/login",
            data={"token": token(), "csrf": csrf_of(form.text)},
            headers={"Cookie": f"effect_ledger_console_login={login_cookie['value']}"},
        )
        assert r.status_code == 303
        assert "secure" in set_cookie(r, SESSION_COOKIE)


async def test_bad_tokens_and_forged_login_forms_are_refused_without_echo(client: httpx.AsyncClient) -> None:
    bad = token() + "x"
    r = await sign_in(client, bad)
    assert r.status_code == 401 and "not valid for this service" in r.text
    assert bad not in r.text and SESSION_COOKIE + "=" not in r.headers.get("set-cookie", "")
    expired = mint_token(TEST_SECRET, "t1", "rec-1", RECONCILER, Settings(), 60, now=int(time.time()) - 600)
    r = await sign_in(client, expired)
    assert r.status_code == 401 and "expired" in r.text
    forged = await client.post("/console/login", data={"token": token(), "csrf": "forged"})
    assert forged.status_code == 403 and SESSION_COOKIE not in forged.headers.get("set-cookie", "")
    # A token put in a URL is never used, and leaves the address bar.
    r = await client.get("/console/login", params={"token": token()})
    assert r.status_code == 303 and r.headers["location"] == "/console/login"


async def test_sign_in_goes_on_only_to_a_console_path(client: httpx.AsyncClient) -> None:
    """`next` is only ever a /console/ path: another origin, a protocol-relative URL and a dot segment
    that leaves the console (`/console/../v1/x`, which the browser resolves to /v1/x: until round 36 it
    was followed) all go to the overview instead."""
    bearer = token(scope="ledger:reconcile", sub="rec-1")
    for asked, went in (
        ("/console/unknown", "/console/unknown"),
        ("/console/../v1/operations", "/console/"),
        ("/console/./unknown", "/console/"),
        ("//evil.example/console/", "/console/"),
        ("https://evil.example/console/", "/console/"),
        ("/console//evil.example", "/console/"),
    ):
        answer = await sign_in(client, bearer, asked)
        assert (answer.status_code, answer.headers["location"]) == (303, went), asked


async def test_a_session_whose_token_expired_goes_back_to_sign_in(service: Service) -> None:
    expired = mint_token(TEST_SECRET, "t1", "rec-1", RECONCILER, Settings(), 60, now=int(time.time()) - 600)
    value = Sealer(session_key(None, TEST_SECRET)).seal(
        {"t": expired, "c": "x" * 43}, b"effect-ledger console session v1"
    )
    async with service.client(cookies={SESSION_COOKIE: value}) as http:
        r = await http.get("/console/unknown")
        assert r.status_code == 303 and r.headers["location"].startswith("/console/login")
    async with service.client(cookies={SESSION_COOKIE: "garbage" + value[7:]}) as http:
        assert (await http.get("/console/")).status_code == 303


async def test_resolve_from_the_console_grows_the_timeline(client: httpx.AsyncClient, db_url: str) -> None:
    await unknown(client, "op-1")
    before = len(await events_of(db_url, "op-1"))
    await signed_in(client, token(sub="rec-1", scope=RECONCILER))
    r = await resolve_form(client, "op-1", COMMITTED_FORM)
    assert r.status_code == 303 and r.headers["location"] == "/console/operations/op-1?resolved=recorded"
    events = await events_of(db_url, "op-1")
    assert len(events) == before + 1
    last = events[-1]
    assert (last["kind"], last["actor"], last["to_status"]) == ("resolved", "rec-1", "committed")
    assert last["data"]["evidence"] == {
        "source": "payment provider dashboard",
        "lookup_ref": "psp-req-7781",
        "checked_at": "2026-11-30T10:00:00.000Z",
    }
    page = await client.get(r.headers["location"])
    assert "Your resolution was recorded." in page.text and "ch_3PQ8" in page.text
    assert page.text.count('class="event"') == before + 1 and last["hash"] in page.text
    assert "Intact" in page.text
    # The API shows the same operation the console wrote.
    view = (await client.get("/v1/operations/op-1", headers={"Authorization": f"Bearer {token()}"})).json()
    assert view["status"] == "committed" and view["resolved_by"] == "rec-1"
    assert view["receipt"]["external_ref"] == "ch_3PQ8" and view["receipt"]["result"] == {"amount": 1200}


async def test_resolve_answers_are_the_apis_in_words(client: httpx.AsyncClient, db_url: str) -> None:
    await unknown(client, "op-1")
    await signed_in(client, token(sub="rec-1", scope=RECONCILER))
    r = await resolve_form(
        client, "op-1", {**COMMITTED_FORM, "receipt_external_ref": "", "receipt_result": ""}
    )
    assert r.status_code == 422 and "a committed outcome needs a receipt" in r.text
    assert "Receipt" in r.text and "payment provider dashboard" in r.text  # the form keeps what was typed
    r = await resolve_form(client, "op-1", {**COMMITTED_FORM, "evidence_source": ""})
    assert r.status_code == 422 and "Evidence: source" in r.text
    assert await stored_status(db_url, "op-1") == "unknown"
    assert (await resolve_form(client, "op-1", COMMITTED_FORM)).status_code == 303
    refused = await resolve_form(
        client,
        "op-1",
        {
            "outcome": "not_applied",
            "reason_category": "rejected",
            "evidence_source": "support ticket",
            "evidence_checked_at": "2026-11-30T11:00:00Z",
        },
    )
    assert refused.status_code == 409 and "conflicting_outcome" in refused.text
    assert "already committed with a different outcome" in refused.text
    assert (await events_of(db_url, "op-1"))[-1]["kind"] == "discrepancy"
    await pending(client, "op-3")
    live = await resolve_form(client, "op-3", COMMITTED_FORM)
    assert live.status_code == 409 and "invalid_transition" in live.text
    assert "Only an unknown operation can be resolved; this one is pending" in live.text
    await committed(client, "op-2")
    early = await resolve_form(client, "op-2", COMMITTED_FORM)
    assert (
        early.status_code == 409
    )  # the same outcome and receipt again would be 200 in the API; this one differs


async def test_resolve_needs_ledger_reconcile_and_a_matching_csrf_token(
    client: httpx.AsyncClient, db_url: str
) -> None:
    await unknown(client, "op-1")
    before = len(await events_of(db_url, "op-1"))
    await signed_in(client, token(sub="aud-1", scope="ledger:audit"))
    page = await client.get("/console/operations/op-1")
    assert page.status_code == 200 and 'action="/console/operations/op-1/resolve"' not in page.text
    refused = await client.post(
        "/console/operations/op-1/resolve", data={"csrf": csrf_of(page.text), **COMMITTED_FORM}
    )
    assert refused.status_code == 403 and "ledger:reconcile" in refused.text
    await signed_in(client, token(sub="rec-1", scope=RECONCILER))
    forged = await resolve_form(client, "op-1", COMMITTED_FORM, csrf="forged-" + "x" * 40)
    assert forged.status_code == 403 and "This form has expired" in forged.text
    missing = await client.post("/console/operations/op-1/resolve", data=COMMITTED_FORM)
    assert missing.status_code == 403
    assert len(await events_of(db_url, "op-1")) == before and await stored_status(db_url, "op-1") == "unknown"


async def test_another_tenants_operation_is_the_same_404_page_as_a_missing_one(
    client: httpx.AsyncClient,
) -> None:
    await unknown(client, "op-1")
    await signed_in(client, token(tenant="t2", sub="rec-9", scope=RECONCILER))
    theirs, missing = (
        await client.get("/console/operations/op-1"),
        await client.get("/console/operations/op-404"),
    )
    assert theirs.status_code == missing.status_code == 404
    assert theirs.headers["content-type"].startswith("text/html")
    strip = re.compile(r'name="csrf" value="[^"]+"|<time[^>]*>[^<]*</time>|\([^)]*ago\)|\(in [^)]*\)')
    assert strip.sub("", theirs.text) == strip.sub("", missing.text)
    queue = await client.get("/console/unknown")
    assert "op-1" not in queue.text and "Nothing to reconcile" in queue.text
    resolve = await resolve_form(client, "op-404", COMMITTED_FORM, csrf=csrf_of(queue.text))
    assert resolve.status_code == 404


async def test_error_pages_are_console_pages_never_problem_json(client: httpx.AsyncClient) -> None:
    await signed_in(client, token(sub="rec-1", scope=RECONCILER))
    for path, status in (
        ("/console/no-such-page", 404),
        ("/console/operations?updated_before=yesterday", 422),
        ("/console/unknown?cursor=bogus", 422),
        ("/console/incidents/inc_missing", 404),
    ):
        r = await client.get(path)
        assert r.status_code == status, path
        assert r.headers["content-type"].startswith("text/html"), path
        assert "urn:effect-ledger:problem" not in r.text and "Traceback" not in r.text
        assert_console_headers(r)
    r = await client.put("/console/unknown")
    assert r.status_code == 405 and r.headers["content-type"].startswith("text/html")
    api = await client.get("/v1/no-such-route")  # the API keeps its problem+json
    assert api.status_code == 404 and api.headers["content-type"].startswith("application/problem+json")
    assert "content-security-policy" not in api.headers


async def test_pages_follow_the_tokens_scopes(client: httpx.AsyncClient) -> None:
    await unknown(client, "op-1")
    await signed_in(client, token(sub="exec-1", scope="ledger:execute"))
    overview = await client.get("/console/")
    assert (
        "Nothing to show with this token" in overview.text and 'href="/console/unknown"' not in overview.text
    )
    assert (await client.get("/console/unknown")).status_code == 403
    assert (await client.get("/console/receipts")).status_code == 403
    own = await client.get("/console/operations/op-1")  # bound to exec-1: its own operation
    assert (
        own.status_code == 200
        and "needs <code>ledger:reconcile</code> or <code>ledger:audit</code>" in own.text
    )
    await signed_in(client, token(sub="exec-2", scope="ledger:execute"))
    assert (await client.get("/console/operations/op-1")).status_code == 404


async def test_incident_asks_for_a_purpose_and_the_read_is_recorded(client: httpx.AsyncClient) -> None:
    headers = {"Authorization": f"Bearer {token()}"}
    reported = await client.post(
        "/v1/diagnostics", json={"phase": "stream", "cause": "timeout"}, headers=headers
    )
    incident = reported.json()["incident"]
    await signed_in(client, token(sub="oncall-1", scope="diagnostics:read ledger:audit"))
    prompt = await client.get(f"/console/incidents/{incident}")
    assert (
        prompt.status_code == 200
        and "Why do you need to read it?" in prompt.text
        and "timeout" not in prompt.text
    )
    log = await client.get("/v1/diagnostics/access-log", headers=headers)
    assert log.json()["items"] == []  # asking for the purpose read nothing
    short = await client.post(
        f"/console/incidents/{incident}", data={"csrf": csrf_of(prompt.text), "purpose": "x"}
    )
    assert short.status_code == 422 and "Purpose" in short.text
    read = await client.post(
        f"/console/incidents/{incident}",
        data={"csrf": csrf_of(prompt.text), "purpose": "on-call ticket OPS-1"},
    )
    assert read.status_code == 200 and "timeout" in read.text and "recorded in the access log" in read.text
    rows = (await client.get("/v1/diagnostics/access-log", headers=headers)).json()["items"]
    assert [(r["incident"], r["principal"], r["purpose"]) for r in rows] == [
        (incident, "oncall-1", "on-call ticket OPS-1")
    ]
    page = await client.get("/console/access-log")
    assert "on-call ticket OPS-1" in page.text and incident in page.text
    forged = await client.post(
        f"/console/incidents/{incident}", data={"csrf": "nope", "purpose": "again please"}
    )
    assert forged.status_code == 403
    assert len((await client.get("/v1/diagnostics/access-log", headers=headers)).json()["items"]) == 1


async def test_sign_out_needs_the_csrf_token_and_ends_the_session(client: httpx.AsyncClient) -> None:
    await signed_in(client, token(sub="rec-1", scope=RECONCILER))
    page = await client.get("/console/logout")
    assert (await client.post("/console/logout", data={"csrf": "forged"})).status_code == 403
    assert (await client.get("/console/")).status_code == 200
    out = await client.post("/console/logout", data={"csrf": csrf_of(page.text)})
    assert out.status_code == 303 and out.headers["location"] == "/console/login?signed_out=1"
    assert set_cookie(out, SESSION_COOKIE)["max-age"] == "0"
    assert (await client.get("/console/")).status_code == 303


async def test_static_assets_are_served_from_the_package(client: httpx.AsyncClient) -> None:
    css, js = await client.get("/console/static/console.css"), await client.get("/console/static/console.js")
    assert css.status_code == js.status_code == 200
    assert css.headers["content-type"].startswith("text/css") and "javascript" in js.headers["content-type"]
    assert_console_headers(css)


async def test_no_token_in_any_page_url_or_log_line(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    bearer = token(sub="rec-1", scope=RECONCILER)
    capsys.readouterr()
    async with Service(settings) as service, service.client() as http:
        await unknown(http, "op-1")
        answer = await sign_in(http, bearer)
        visited = [answer]
        for path in PAGES[:-1]:
            visited.append(await http.get(path))
        visited.append(await resolve_form(http, "op-1", COMMITTED_FORM))
        visited.append(await http.get("/console/operations/op-1?resolved=recorded"))
        await sign_in(http, bearer + "x")  # a refused token is not logged either
    out = capsys.readouterr()
    text = out.out + out.err
    records = [json.loads(line) for line in out.out.splitlines() if line.strip()]
    assert any(r.get("route", "").startswith("/console/operations/") for r in records)
    assert any(r.get("principal") == "rec-1" for r in records)  # the summary line names who, not how
    for secret in (bearer, *bearer.split(".")):
        assert secret not in text
        for r in visited:
            assert (
                secret not in r.text
                and secret not in str(r.url)
                and secret not in r.headers.get("location", "")
            )
    for r in visited:
        for value in SimpleCookie(r.headers.get("set-cookie", "")).values():
            assert bearer not in value.value


async def test_a_failure_is_a_console_page_with_an_incident_reference(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret detail that must not reach the page")

    await signed_in(client, token(sub="aud-1", scope="ledger:audit"))
    monkeypatch.setattr("effect_ledger.http.console.pages.reads.list_access_log", broken)
    r = await client.get("/console/access-log")
    assert r.status_code == 500 and r.headers["content-type"].startswith("text/html")
    assert "Something went wrong" in r.text and re.search(r"<code>inc_[A-Za-z0-9_-]{16,64}</code>", r.text)
    assert "secret detail" not in r.text and "Traceback" not in r.text and "RuntimeError" not in r.text
    assert_console_headers(r)


async def test_what_callers_wrote_is_escaped_not_run(client: httpx.AsyncClient) -> None:
    script = "<script>alert(1)</script>"
    await unknown(client, "op-1", tool=script)
    await signed_in(client, token(sub="rec-1", scope=RECONCILER))
    queue = await client.get("/console/unknown")
    r = await resolve_form(
        client, "op-1", {**COMMITTED_FORM, "receipt_external_ref": script, "evidence_source": script}
    )
    page = await client.get(r.headers["location"])
    for body in (queue.text, page.text):
        assert script not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
