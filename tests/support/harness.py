"""The chaos harness: scale, figures, the effect sink, the call history, and the invariant checker.

Every scenario drives real executors against a real service, records every HTTP call it makes
(invoke, then ok / fail / unknown), counts what the external system (the sink) executed, and checks
the history and the final database state for violations. A scenario passes only with zero.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import pairwise
from typing import Any

import asyncpg
import httpx
import pytest

from effect_ledger.db.ledger import event_view
from effect_ledger.domain.chain import first_bad_seq
from effect_ledger.settings import Settings
from support.auth import token
from support.recording import History, check_answers
from support.server import LoopServer

LONG = os.environ.get("EFFECT_LEDGER_CHAOS_LONG", "") not in ("", "0")
REPORT_FILE = os.environ.get("EFFECT_LEDGER_CHAOS_REPORT")  # JSON lines of figures, for the README table
TOOL, TOOL_VERSION = "chaos-sink", "1"


# Tokens minted when a module is imported must outlive the whole run, long mode included.
TOKEN_TTL_SECONDS = 6 * 3600
EVERY_SCOPE = "ledger:execute ledger:reconcile ledger:audit diagnostics:write diagnostics:read"


def bearer(tenant: str = "t1", sub: str = "exec-1", scope: str = EVERY_SCOPE) -> dict[str, str]:
    """Authorization headers with a token that stays valid for the whole run."""
    return {"Authorization": f"Bearer {token(tenant, sub, scope, ttl=TOKEN_TTL_SECONDS)}"}


def scale(short: int, long: int) -> int:
    """The size of a knob in the current mode (short in CI, long with EFFECT_LEDGER_CHAOS_LONG=1)."""
    return long if LONG else short


def timeout(short: int, long: int) -> pytest.MarkDecorator:
    """A per-test timeout for the current mode."""
    return pytest.mark.timeout(scale(short, long))


def chaos_settings(db_url: str, **overrides: Any) -> Settings:
    """What every in-process service of a scenario runs with: no background sweep, warnings only, and no
    receipts log (its own tests run it; like the tests' `settings` fixture)."""
    values: dict[str, Any] = {"background_sweep": False, "log_level": "warning", "log_enabled": False}
    return Settings(database_url=db_url, **{**values, **overrides})


# -- figures ---------------------------------------------------------------------------------


@dataclass
class Figures:
    """What one scenario did: operations, faults injected, violations found, and its own extras."""

    scenario: str
    operations: int = 0
    faults: int = 0
    violations: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        """One greppable line: `CHAOS <scenario> mode=… operations=… faults=… violations=… …`."""
        seconds = time.monotonic() - self.started
        extras = " ".join(f"{k}={v}" for k, v in self.extra.items())
        return (
            f"CHAOS {self.scenario} mode={'long' if LONG else 'short'} operations={self.operations} "
            f"faults={self.faults} violations={len(self.violations)} seconds={seconds:.1f} "
            f"{extras}"
        ).strip()

    def emit(self, config: pytest.Config) -> None:
        """Print the figures line past pytest's capture, and append it to the report file if one is set."""
        line = self.line()
        capture = config.pluginmanager.get_plugin("capturemanager")
        if capture is not None:
            with capture.global_and_fixture_disabled():
                print("\n" + line, flush=True)
        else:
            print(line, flush=True)
        if REPORT_FILE:
            record = {
                "scenario": self.scenario,
                "mode": "long" if LONG else "short",
                "operations": self.operations,
                "faults": self.faults,
                "violations": len(self.violations),
                "seconds": round(time.monotonic() - self.started, 1),
                **self.extra,
            }
            with open(REPORT_FILE, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")

    def check(self, found: Iterable[str]) -> None:
        """Add violations found by a checker."""
        self.violations.extend(found)

    def executed(
        self, history: History, sink: Sink, outcomes: Counter[str], reconciled: dict[str, int]
    ) -> None:
        """The figures every executor scenario reports (its own extras stay first): calls, executions,
        the executors' outcomes and what the reconciler settled."""
        self.operations = len(history.calls)
        self.extra |= {"executed": sink.total, "outcomes": dict(outcomes), **reconciled}

    def check_run(
        self,
        history: History | None,
        state: LedgerState,
        sink: Sink,
        *,
        allowed_5xx: frozenset[int] = frozenset({503}),
        swept: bool = False,
        not_effects: frozenset[tuple[str, str]] = frozenset(),
    ) -> None:
        """The checks every executor scenario ends with: the answers (when recorded), the ledger, one
        execution per settled effect (but the operations in `not_effects`, which the sink never ran),
        and the leases."""
        if history is not None:
            self.check(check_answers(history, allowed_5xx=allowed_5xx))
        self.check(check_ledger(state))
        effects = {key: op for key, op in state.operations.items() if key not in not_effects}
        self.check(check_effects(replace(state, operations=effects), sink.executions, settled=True))
        self.check(check_leases(state, swept=swept))

    def assert_clean(self) -> None:
        """The scenario's verdict: no violation at all."""
        assert not self.violations, f"{len(self.violations)} violations:\n" + "\n".join(self.violations[:25])


# -- the effect sink -------------------------------------------------------------------------


@dataclass(frozen=True)
class Execution:
    """One execution of an effect at the sink, with the fencing attempt the executor held."""

    key: str
    attempt: int
    executor: str
    at: float


def sink_receipt(key: str, attempt: int) -> dict[str, Any]:
    """The receipt the sink hands back for an execution (a reconciler can rebuild it from the sink)."""
    return {"external_ref": f"sink:{key}#{attempt}", "result": {"attempt": attempt}}


class Sink(LoopServer):
    """The external system, as a tiny HTTP service on loopback: it counts executions per key."""

    def __init__(self) -> None:
        self.executions: dict[str, list[Execution]] = {}
        super().__init__(self.app, lifespan="off")
        self.url = self.base_url

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """POST /effects/{key} {"attempt", "executor"} executes; GET /effects/{key} lists executions."""
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        key = scope["path"].removeprefix("/effects/")
        if scope["method"] == "POST":
            request = json.loads(body)
            execution = Execution(key, int(request["attempt"]), str(request["executor"]), time.time())
            self.executions.setdefault(key, []).append(execution)
            answer: Any = sink_receipt(key, execution.attempt)
        else:
            answer = {"executions": [e.attempt for e in self.executions.get(key, [])]}
        payload = json.dumps(answer).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    @property
    def total(self) -> int:
        """Executions of every key."""
        return sum(len(v) for v in self.executions.values())


async def execute_at_sink(
    http: httpx.AsyncClient, sink_url: str, key: str, attempt: int, executor: str
) -> dict[str, Any]:
    """Send the effect: one POST to the sink; its answer is the receipt."""
    response = await http.post(f"{sink_url}/effects/{key}", json={"attempt": attempt, "executor": executor})
    response.raise_for_status()
    return dict(response.json())


# -- the final state and its checker -------------------------------------------------------------


@dataclass
class LedgerState:
    """Every operation row and its event chain, read as the owner (which sees every tenant)."""

    operations: dict[tuple[str, str], dict[str, Any]]
    events: dict[tuple[str, str], list[dict[str, Any]]]
    now: datetime


async def read_state(owner_url: str) -> LedgerState:
    """Read the whole ledger as the database owner (row-level security does not apply to it)."""
    conn = await asyncpg.connect(owner_url)
    try:
        await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
        now = await conn.fetchval("SELECT clock_timestamp()")
        rows = await conn.fetch("SELECT * FROM ledger.operations")
        events = await conn.fetch(
            "SELECT tenant_id, operation_id, seq, at, kind, actor, from_status, to_status, attempt, "
            "data, prev_hash, hash FROM ledger.events ORDER BY tenant_id, operation_id, seq"
        )
    finally:
        await conn.close()
    state = LedgerState({(r["tenant_id"], r["operation_id"]): dict(r) for r in rows}, {}, now)
    for e in events:
        state.events.setdefault((e["tenant_id"], e["operation_id"]), []).append(
            {**event_view(e), "operation_id": e["operation_id"]}
        )
    return state


def effective_status(op: dict[str, Any], now: datetime) -> str:
    """A submitted operation whose lease ran out is unknown (API section 2)."""
    expires = op["lease_expires_at"]
    if op["status"] == "submitted" and (expires is None or expires <= now):
        return "unknown"
    return str(op["status"])


def check_ledger(state: LedgerState) -> list[str]:
    """No partial writes: every status change has its event and every event its change; chains verify."""
    found = []
    for key, op in state.operations.items():
        chain = state.events.get(key, [])
        name = "/".join(key)
        if not chain:
            found.append(f"{name}: operation without events")
            continue
        checked, bad = first_bad_seq(chain)
        if bad is not None:
            found.append(f"{name}: hash chain breaks at seq {bad} of {checked}")
        if chain[0]["kind"] != "claimed" or chain[0]["to_status"] != "pending":
            found.append(f"{name}: chain does not start with a claim")
        for before, after in pairwise(chain):
            if after["from_status"] != before["to_status"]:
                found.append(
                    f"{name}: event {after['seq']} starts from {after['from_status']}, "
                    f"the previous ended at {before['to_status']}"
                )
        last = chain[-1]
        if last["to_status"] != op["status"] or last["attempt"] != op["attempt"]:
            found.append(
                f"{name}: row says {op['status']}/attempt {op['attempt']}, its last event "
                f"{last['kind']} says {last['to_status']}/attempt {last['attempt']}"
            )
    for key in state.events:
        if key not in state.operations:
            found.append(f"{'/'.join(key)}: events without an operation")
    return found


def check_effects(state: LedgerState, executions: dict[str, list[Execution]], *, settled: bool) -> list[str]:
    """At most one execution per effect; a committed operation has exactly the one its receipt names.

    `settled`: executors and the reconciler are done, so an executed effect must be committed (a
    receipt was not lost) and nothing may be left pending or submitted.
    """
    found = []
    for key, runs in executions.items():
        if len(runs) > 1:
            found.append(f"{key}: effect executed {len(runs)} times (attempts {[r.attempt for r in runs]})")
    for (tenant, operation_id), op in state.operations.items():
        key = f"{tenant}/{operation_id}"
        runs = executions.get(key, [])
        status = effective_status(op, state.now)
        if status == "committed":
            receipt = op["receipt"] or {}
            if len(runs) != 1:
                found.append(f"{key}: committed with {len(runs)} executions at the sink")
            elif receipt.get("external_ref") != sink_receipt(key, runs[0].attempt)["external_ref"]:
                found.append(
                    f"{key}: receipt {receipt.get('external_ref')} does not name the execution "
                    f"of attempt {runs[0].attempt}"
                )
            elif runs[0].attempt != op["attempt"]:
                found.append(
                    f"{key}: executed by attempt {runs[0].attempt}, committed at attempt {op['attempt']}"
                )
        elif status == "not_applied" and runs:
            found.append(f"{key}: not_applied, yet the sink executed it")
        if settled:
            if runs and status != "committed":
                found.append(f"{key}: executed at the sink but {status} in the ledger (a lost receipt)")
            if status in ("pending", "submitted", "unknown"):
                found.append(f"{key}: still {status} after the executors and the reconciler finished")
    return found


def check_leases(state: LedgerState, *, swept: bool) -> list[str]:
    """Nothing pending beyond its lease; with a sweeper, nothing stored `submitted` beyond its lease."""
    found = []
    for key, op in state.operations.items():
        expires = op["lease_expires_at"]
        expired = expires is not None and expires <= state.now
        if op["status"] == "pending" and expired:
            found.append(f"{'/'.join(key)}: pending beyond its lease")
        if swept and op["status"] == "submitted" and expired:
            found.append(f"{'/'.join(key)}: submitted beyond its lease and not swept to unknown")
    return found


@contextmanager
def scenario(request: pytest.FixtureRequest, name: str) -> Iterator[Figures]:
    """Figures for one scenario, printed when it ends (pass or fail)."""
    figures = Figures(name)
    try:
        yield figures
    finally:
        figures.emit(request.config)
