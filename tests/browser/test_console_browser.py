"""The console in a real browser (Debian's Chromium driven by Playwright), served on a loopback port.

They sign in as a person would, walk the unknown queue, resolve with evidence and watch the timeline
grow, are refused without ledger:reconcile and with a forged CSRF token, check keyboard use and a
phone's width, and run axe-core on every main page. With EFFECT_LEDGER_SCREENSHOTS=1 they also write
the screenshots of docs/console/.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

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
    pytest.skip(
        f"BROWSER TESTS SKIPPED: no Chromium at {CHROMIUM}; install Debian's chromium (.ci/run does) "
        "or set EFFECT_LEDGER_CHROMIUM",
        allow_module_level=True,
    )

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "console"
SCREENSHOTS = os.environ.get("EFFECT_LEDGER_SCREENSHOTS") == "1"
RECONCILER = "ledger:reconcile ledger:audit diagnostics:read"
CLAIM = {"tool": "payments.charge", "tool_version": "1.4.0", "lease_seconds": 30}
# Root in a container: no sandbox; no calls home (the machine's network is closed).
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


@pytest.fixture(scope="module")
async def chromium() -> AsyncIterator[Browser]:
    """One headless system Chromium for the module (a launch costs a second or two); Playwright gives
    the launch a fresh, empty profile."""
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def browser(chromium: Browser) -> AsyncIterator[Browser]:
    """The module's Chromium for one test: every page is in a new context (its own cookies and
    storage, as a fresh profile's), and every context the test opened is closed after it."""
    assert not chromium.contexts
    yield chromium
    for context in chromium.contexts:
        await context.close()


async def new_page(browser: Browser, service: Service, width: int = 1280, height: int = 860) -> Page:
    """A page in a new browser context (its own cookies), with the console's base URL."""
    context = await browser.new_context(
        base_url=service.base_url, viewport={"width": width, "height": height}
    )
    return await context.new_page()


async def shot(page: Page, name: str, *, full: bool = True) -> None:
    """Write docs/console/<name>.png when screenshots are asked for."""
    if SCREENSHOTS:
        SHOTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full)


async def api(service: Service, method: str, path: str, body: dict[str, Any] | None = None, **kw: Any) -> Any:
    """One API call as an all-scopes caller of tenant t1 (executor exec-1)."""
    headers = {"Authorization": f"Bearer {token(**kw)}"}
    async with service.client() as http:
        r = await http.request(method, path, json=body, headers=headers)
    assert r.status_code < 300, r.text
    return r.json()


async def seed_unknown(service: Service, op: str, sub: str = "exec-1", effect_ref: str | None = None) -> None:
    """Claim, submit and report unknown: what a crashed executor leaves for a reconciler."""
    claimed = await api(
        service, "POST", f"/v1/operations/{op}/claim", {**CLAIM, "intent": {"op": op}}, sub=sub
    )
    claim_token = claimed["claim"]["token"]
    ref = effect_ref or f"psp-req-{op[-4:]}"
    await api(
        service, "POST", f"/v1/operations/{op}/submit", {"token": claim_token, "effect_ref": ref}, sub=sub
    )
    await api(
        service,
        "POST",
        f"/v1/operations/{op}/complete",
        {"token": claim_token, "outcome": "unknown"},
        sub=sub,
    )


async def seed_committed(service: Service, op: str, sub: str = "exec-1") -> None:
    """A charge that went through and was recorded with its receipt."""
    claimed = await api(
        service, "POST", f"/v1/operations/{op}/claim", {**CLAIM, "intent": {"op": op}}, sub=sub
    )
    # a result line wider than a phone: the page must wrap or scroll it inside its card (round 36)
    descriptor = f"CHECKOUT ORDER {op.upper()} FOR CART 81 OF THE SPRING CAMPAIGN, CAPTURED IN FULL"
    result = {"amount": 1200, "currency": "EUR", "statement_descriptor": descriptor}
    receipt = {"external_ref": f"ch_{op[-4:]}", "result": result}
    body = {"token": claimed["claim"]["token"], "outcome": "committed", "receipt": receipt}
    await api(service, "POST", f"/v1/operations/{op}/complete", body, sub=sub)


