"""The console's journal page: the projection with each unresolved call's ledger status and `resume`,
under the API's ownership rules, and nothing dispatched by reading it."""

from __future__ import annotations

import re

import httpx

from support.auth import token
from support.console import signed_in
from support.journal import WRITER, append, call, new_session, result, user
from support.ledger import committed, count_events, unknown
from support.server import Service


async def test_the_session_page_shows_resume_per_unresolved_call_to_owner_and_auditor(
    service: Service, client: httpx.AsyncClient, db_url: str
) -> None:
    await committed(client, "op-done")
    await unknown(client, "op-lost")
    sid = await new_session(client)
    records = [
        user(),
        call("c-done", operation_id="op-done"),
        call("c-lost", operation_id="op-lost"),
        call("c-free"),
        call("c-ok", operation_id="op-done"),
        result("c-ok"),
    ]
    assert (await append(client, sid, 0, records)).status_code == 200
    events = await count_events(db_url)
    for scope, sub in (("journal:read", WRITER["sub"]), ("ledger:audit", "aud-1")):
        async with service.client() as browser:
            await signed_in(browser, token("t1", sub, scope))
            page = await browser.get(f"/console/sessions/{sid}")
            assert page.status_code == 200, page.text
            rows = re.findall(r"<code>(c-[a-z]+)</code>.*?<strong>([a-z ]+)</strong>", page.text, re.S)
            assert rows == [("c-done", "use receipt"), ("c-lost", "reconcile"), ("c-free", "no operation")]
            assert "Revision 6" in page.text and 'href="/console/operations/op-lost"' in page.text
    assert await count_events(db_url) == events  # reading the page dispatched nothing


async def test_another_principals_session_is_the_not_found_page(
    service: Service, client: httpx.AsyncClient
) -> None:
    sid = await new_session(client)
    async with service.client() as browser:
        await signed_in(browser, token("t1", "orch-2", "journal:read"))
        theirs = await browser.get(f"/console/sessions/{sid}")
        missing = await browser.get("/console/sessions/ses_" + "Z" * 24)
        malformed = await browser.get("/console/sessions/nope")
    assert theirs.status_code == missing.status_code == malformed.status_code == 404
    strip = re.compile(r'name="csrf" value="[^"]+"|<time[^>]*>[^<]*</time>|\([^)]*ago\)|\(in [^)]*\)')
    assert strip.sub("", theirs.text) == strip.sub("", missing.text) == strip.sub("", malformed.text)
