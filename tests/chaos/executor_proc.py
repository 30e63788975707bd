"""An executor as a process of its own (the paused-executor scenario stops and continues it).

    python executor_proc.py BASE_URL SINK_URL NAME LEASE_SECONDS PAUSE OP_ID...

The token comes in EFFECT_LEDGER_CHAOS_TOKEN. It claims every operation, prints `ALL_CLAIMED`, waits
("preparing the request": the window in which the test stops it) PAUSE seconds, or with PAUSE `stdin`
until a line arrives on its stdin (the test sends it once it has stopped and continued the process),
then for each operation submits, sends the effect to the sink and commits. One JSON line per operation says how it
ended; the sink is called only after a successful submit.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx

from effect_ledger.client import LedgerClient, LedgerProblem, OperationInProgress, Receipt, RetryPolicy

TOOL, TOOL_VERSION = "chaos-sink", "1"


async def run(base_url: str, sink_url: str, name: str, lease: int, pause: str, ids: list[str]) -> None:
    claimed = 0
    go = asyncio.Event()
    retry = RetryPolicy(maximum_attempts=20, deadline_seconds=20.0)

    async def one(client: LedgerClient, sink: httpx.AsyncClient, operation_id: str) -> dict[str, object]:
        nonlocal claimed
        result: dict[str, object] = {"operation_id": operation_id, "executor": name, "sink_called": False}
        while True:
            try:
                async with client.effect(
                    operation_id,
                    tool=TOOL,
                    tool_version=TOOL_VERSION,
                    intent={"operation": operation_id},
                    lease_seconds=lease,
                ) as effect:
                    if effect.reused:
                        result["outcome"] = "reused"
                        return result
                    assert effect.claim is not None
                    result["attempt"] = effect.claim.attempt
                    claimed += 1
                    if claimed == len(ids):
                        print("ALL_CLAIMED", flush=True)
                        if pause == "stdin":
                            await asyncio.to_thread(sys.stdin.readline)
                        else:
                            await asyncio.sleep(float(pause))
                        go.set()
                    await go.wait()
                    await effect.submitted(effect_ref=f"{name}:{operation_id}")
                    result["sink_called"] = True
                    sent = {"attempt": effect.claim.attempt, "executor": name}
                    answer = (await sink.post(f"{sink_url}/effects/t1/{operation_id}", json=sent)).json()
                    effect.commit(Receipt(external_ref=answer["external_ref"], result=answer["result"]))
                result["outcome"] = "committed"
                return result
            except OperationInProgress as problem:
                await asyncio.sleep(min(problem.retry_after or 0.5, 1.0))
            except LedgerProblem as problem:
                result["outcome"] = problem.code
                return result

    async with (
        LedgerClient(base_url, os.environ["EFFECT_LEDGER_CHAOS_TOKEN"], retry=retry) as client,
        httpx.AsyncClient(timeout=10) as sink,
    ):
        results = await asyncio.gather(*(one(client, sink, i) for i in ids))
    for result in results:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    base, sink_url, executor_name, lease_seconds, pause_seconds, *operation_ids = sys.argv[1:]
    asyncio.run(run(base, sink_url, executor_name, int(lease_seconds), pause_seconds, operation_ids))