async def sign_in(page: Page, bearer: str, start: str = "/console/unknown") -> None:
    """Open a console page signed out, land on sign-in, paste the token, submit with the keyboard."""
    await page.goto(start)
    assert page.url.endswith("/console/login?next=" + start)
    await page.get_by_label("Bearer token").fill(bearer)
    await page.keyboard.press("Tab")  # from the token to the button, then Enter: no mouse needed
    await page.keyboard.press("Enter")
    await page.wait_for_url(lambda url: url.endswith(start) and "/console/login" not in url)


async def seed_session(service: Service) -> str:
    """A journal session whose pending calls name an unknown and a committed charge, and no operation."""
    sid = str((await api(service, "POST", "/v1/sessions", {"labels": {"task": "checkout"}}))["session_id"])

    def call(call_id: str, op: str | None) -> dict[str, Any]:
        return {
            "type": "tool_call",
            "call_id": call_id,
            "name": "payments.charge",
            "arguments": {"cart": call_id},
            "operation_id": op,
        }

    records = [
        {"type": "message", "role": "user", "content": "Charge the three open carts."},
        call("cart-81", "charge-7781"),
        call("cart-01", "charge-7701"),
        call("cart-99", None),
    ]
    await api(service, "POST", f"/v1/sessions/{sid}/records", {"expected_revision": 0, "records": records})
    return sid


@pytest.fixture
async def console(service: Service) -> Service:
    """The service with a small, realistic tenant: unknown charges, receipts, an incident read."""
    for op in ("charge-7781", "charge-7790", "charge-7802"):
        await seed_unknown(service, op, sub="checkout-worker")
    for op in ("charge-7701", "charge-7702"):
        await seed_committed(service, op, sub="checkout-worker")
    return service


async def test_sign_in_walk_the_queue_and_resolve_with_evidence(console: Service, browser: Browser) -> None:
    page = await new_page(browser, console)
    await page.goto("/console/unknown")
    await shot(page, "login", full=False)
    await sign_in(page, token(sub="oncall-ana", scope=RECONCILER))
    rows = page.locator("table tbody tr")
    assert await rows.count() == 3
    first_ids = [await rows.nth(i).locator("td").first.inner_text() for i in range(3)]
    assert first_ids == ["charge-7781", "charge-7790", "charge-7802"]  # oldest first
    assert "ago" in await rows.first.inner_text()  # relative age beside the UTC time
    await shot(page, "unknown-queue")
    # Keyboard: the first link of the table is reachable and opens the operation.
    await page.get_by_role("link", name="charge-7781").focus()
    await page.keyboard.press("Enter")
    await page.wait_for_url("**/console/operations/charge-7781")
    timeline = page.locator("#timeline > li")
    before = await timeline.count()
    assert before == 3  # claimed, submitted, reported unknown
    assert "Intact" in await page.locator("#chain-verdict").inner_text()
    await page.get_by_label("It applied").check()
    await page.get_by_label("External reference").fill("ch_3PQ8")
    await page.get_by_label("Result (JSON, at most 16 KiB)").fill('{"amount": 1200, "currency": "EUR"}')
    await page.get_by_label("Where you looked").fill("payment provider dashboard")
    await page.get_by_label("Lookup reference (optional)").fill("psp-req-7781")
    await shot(page, "operation-resolve")
    await page.get_by_role("button", name="Record resolution").click()
    await page.wait_for_url("**/console/operations/charge-7781?resolved=recorded")
    assert "Your resolution was recorded." in await page.locator("#notice").inner_text()
    assert await timeline.count() == before + 1
    last = await timeline.last.inner_text()
    assert "resolved" in last and "unknown → committed" in last and "oncall-ana" in last
    assert "Intact: 4 events" in await page.locator("#chain-verdict").inner_text()
    await shot(page, "operation-resolved")
    # Back in the queue, the resolved charge is gone.
    await page.get_by_role("link", name="Unknown queue").click()
    await page.wait_for_url("**/console/unknown")
    assert await page.locator("table tbody tr").count() == 2


