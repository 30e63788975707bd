"""Scenario 9: a Hypothesis state machine drives claim, submit, heartbeat, complete, resolve, lease
expiry and the purge (tombstones, API.md section 9a) against the real service and against a model
written from docs/api.md; every answer's status and problem code (and, for 2xx, the operation's status
and attempt) must be what the model says.

This is the independent check of the write path's one rule set, the database functions of
alembic/functions/ (docs/write-path.md): the model shares no code with them."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from effect_ledger.db.maintenance import owner_connection, purge_ledger_batch
from effect_ledger.settings import Settings
from support.harness import LONG, bearer, chaos_settings, scale, scenario, timeout
from support.server import Service

pytestmark = [pytest.mark.chaos, timeout(240, 1800)]  # 150 s before the purge rule

EXECUTOR = bearer("t1", "exec-1", "ledger:execute")
RECONCILER = bearer("t1", "rec-1", "ledger:reconcile")
AUDITOR = bearer("t1", "aud-1", "ledger:audit")
TERMINAL = ("committed", "not_applied")
EVIDENCE = {"source": "model", "lookup_ref": None, "checked_at": "2026-11-30T10:00:00Z"}
EXPIRE = (
    "UPDATE ledger.operations SET lease_expires_at = clock_timestamp() - interval '1 second' "
    "WHERE tenant_id = 't1' AND operation_id = %s"
)
# Past retention_days (30 by default): the next purge makes this operation a tombstone.
BACKDATE = (
    "UPDATE ledger.operations SET updated_at = now() - interval '31 days' "
    "WHERE tenant_id = 't1' AND operation_id = %s"
)

ids = st.integers(0, 2)
tokens = st.sampled_from(["current", "current", "stale"])
nonces = st.sampled_from([None, "A", "B"])


@dataclass
class Op:
    """The model of one operation, as docs/api.md sections 2 and 6 describe it."""

    status: str
    attempt: int
    token: str
    nonce: str | None
    version: str  # the tool_version it is bound to
    expired: bool = False
    effect_ref: str | None = None
    receipt: str | None = None  # the external_ref of the recorded receipt
    reason: str | None = None  # the detail_code of the recorded reason
    purged: bool = False  # a tombstone: its receipt body or reason and its events are gone
    stale: list[str] = field(default_factory=list)

    @property
    def effective(self) -> str:
        return "unknown" if self.status == "submitted" and self.expired else self.status

    @property
    def live(self) -> bool:
        return self.status in ("pending", "submitted") and not self.expired


Expected = tuple[int, str | None]  # status, problem code


class InProcess:
    """Hypothesis runs the rules in a thread; each call runs on the service's event loop, in process
    (httpx's ASGI transport: the whole app, without a socket and an HTTP server in between)."""

    def __init__(self, client: httpx.AsyncClient, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop

    def request(
        self, method: str, path: str, *, json: dict[str, Any] | None, headers: dict[str, str]
    ) -> httpx.Response:
        call = self.client.request(method, path, json=json, headers=headers)
        return asyncio.run_coroutine_threadsafe(call, self.loop).result(timeout=60)


class LedgerMachine(RuleBasedStateMachine):
    """The service and the model side by side; each rule checks the answer against the model."""

    http: ClassVar[InProcess]
    db_url: ClassVar[str]
    settings: ClassVar[Settings]
    steps: ClassVar[int] = 0
    tombstones: ClassVar[int] = 0  # purges that made a tombstone, over the whole run

    def __init__(self) -> None:
        super().__init__()
        self.db = psycopg.connect(self.db_url, autocommit=True)
        self.prefix = uuid.uuid4().hex[:10]
        self.ops: dict[str, Op] = {}
        # the purge runs as it does in production (maintenance.purge_ledger_batch), on its own loop
        self.loop = asyncio.new_event_loop()
        self.purger = self.loop.run_until_complete(owner_connection(self.settings))

    def teardown(self) -> None:
        self.db.close()
        self.loop.run_until_complete(self.purger.close())
        self.loop.close()

    def _id(self, i: int) -> str:
        return f"sm-{self.prefix}-{i}"

    def _nonce(self, name: str | None) -> str | None:
        return None if name is None else f"nonce-{self.prefix}-{name}-padding"

    def _call(
        self, path: str, body: dict[str, Any] | None, expected: Expected, headers: dict[str, str] = EXECUTOR
    ) -> dict[str, Any]:
        type(self).steps += 1
        r = self.http.request("GET" if body is None else "POST", path, json=body, headers=headers)
        got = (r.status_code, r.json().get("code") if r.status_code >= 400 else None)
        assert got == expected, f"{path} {body}: answered {got} {r.text[:300]}, the model expects {expected}"
        return dict(r.json())

    def _token(self, op: Op, which: str) -> str:
        if which == "stale":
            return op.stale[-1] if op.stale else "x" * 43  # a token this attempt never had
        return op.token

    def _check_view(self, view: dict[str, Any], op: Op) -> None:
        assert (view["status"], view["attempt"]) == (op.effective, op.attempt), (view, op)

    @rule(i=ids, other_binding=st.booleans(), nonce=nonces)
    def claim(self, i: int, other_binding: bool, nonce: str | None) -> None:
        key, op = self._id(i), self.ops.get(self._id(i))
        version = "2" if other_binding else "1"
        body = {
            "tool": "model",
            "tool_version": version,
            "intent": {"i": i},
            "lease_seconds": 600,
            "client_nonce": self._nonce(nonce),
        }
        path = f"/v1/operations/{key}/claim"
        if op is None:
            answer = self._call(path, body, (201, None))
            self.ops[key] = Op("pending", 1, answer["claim"]["token"], nonce, version)
            return
        if version != op.version:
            self._call(path, body, (422, "intent_conflict"))
        elif op.status == "committed":
            self._check_view(self._call(path, body, (200, None))["operation"], op)
        elif op.live:
            if nonce is not None and nonce == op.nonce:
                answer = self._call(path, body, (201, None))
                assert answer["claim"]["token"] == op.token and answer["claim"]["attempt"] == op.attempt
            else:
                self._call(path, body, (409, "operation_in_progress"))
        elif op.effective == "unknown":
            self._call(path, body, (409, "outcome_unknown"))
        else:  # pending with an expired lease, or not_applied: a new attempt
            answer = self._call(path, body, (201, None))
            op.stale.append(op.token)
            op.token, op.attempt, op.nonce = answer["claim"]["token"], op.attempt + 1, nonce
            op.status = "pending"
            op.expired, op.effect_ref, op.receipt, op.reason, op.purged = False, None, None, None, False
            assert answer["claim"]["attempt"] == op.attempt

    def _fenced(
        self, i: int, which: str, call: str, body: dict[str, Any]
    ) -> tuple[Op | None, str, dict[str, Any]]:
        key, op = self._id(i), self.ops.get(self._id(i))
        body = {"token": "x" * 43 if op is None else self._token(op, which), **body}
        return op, f"/v1/operations/{key}/{call}", body

    @rule(i=ids, which=tokens, ref=st.sampled_from([None, "r1", "r2"]))
    def submit(self, i: int, which: str, ref: str | None) -> None:
        op, path, body = self._fenced(i, which, "submit", {"effect_ref": ref})
        if op is None:
            self._call(path, body, (404, "not_found"))
        elif body["token"] != op.token:
            self._call(path, body, (409, "stale_claim"))
        elif op.effective == "submitted":
            if ref is None or ref == op.effect_ref:
                self._check_view(self._call(path, body, (200, None)), op)
            else:
                self._call(path, body, (409, "invalid_transition"))
        elif op.effective == "unknown":
            self._call(path, body, (409, "outcome_unknown"))
        elif op.status in TERMINAL:
            self._call(path, body, (409, "invalid_transition"))
        else:
            op.status, op.effect_ref, op.expired = "submitted", ref, False
            self._check_view(self._call(path, body, (200, None)), op)

    @rule(i=ids, which=tokens)
    def heartbeat(self, i: int, which: str) -> None:
        op, path, body = self._fenced(i, which, "heartbeat", {"lease_seconds": 600})
        if op is None:
            self._call(path, body, (404, "not_found"))
        elif body["token"] != op.token:
            self._call(path, body, (409, "stale_claim"))
        elif op.effective in ("pending", "submitted"):
            op.expired = False
            self._check_view(self._call(path, body, (200, None)), op)
        elif op.effective == "unknown":
            self._call(path, body, (409, "outcome_unknown"))
        else:
            self._call(path, body, (409, "invalid_transition"))

    @staticmethod
    def _report(outcome: str, variant: int) -> dict[str, Any]:
        if outcome == "committed":
            return {"receipt": {"external_ref": f"x{variant}"}}
        if outcome == "not_applied":
            return {"reason": {"category": "rejected", "detail_code": f"c{variant}"}}
        return {}

    @staticmethod
    def _same(op: Op, outcome: str, variant: int) -> bool:
        if outcome != op.status:
            return False
        if op.purged:  # a tombstone has no receipt or reason left: its outcome is all that can agree
            return True
        return (op.receipt if outcome == "committed" else op.reason) in (f"x{variant}", f"c{variant}")

    @staticmethod
    def _settle(op: Op, outcome: str, variant: int) -> None:
        op.status, op.expired = outcome, False
        op.receipt = f"x{variant}" if outcome == "committed" else None
        op.reason = f"c{variant}" if outcome == "not_applied" else None

    @rule(
        i=ids,
        which=tokens,
        outcome=st.sampled_from(["committed", "not_applied", "unknown"]),
        variant=st.integers(1, 2),
    )
    def complete(self, i: int, which: str, outcome: str, variant: int) -> None:
        report = {"outcome": outcome, **self._report(outcome, variant)}
        op, path, body = self._fenced(i, which, "complete", report)
        if op is None:
            self._call(path, body, (404, "not_found"))
        elif body["token"] != op.token:
            self._call(path, body, (409, "stale_claim"))
        elif op.status in TERMINAL:
            expected = (200, None) if self._same(op, outcome, variant) else (409, "conflicting_outcome")
            self._call(path, body, expected)
        elif outcome == "unknown" and op.effective == "pending":
            self._call(path, body, (409, "invalid_transition"))
        elif outcome == "unknown" and op.effective == "unknown":
            op.status = "unknown"  # an expiry is materialised; the lease stays expired (API section 2)
            self._check_view(self._call(path, body, (200, None)), op)
        else:
            self._settle(op, outcome, variant)
            self._check_view(self._call(path, body, (200, None)), op)

    @rule(
        i=ids, outcome=st.sampled_from(["committed", "not_applied", "unresolved"]), variant=st.integers(1, 2)
    )
    def resolve(self, i: int, outcome: str, variant: int) -> None:
        key, op = self._id(i), self.ops.get(self._id(i))
        body = {"outcome": outcome, "evidence": EVIDENCE, **self._report(outcome, variant)}
        path = f"/v1/operations/{key}/resolve"
        if op is None:
            self._call(path, body, (404, "not_found"), RECONCILER)
        elif op.status in TERMINAL:
            # `unresolved` claims no outcome: on a terminal operation it is 200 and records nothing
            same = outcome == "unresolved" or self._same(op, outcome, variant)
            self._call(path, body, (200, None) if same else (409, "conflicting_outcome"), RECONCILER)
        elif op.effective != "unknown":
            self._call(path, body, (409, "invalid_transition"), RECONCILER)
        elif outcome == "unresolved":
            op.status = "unknown"
            self._check_view(self._call(path, body, (200, None), RECONCILER), op)
        else:
            self._settle(op, outcome, variant)
            self._check_view(self._call(path, body, (200, None), RECONCILER), op)

    @rule(i=ids)
    def expire_lease(self, i: int) -> None:
        """The lease runs out: set into the past through an owner connection (no waiting)."""
        op = self.ops.get(self._id(i))
        if op is not None and op.live:
            self.db.execute(EXPIRE, (self._id(i),))
            op.expired = True

    @rule(i=ids)
    def purge(self, i: int) -> None:
        """Retention passes for one terminal operation: the purge makes it a tombstone (section 9a)."""
        op = self.ops.get(self._id(i))
        if op is None or op.status not in TERMINAL or op.purged:
            return
        self.db.execute(BACKDATE, (self._id(i),))
        batch = purge_ledger_batch(self.purger, self.settings.retention_days, 10)
        operations, _events = self.loop.run_until_complete(batch)
        assert operations == 1
        # the tombstone keeps the binding, status, attempt and digests; bodies and effect_ref go (9a)
        op.purged, op.receipt, op.reason, op.effect_ref = True, None, None, None
        type(self).tombstones += 1

    @rule(i=ids)
    def read(self, i: int) -> None:
        key, op = self._id(i), self.ops.get(self._id(i))
        if op is None:
            self._call(f"/v1/operations/{key}", None, (404, "not_found"))
            return
        view = self._call(f"/v1/operations/{key}", None, (200, None))
        self._check_view(view, op)
        # a lease that ran out stays visible as such until a terminal outcome or a new attempt
        assert view["lease_expired"] == (op.expired and op.status not in TERMINAL), (view, op)
        assert view["effect_ref"] == op.effect_ref
        assert (view["receipt"] or {}).get("external_ref") == op.receipt
        assert (view["not_applied_reason"] or {}).get("detail_code") == op.reason
        assert view.get("purged", False) == op.purged
        # whatever path the operation took (every transition, lease expiry, a discrepancy, the purge),
        # its chain recomputes and ends at the head its row names
        verdict = self._call(f"/v1/audit/verify?operation_id={key}", None, (200, None), AUDITOR)
        assert verdict["ok"] is True and verdict["first_bad_seq"] is None, (verdict, op)


async def test_service_answers_as_the_model_says(request: pytest.FixtureRequest, db_url: str) -> None:
    config = chaos_settings(
        db_url, rate_limit_per_second=0
    )  # thousands of calls of one principal: the limit has its own tests
    attributes = {"db_url": db_url, "steps": 0, "tombstones": 0, "settings": config}
    machine = type("Machine", (LedgerMachine,), attributes)
    runs = settings(
        max_examples=scale(100, 400),
        stateful_step_count=scale(40, 60),
        deadline=None,
        database=None,
        derandomize=not LONG,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    with scenario(request, "state_machine") as figures:
        async with Service(config) as service, service.client() as client:
            machine.http = InProcess(client, asyncio.get_running_loop())
            try:
                await asyncio.to_thread(run_state_machine_as_test, machine, settings=runs)
            except BaseException as failure:
                figures.violations.append(str(failure).splitlines()[0][:300])
                raise
            finally:
                figures.operations = machine.steps
                figures.extra = {
                    "examples": runs.max_examples,
                    "steps_per_example": runs.stateful_step_count,
                    "tombstones": machine.tombstones,
                }
    figures.assert_clean()
    assert machine.tombstones > 0  # the run met tombstones, not only live operations
