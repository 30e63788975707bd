"""`effect-ledger demo` as a user runs it: a subprocess that exits 0 and prints the expected timeline."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

CLI = Path(sys.executable).with_name("effect-ledger")

# (action, status, attempt) rows the timeline must show, in this order.
EXPECTED_ROWS = [
    ("orchestrator", r"comparison: request \+ call c-a \(measurement-a\) -> revision 2", "-", "-"),
    ("exec-1", r"claim measurement-a -> execute", "pending", "1"),
    ("exec-1", r"submit measurement-a \(effect_ref req-a-1\), then send it", "submitted", "1"),
    ("measure-svc", r"measure prototype A for req-a-1: 41.7 ms", "-", "-"),
    ("exec-1", r"commit measurement-a with receipt msr-a-0001", "committed", "1"),
    ("orchestrator", r"comparison: result of c-a \(41.7 ms\) -> revision 3", "-", "-"),
    ("orchestrator", r"comparison: call c-b \(measurement-b\) -> revision 4", "-", "-"),
    ("orchestrator", r"branch: request \+ call c-b \(measurement-b\) -> revision 2", "-", "-"),
    ("exec-1", r"claim measurement-b -> execute", "pending", "1"),
    ("exec-1", r"submit measurement-b \(effect_ref req-b-1\), then send it", "submitted", "1"),
    ("measure-svc", r"measure prototype B for req-b-1: 38.2 ms", "-", "-"),
    ("exec-1", r"no answer within 0.25 s after submit -> record unknown", "unknown", "1"),
    ("exec-1", r"diagnostics stored as incident inc_\S+", "-", "-"),
    # the composition trace: the unknown-effect branch reopens at revision 2, B ran once, plan: reconcile
    ("orchestrator", r"restart: reopen branch, revision 2: c-b -> reconcile, B ran once", "-", "-"),
    ("exec-1", r"retry measurement-b -> refused: 409 outcome_unknown", "unknown", "1"),
    ("reconciler-1", r"list unknown operations -> measurement-b", "-", "-"),
    ("reconciler-1", r"look up req-b-1 in the measurement service -> found msr-b-0001", "unknown", "1"),
    ("reconciler-1", r"resolve measurement-b as committed, from that evidence", "committed", "1"),
    ("exec-1", r"claim measurement-b again -> reuse_receipt msr-b-0001", "committed", "1"),
    ("orchestrator", r"reopen comparison at revision 4: c-b -> use_receipt msr-b-0001", "-", "-"),
    ("orchestrator", r"comparison: c-b result from its receipt \(38.2 ms\) -> revision 5", "-", "-"),
    # the completed comparison reopens at revision 5, still two executions, answered from restored results
    ("orchestrator", r"reopen comparison at revision 5: settled, 2 executions", "-", "-"),
    ("orchestrator", r"answer from the restored results: B is faster \(38.2 < 41.7 ms\)", "-", "-"),
    ("auditor-1", r"measurement-a history: pending > submitted > committed", "committed", "1"),
    ("auditor-1", r"verify measurement-a: 3 events, ok=True", "committed", "1"),
    ("auditor-1", r"measurement-b history: pending > submitted > unknown > committed", "committed", "1"),
    ("auditor-1", r"verify measurement-b: 4 events, ok=True", "committed", "1"),
    # the approval step (API.md section 15): a charge waits for lead-1's yes; a cancelled run never runs
    ("exec-1", r"claim charge-1 \(payments.charge\) -> 403 approval_required, wait", "-", "-"),
    ("lead-1", r"pending: charge-1 from exec-1 \(note: over the automatic limit\)", "-", "-"),
    ("lead-1", r"approve charge-1", "-", "-"),
    ("exec-1", r"approval came: claim charge-1 -> execute", "pending", "1"),
    ("exec-1", r"charge charge-1 once, commit ch_charge-1", "committed", "1"),
    ("exec-1", r"claim charge-2 -> 403 approval_required, wait", "-", "-"),
    ("exec-1", r"the run is cancelled while charge-2 waits for approval", "-", "-"),
    ("lead-1", r"approve charge-2 \(too late: the run was cancelled\)", "-", "-"),
    ("exec-1", r"charge-2: nothing claimed or charged; its approval stays approved", "-", "-"),
]


def run_demo(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), "demo"], env=env, capture_output=True, text=True, timeout=110)


def test_demo_exits_0_and_prints_the_timeline() -> None:
    result = run_demo(dict(os.environ))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if re.match(r"^\d\d:\d\d:\d\d\.\d{3}  ", line)]
    assert len(rows) == len(EXPECTED_ROWS), result.stdout
    for line, (actor, action, status, attempt) in zip(rows, EXPECTED_ROWS, strict=True):
        pattern = rf"^\S+  {re.escape(actor)}\s+{action}\s+{re.escape(status)}\s+{re.escape(attempt)}$"
        assert re.match(pattern, line), (pattern, line)
    assert "[FAILED]" not in result.stdout
    assert result.stdout.count("[ok]") == 15
    assert result.stdout.rstrip().endswith("result: all 15 expectations held")
    for held in (
        "the run cancelled during its approval wait never executed, and left the approval unconsumed",
        "the unknown-effect branch reopened at revision 2 with B executed once; the plan says reconcile",
        "the completed comparison reopened at revision 5 with the execution count still 2 and the answer"
        " computed from the restored results",
    ):
        assert f"[ok] {held}" in result.stdout


def test_demo_exits_1_when_it_cannot_run() -> None:
    env = {**os.environ, "EFFECT_LEDGER_DATABASE_URL": "postgresql://nobody:nothing@127.0.0.1:9/none"}
    result = run_demo(env)
    assert result.returncode == 1
    assert "demo stopped: " in result.stderr
    assert "[FAILED] the scenario ran to the end" in result.stdout
