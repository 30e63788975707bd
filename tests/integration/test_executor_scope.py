"""API.md section 3: a caller holding only ledger:execute reads (and acts on) only operations bound to
its own principal; another principal's answers the byte-identical 404 of a missing one. Reconcilers
and auditors read the whole tenant."""

from __future__ import annotations

import httpx

from support.auth import auth
from support.ledger import CLAIM, RECEIPT, call, claim, count_events, get, pending, submitted

EXEC_ONLY = "ledger:execute"


async def _missing(
    client: httpx.AsyncClient, path: str, body: dict[str, object] | None, sub: str
) -> httpx.Response:
    headers = auth(sub=sub, scope=EXEC_ONLY)
    if body is None:
        return await client.get(path, headers=headers)
    return await client.post(path, json=body, headers=headers)


async def test_another_principals_operation_reads_as_missing(client: httpx.AsyncClient, db_url: str) -> None:
    token = await submitted(client, "own-op")
    before = await count_events(db_url)
    # exec-2 does not hold the attempt's token (the token, not the principal, authorises a transition)
    guess = "clt_" + "A" * 43
    calls: list[tuple[str, dict[str, object] | None]] = [
        ("", None),
        ("/submit", {"token": guess, "effect_ref": "x"}),
        ("/heartbeat", {"token": guess}),
        ("/complete", {"token": guess, "outcome": "committed", "receipt": RECEIPT}),
        ("/complete", {"token": guess, "outcome": "unknown", "diagnostics": {"cause": "timeout"}}),
    ]
    for suffix, body in calls:
        theirs = await _missing(client, f"/v1/operations/own-op{suffix}", body, "exec-2")
        absent = await _missing(client, f"/v1/operations/no-such-op{suffix}", body, "exec-2")
        assert theirs.status_code == 404, (suffix, theirs.text)
        assert (
            theirs.content == absent.content
            and theirs.headers["content-type"] == absent.headers["content-type"]
        )
    assert await count_events(db_url) == before  # nothing was recorded by the refused calls
    # the owner, a reconciler, an auditor and an executor that also audits all read it
    for sub, scope in (
        ("exec-1", EXEC_ONLY),
        ("rec-1", "ledger:reconcile"),
        ("aud-1", "ledger:audit"),
        ("exec-2", "ledger:execute ledger:audit"),
    ):
        r = await get(client, "/v1/operations/own-op", sub=sub, scope=scope)
        assert r.status_code == 200 and r.json()["principal"] == "exec-1", (sub, scope)
    # and the owner's token still works after all of that
    r = await call(
        client,
        "own-op",
        "complete",
        {"token": token, "outcome": "committed", "receipt": RECEIPT},
        scope=EXEC_ONLY,
    )
    assert r.status_code == 200 and r.json()["status"] == "committed"


async def test_claim_of_another_principals_id_stays_intent_conflict(client: httpx.AsyncClient) -> None:
    await pending(client, "their-op")
    r = await claim(client, "their-op", CLAIM, sub="exec-2", scope=EXEC_ONLY)
    assert r.status_code == 422 and r.json()["code"] == "intent_conflict"
    assert r.json()["mismatched"] == ["principal"] and "operation" not in r.json()


async def test_an_executors_own_refusals_still_carry_the_operation(client: httpx.AsyncClient) -> None:
    await pending(client, "mine")
    r = await call(client, "mine", "submit", {"token": "clt_" + "A" * 43}, scope=EXEC_ONLY)
    assert r.status_code == 409 and r.json()["code"] == "stale_claim"
    assert r.json()["operation"]["operation_id"] == "mine"