async def test_a_resolve_without_ledger_reconcile_is_refused(console: Service, browser: Browser) -> None:
    page = await new_page(browser, console)
    await sign_in(page, token(sub="auditor-1", scope="ledger:audit"), "/console/operations/charge-7790")
    assert await page.locator("form.resolve").count() == 0  # no form offered without the scope
    # A hand-made form (the page's own CSRF token, the auditor's session) is still refused.
    await page.evaluate(
        """() => {
        const form = document.createElement('form');
        form.method = 'post'; form.action = '/console/operations/charge-7790/resolve';
        for (const [k, v] of [['csrf', document.querySelector('input[name=csrf]').value],
            ['outcome', 'committed'], ['receipt_external_ref', 'ch_x'], ['evidence_source', 'guess'],
            ['evidence_checked_at', '2026-11-30T10:00:00Z']]) {
            const input = document.createElement('input'); input.type = 'hidden'; input.name = k;
            input.value = v; form.appendChild(input);
        }
        document.body.appendChild(form); form.submit();
        }"""
    )
    await page.wait_for_url("**/console/operations/charge-7790/resolve")
    assert "ledger:reconcile" in await page.locator("main").inner_text()
    assert "Not allowed with this token" in await page.locator("h1").inner_text()
    view = await api(console, "GET", "/v1/operations/charge-7790")
    assert view["status"] == "unknown"


async def test_a_forged_csrf_token_is_rejected(console: Service, browser: Browser) -> None:
    page = await new_page(browser, console)
    await sign_in(page, token(sub="oncall-ana", scope=RECONCILER), "/console/operations/charge-7802")
    await page.get_by_label("It did not apply").check()
    await page.get_by_label("Category").select_option("rejected")
    await page.get_by_label("Where you looked").fill("support ticket 4411")
    await page.evaluate("() => { document.querySelector('form.resolve input[name=csrf]').value = 'forged'; }")
    await page.get_by_role("button", name="Record resolution").click()
    await page.wait_for_url("**/console/operations/charge-7802/resolve")
    assert "This form has expired" in await page.locator("h1").inner_text()
    await shot(page, "error-csrf", full=False)
    view = await api(console, "GET", "/v1/operations/charge-7802")
    assert view["status"] == "unknown"


async def test_refusals_read_as_sentences(console: Service, browser: Browser) -> None:
    page = await new_page(browser, console)
    await sign_in(page, token(sub="oncall-ana", scope=RECONCILER), "/console/operations/charge-7701")
    await page.get_by_text("Record a finding anyway").click()  # folded: the operation is committed
    await page.get_by_label("It did not apply").check()
    await page.get_by_label("Category").select_option("rejected")
    await page.get_by_label("Where you looked").fill("provider dashboard")
    await page.get_by_role("button", name="Record resolution").click()
    error = await page.locator("#resolve-error").inner_text()
    assert "already committed with a different outcome" in error and "discrepancy" in error
    assert "discrepancy" in await page.locator("#timeline").inner_text()
    await page.goto("/console/operations/does-not-exist")
    assert "Not found" in await page.locator("h1").inner_text()
    await shot(page, "error-404", full=False)


@pytest.mark.timeout(360)  # fourteen pages through axe-core on a shared CI machine
async def test_every_main_page_passes_axe_and_fits_a_phone(console: Service, browser: Browser) -> None:
    headers = {"Authorization": f"Bearer {token()}"}
    async with httpx.AsyncClient(base_url=console.base_url) as http:
        reported = await http.post(
            "/v1/diagnostics",
            headers=headers,
            json={
                "operation_id": "charge-7781",
                "phase": "first_byte",
                "cause": "timeout",
                "provider": "psp",
                "http_status": 504,
                "elapsed_ms": 30000,
                "retryable_hint": True,
            },
        )
    incident = reported.json()["incident"]
    axe = Axe()
    page = await new_page(browser, console)
    await page.goto("/console/login")
    pages: dict[str, str] = {"login": "/console/login"}
    findings = await serious(axe, page)
    await sign_in(page, token(sub="oncall-ana", scope=RECONCILER))
    # The incident is read once (with a purpose), so the access log has a row to show.
    await page.goto(f"/console/incidents/{incident}")
    await shot(page, "incident-purpose", full=False)
    findings += await serious(axe, page)
    await page.get_by_label("Purpose").fill("on-call: ticket OPS-1234, timed-out charge")
    await page.get_by_role("button", name="Read the incident").click()
    await page.wait_for_selector("text=This read was recorded")
    await shot(page, "incident")
    findings += await serious(axe, page)
    pages.update(
        {
            "overview": "/console/",
            "unknown-queue": "/console/unknown",
            "operations": "/console/operations",
            "operations-search": "/console/operations?status=committed&tool=payments.charge",
            "operation": "/console/operations/charge-7701",
            "receipts": "/console/receipts",
            "incidents": "/console/incidents",
            "access-log": "/console/access-log",
            "not-found": "/console/operations/nope",
            "journal-session": f"/console/sessions/{await seed_session(console)}",
        }
    )
    for name, path in list(pages.items())[1:]:
        await page.goto(path)
        findings += await serious(axe, page)
        if name in ("overview", "operations-search", "receipts", "access-log", "journal-session"):
            await shot(page, name)
    assert findings == [], findings
    # A phone: 375 px wide, nothing scrolls sideways, the queue stacks into cards.
    phone = await new_page(browser, console, 375, 812)
    await sign_in(phone, token(sub="oncall-ana", scope=RECONCILER))
    for path in (
        "/console/unknown",
        "/console/operations/charge-7781",
        "/console/operations/charge-7701",  # a committed receipt whose result has a long line
        "/console/receipts",
    ):
        await phone.goto(path)
        assert await phone.evaluate("() => document.documentElement.scrollWidth") <= 375, path
        findings += await serious(axe, phone)
    await phone.goto("/console/unknown")
    await shot(phone, "phone-unknown-queue")
    await phone.goto("/console/operations/charge-7781")
    await shot(phone, "phone-operation", full=False)
    assert findings == [], findings


