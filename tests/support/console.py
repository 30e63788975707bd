"""Helpers for console tests over plain HTTP: sign in like a browser, read the CSRF token of a page."""

from __future__ import annotations

import re

import httpx

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    """The CSRF token the page's forms carry."""
    match = CSRF.search(html)
    assert match, "the page has a form with a CSRF token"
    return match.group(1)


async def sign_in(http: httpx.AsyncClient, bearer: str, next_path: str = "") -> httpx.Response:
    """GET the sign-in form (its CSRF cookie), then POST the token; returns the POST's answer."""
    http.cookies.clear()  # a fresh browser: a signed-in one is sent on from the sign-in page
    form = await http.get("/console/login", params={"next": next_path} if next_path else None)
    assert form.status_code == 200, form.text
    return await http.post(
        "/console/login", data={"token": bearer, "csrf": csrf_of(form.text), "next": next_path}
    )


async def signed_in(http: httpx.AsyncClient, bearer: str) -> None:
    """Sign in and insist it worked."""
    answer = await sign_in(http, bearer)
    assert answer.status_code == 303 and answer.headers["location"] == "/console/", answer.text


async def resolve_form(
    http: httpx.AsyncClient, op: str, fields: dict[str, str], csrf: str | None = None
) -> httpx.Response:
    """POST the resolve form of an operation page (with that page's CSRF token unless one is given)."""
    if csrf is None:
        page = await http.get(f"/console/operations/{op}")
        assert page.status_code == 200, page.text
        csrf = csrf_of(page.text)
    return await http.post(f"/console/operations/{op}/resolve", data={"csrf": csrf, **fields})


COMMITTED_FORM = {
    "outcome": "committed",
    "receipt_external_ref": "ch_3PQ8",
    "receipt_result": '{"amount": 1200}',
    "evidence_source": "payment provider dashboard",
    "evidence_lookup_ref": "psp-req-7781",
    "evidence_checked_at": "2026-11-30T10:00:00Z",
}
