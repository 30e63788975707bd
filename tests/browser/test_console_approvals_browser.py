"""The console's Approvals page in a real Chromium: the pending queue with each request's intent
(escaped), note, requester and age; approve and deny through CSRF-checked forms; the requester
cannot approve its own; axe-clean at desktop width and at 375 px. With EFFECT_LEDGER_SCREENSHOTS=1
it writes docs/console/approvals*.png."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from effect_ledger.settings import Settings
from support.auth import token
from support.server import Service

try:
    from axe_playwright_python.async_playwright import Axe
    from playwright.async_api import Browser, Page, async_playwright
except ImportError:  # pragma: no cover - the test extra installs both
    pytest.skip(
        "BROWSER TESTS SKIPPED: playwright / axe-playwright-python are not installed (pip install -e '.[test]')",
        allow_module_level=True,
    )

CHROMIUM = os.environ.get("EFFECT_LEDGER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(f"BROWSER TESTS SKIPPED: no Chromium at {CHROMIUM}", allow_module_level=True)

pytestmark = pytest.mark.browser
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
SCREENSHOTS = os.environ.get("EFFECT_LEDGER_SCREENSHOTS") == "1"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-dev-shm-usage",
]
POLICY = {"default": [{"tool": "payments.refund", "required": 1, "ttl_seconds": 3600}]}
APPROVER = token(sub="lead-mia", scope="ledger:approve")


@pytest.fixture
async def service(settings: Settings) -> AsyncIterator[Service]:
    async with Service(replace(settings, approval_policy=json.dumps(POLICY))) as running:
        yield running


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


async def new_page(browser: Browser, service: Service, width: int = 1280, height: int = 860) -> Page:
    context = await browser.new_context(
        base_url=service.base_url, viewport={"width": width, "height": height}
    )
    return await context.new_page()


async def shot(page: Page, name: str, *, full: bool = True) -> None:
    if SCREENSHOTS:
        SHOTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full)


async def sign_in(page: Page, bearer: str, start: str = "/console/approvals") -> None:
    await page.goto(start)
    assert page.url.endswith("/console/login?next=" + start)
    await page.get_by_label("Bearer token").fill(bearer)
    await page.keyboard.press("Tab")
    await page.keyboard.press("Enter")
    await page.wait_for_url(lambda url: url.endswith(start) and "/console/login" not in url)


async def serious(axe: Axe, page: Page) -> list[str]:
    results = await axe.run(page)
    return [
        f"{page.url}: {v['id']} ({len(v['nodes'])} nodes) {v['help']}"
        for v in results.response["violations"]
        if v.get("impact") in ("serious", "critical")
    ]


async def request_refund(service: Service, op: str, intent: Any, note: str, sub: str = "refund-bot") -> str:
    body = {"tool": "payments.refund", "tool_version": "2.0.0", "intent": intent, "approval_note": note}
    async with service.client() as http:
        r = await http.post(
            f"/v1/operations/{op}/claim",
            json=body,
            headers={"Authorization": f"Bearer {token(sub=sub, scope='ledger:execute')}"},
        )
    assert r.status_code == 403 and r.json()["code"] == "approval_required", r.text
    return str(r.json()["approval"]["approval_id"])


async def status_of(service: Service, approval_id: str) -> str:
    async with service.client() as http:
        r = await http.get(f"/v1/approvals/{approval_id}", headers={"Authorization": f"Bearer {APPROVER}"})
    return str(r.json()["status"])


@pytest.mark.timeout(240)
async def test_the_approvals_queue_decides_with_csrf_and_passes_axe(
    service: Service, browser: Browser
) -> None:
    first = await request_refund(
        service,
        "refund-4411",
        {"order": "ord-4411", "amount": 1200, "currency": "EUR"},
        "customer ticket 4411",
    )
    hostile = await request_refund(
        service, "refund-4412", {"order": "<script>alert(1)</script>", "amount": 80}, "<b>urgent</b>"
    )
    own = await request_refund(
        service, "refund-4413", {"order": "ord-4413", "amount": 15}, "mine", sub="lead-mia"
    )
    page = await new_page(browser, service)
    await sign_in(page, APPROVER)
    cards = page.locator("#approvals > li")
    assert await cards.count() == 3
    text = await cards.first.inner_text()
    assert "refund-4411" in text and "refund-bot" in text and "customer ticket 4411" in text and "ago" in text
    assert '"amount": 1200' in text
    # escaped, not interpreted: the text shows the markup, the page has no such element
    assert "<script>alert(1)</script>" in await cards.nth(1).inner_text()
    assert "<b>urgent</b>" in await cards.nth(1).inner_text()
    assert await page.locator("#approvals script, #approvals b").count() == 0
    # its own request: no form
    assert "someone else must decide it" in await cards.nth(2).inner_text()
    assert await cards.nth(2).locator("form").count() == 0
    axe = Axe()
    findings = await serious(axe, page)
    await shot(page, "approvals")
    # approve the first with the keyboard-reachable button
    await page.get_by_label("Reason for refund-4411 (optional)").fill("matches the ticket")
    await page.get_by_role("button", name="Approve refund-4411").click()
    await page.wait_for_url("**/console/approvals?decided=approved")
    assert "Your approval was recorded." in await page.locator("#notice").inner_text()
    assert await status_of(service, first) == "approved"
    assert await cards.count() == 2
    findings += await serious(axe, page)
    # a forged CSRF token changes nothing
    await page.evaluate("() => { document.querySelector('form.decide input[name=csrf]').value = 'forged'; }")
    await page.get_by_role("button", name="Deny refund-4412").click()
    await page.wait_for_url("**/console/approvals/*/decide")
    assert "This form has expired" in await page.locator("h1").inner_text()
    assert await status_of(service, hostile) == "pending"
    # deny for real
    await page.goto("/console/approvals")
    await page.get_by_role("button", name="Deny refund-4412").click()
    await page.wait_for_url("**/console/approvals?decided=denied")
    assert await status_of(service, hostile) == "denied"
    assert await status_of(service, own) == "pending"
    # a phone: 375 px, nothing scrolls sideways, axe-clean
    await request_refund(
        service, "refund-4414", {"order": "ord-4414", "amount": 99_999, "lines": list(range(30))}, "big one"
    )
    phone = await new_page(browser, service, 375, 812)
    await sign_in(phone, APPROVER)
    assert await phone.evaluate("() => document.documentElement.scrollWidth") <= 375
    findings += await serious(axe, phone)
    await shot(phone, "phone-approvals")
    assert findings == [], findings


async def test_without_ledger_approve_the_page_is_refused(service: Service, browser: Browser) -> None:
    page = await new_page(browser, service)
    await sign_in(page, token(sub="oncall-ana", scope="ledger:reconcile"), "/console/unknown")
    await page.goto("/console/approvals")
    assert "ledger:approve" in await page.locator("main").inner_text()
    assert await page.get_by_role("link", name="Approvals").count() == 0
