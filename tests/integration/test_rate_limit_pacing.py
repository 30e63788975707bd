"""Paced refusals (http.pacing): a caller that keeps sending while over its limit gets its 429s after
RATE_LIMIT_PACE_MS, so a flood on K connections gets at most the predicted number of answers; a
caller within its limit is never held; at most RATE_LIMIT_PACE_MAX_HELD refusals wait at once.

The flooder's override refills one token every 1,000 s, so its admitted requests are exactly its
burst, and every Retry-After it is told lies far beyond the test: each of its 429s after the first is
a caller coming back early."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import replace

import httpx
import pytest

from effect_ledger.settings import Settings
from support.auth import auth
from support.metrics import samples
from support.server import Service

BURST = 2
LIMITS = json.dumps({"t-flood": {"per_second": 0.001, "burst": BURST}})
CLAIM = {"tool": "t", "tool_version": "1", "intent": {}, "lease_seconds": 600}
FLOOD = auth("t-flood", "exec-loop", "ledger:execute")
PACE = 1.0
PACED: tuple[str, frozenset[tuple[str, str]]] = ("effect_ledger_rate_limit_paced_total", frozenset())
HELD = range(997, 1000)  # a held 429's Retry-After (see the flood test)


@pytest.fixture
def limited(settings: Settings) -> Settings:
    return replace(settings, rate_limit_overrides=LIMITS, rate_limit_pace_ms=int(PACE * 1000))


async def timed(http: httpx.AsyncClient, path: str, headers: dict[str, str]) -> tuple[httpx.Response, float]:
    """A claim (a path ending in /claim) or a read, and how long its answer took."""
    started = time.perf_counter()
    if path.endswith("/claim"):
        answer = await http.post(path, json=CLAIM, headers=headers)
    else:
        answer = await http.get(path, headers=headers)
    return answer, time.perf_counter() - started


async def spend_the_burst(http: httpx.AsyncClient, prefix: str) -> None:
    statuses = [(await timed(http, f"/v1/operations/{prefix}-{n}/claim", FLOOD))[0] for n in range(BURST)]
    assert [answer.status_code for answer in statuses] == [201] * BURST


def is_the_429(answer: httpx.Response, retry_after: int | range) -> bool:
    """The contract's 429; `retry_after` the Retry-After it must carry (or the range it lies in)."""
    told = int(answer.headers["retry-after"])
    return (
        answer.status_code == 429
        and answer.headers["content-type"].startswith("application/problem+json")
        and (told in retry_after if isinstance(retry_after, range) else told == retry_after)
        and answer.json()
        == {
            "type": "urn:effect-ledger:problem:rate_limited",
            "title": "Rate limited",
            "status": 429,
            "code": "rate_limited",
            "detail": "Too many requests for this tenant and principal; retry later.",
        }
    )


async def test_a_flood_is_held_to_its_connections_per_pace_and_the_quiet_tenant_is_not(
    limited: Settings,
) -> None:
    connections, window = 4, 2.0
    async with Service(limited) as service, service.client() as http:
        ids = iter(range(10_000))
        end = time.perf_counter() + window

        async def flood() -> list[tuple[httpx.Response, float]]:
            answers = []
            while time.perf_counter() < end:
                answers.append(await timed(http, f"/v1/operations/f-{next(ids)}/claim", FLOOD))
            return answers

        async def quiet() -> list[tuple[int, float]]:
            seen = []
            headers = auth("t-quiet", "exec-1", "ledger:execute")
            for n in range(10):
                answer, took = await timed(http, f"/v1/operations/q-{n}/claim", headers)
                seen.append((answer.status_code, took))
            return seen

        flooding = [asyncio.create_task(flood()) for _ in range(connections)]
        quiet_seen = await quiet()
        flooded = [answer for task in flooding for answer in await task]
        found = samples((await http.get("/metrics")).text)

    statuses = Counter(answer.status_code for answer, _ in flooded)
    assert statuses[201] == BURST and set(statuses) == {201, 429}
    at_once = [took for answer, took in flooded if answer.status_code == 429 and took < PACE]
    held = [took for answer, took in flooded if answer.status_code == 429 and took >= PACE * 0.99]
    assert len(at_once) == 1  # the first 429; every later one came back before its Retry-After
    assert len(held) == statuses[429] - 1 == found[PACED]
    # Each connection waits PACE per held answer: at most window / PACE + 1 of them, plus the burst and
    # the one 429 at once (without pacing the same loop gets hundreds of answers).
    predicted = BURST + 1 + connections * (int(window / PACE) + 1)
    assert connections <= len(held) and len(flooded) <= predicted, (len(flooded), predicted)
    # Retry-After: the whole seconds, rounded up, until a token is back, counted from when the answer
    # is sent. The token is back 1,000 s after the burst was spent; an answer at once says 1000, a held
    # one is sent 1 s after its decision, which came within the test's 3 s: 997 to 999.
    refused = [(answer, took) for answer, took in flooded if answer.status_code == 429]
    assert all(is_the_429(answer, 1000 if took < PACE else HELD) for answer, took in refused)
    # the quiet tenant, beside it: every claim granted, none held (the held count above is the flood's
    # alone; ten held claims would have taken ten seconds)
    assert [status for status, _ in quiet_seen] == [201] * 10
    assert sum(took for _, took in quiet_seen) < 10 * PACE


async def test_at_most_max_held_refusals_wait_the_rest_are_answered_at_once(limited: Settings) -> None:
    config = replace(limited, rate_limit_pace_max_held=2)
    async with Service(config) as service, service.client() as http:
        await spend_the_burst(http, "b")
        first, took = await timed(http, "/v1/operations/x/claim", FLOOD)
        assert is_the_429(first, 1000) and took < PACE
        answers = await asyncio.gather(*(timed(http, f"/v1/operations/y-{n}/claim", FLOOD) for n in range(6)))
        found = samples((await http.get("/metrics")).text)
    assert all(is_the_429(answer, 1000 if took < PACE else HELD) for answer, took in answers)
    assert sorted(took >= PACE * 0.99 for _, took in answers) == [False] * 4 + [True] * 2
    assert found[PACED] == 2


async def test_a_routed_call_is_paced_too(limited: Settings) -> None:
    """The guard of every other route holds its 429 the same way (here an operation read)."""
    async with Service(limited) as service, service.client() as http:
        await spend_the_burst(http, "r")
        first, took_first = await timed(http, "/v1/operations/r-0", FLOOD)
        again, took_again = await timed(http, "/v1/operations/r-0", FLOOD)
        found = samples((await http.get("/metrics")).text)
    assert is_the_429(first, 1000) and took_first < PACE
    assert is_the_429(again, HELD) and took_again >= PACE * 0.99  # what remains of 1,000 s after 1 s
    assert found[PACED] == 1


async def test_zero_answers_every_429_at_once(limited: Settings) -> None:
    async with Service(replace(limited, rate_limit_pace_ms=0)) as service, service.client() as http:
        answers = [await timed(http, f"/v1/operations/z-{n}/claim", FLOOD) for n in range(BURST + 5)]
        found = samples((await http.get("/metrics")).text)
    assert [answer.status_code for answer, _ in answers] == [201] * BURST + [429] * 5
    assert all(took < PACE for _, took in answers) and found[PACED] == 0