async def test_keyboard_skip_link_and_pages_without_scripts(console: Service, browser: Browser) -> None:
    context = await browser.new_context(base_url=console.base_url, java_script_enabled=False)
    page = await context.new_page()
    await sign_in(page, token(sub="oncall-ana", scope=RECONCILER), "/console/operations/charge-7790")
    # Without scripts every part of the resolve form is shown and it still works.
    assert await page.get_by_label("External reference").is_visible()
    await page.get_by_label("Could not tell yet").check()
    await page.get_by_label("Where you looked").fill("provider status page")
    await page.get_by_role("button", name="Record resolution").click()
    await page.wait_for_url("**?resolved=unresolved")
    assert "stays unknown" in await page.locator("#notice").inner_text()
    # The first Tab reaches the skip link, which moves focus to the content.
    await page.keyboard.press("Tab")
    assert await page.evaluate("() => document.activeElement.textContent") == "Skip to content"
    await page.keyboard.press("Enter")
    assert await page.evaluate("() => document.activeElement.id") == "main"


async def serious(axe: Axe, page: Page) -> list[str]:
    """axe-core's serious and critical findings on the page, as 'path: rule (n nodes)'."""
    results = await axe.run(page)
    path = page.url.split("/console", 1)[-1]
    return [
        f"{path}: {v['id']} ({len(v['nodes'])} nodes) {v['help']}"
        for v in results.response["violations"]
        if v.get("impact") in ("serious", "critical")
    ]


@pytest.fixture
async def logged_console(settings: Any, tmp_path: Path) -> AsyncIterator[Service]:
    """The service with the receipts log on (its signer in process, its state in tmp_path)."""
    from dataclasses import replace

    configured = replace(
        settings,
        log_enabled=True,
        log_signer_state=str(tmp_path / "signer"),
        data_dir=str(tmp_path / "data"),
        log_checkpoint_seconds=1,
        log_integrate_interval_ms=50,
    )
    async with Service(configured) as running:
        yield running


async def test_the_receipts_log_on_the_operation_page_and_the_overview(
    logged_console: Service, browser: Browser
) -> None:
    for op in ("charge-7701", "charge-7702"):
        await seed_committed(logged_console, op, sub="checkout-worker")
    async with logged_console.client() as http:
        for _ in range(200):  # the checkpoint arrives within a second or two
            r = await http.get("/v1/log/checkpoint", headers={"Authorization": f"Bearer {token()}"})
            if r.status_code == 200 and "\n2\n" in r.text:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("no checkpoint of size 2")
    page = await new_page(browser, logged_console)
    await sign_in(
        page,
        token(sub="auditor-eva", scope="ledger:audit ledger:reconcile"),
        "/console/operations/charge-7702",
    )
    assert await page.locator("#log-index").inner_text() == "1"
    assert (
        "proof verifies against the current signed checkpoint"
        in await page.locator("#log-verdict").inner_text()
    )
    await shot(page, "operation-log")
    findings = await serious(Axe(), page)
    await page.goto("/console/")
    assert await page.locator("#log-size").inner_text() == "2"
    assert "none configured" in await page.locator("#log-witnesses").inner_text()
    findings += await serious(Axe(), page)
    await shot(page, "overview-log")
    assert findings == []
