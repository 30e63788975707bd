"""The bench is apart from the product: `effect-ledger bench` without its extra says how to install it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH_SOURCE = Path(__file__).resolve().parents[2] / "bench"

BLOCKED = """
import sys
sys.modules[{module!r}] = None  # as if not installed
from effect_ledger.cli import main
sys.exit(main(["bench"]))
"""


def _bench_without(module: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKED.format(module=module)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(BENCH_SOURCE)},  # the bench distribution, from its source
    )


def test_bench_without_psutil_says_which_extra_to_install() -> None:
    run = _bench_without("psutil")
    assert run.returncode == 2, run.stderr
    assert (
        run.stderr.strip()
        == "effect-ledger bench needs psutil: pip install effect-ledger-bench (./bench in the repository)"
    )


def test_bench_without_the_bench_package_says_how_to_install_it() -> None:
    run = _bench_without("effect_ledger_bench")
    assert run.returncode == 2, run.stderr
    assert "pip install effect-ledger-bench (./bench in the repository)" in run.stderr


def test_importing_the_product_never_imports_the_bench_nor_the_migration_tools() -> None:
    # the bench is its own distribution; Alembic, SQLAlchemy and psycopg load only to migrate (they were
    # half a second of each serve process's start: db/migrate.head_revision reads the files instead);
    # httpx only to reach witnesses or a remote signer (20 - 45 ms of CPU of each start, round 26)
    unwanted = ("effect_ledger_bench", "alembic", "sqlalchemy", "psycopg", "httpx")
    probe = (
        "import sys, effect_ledger.cli, effect_ledger.http.app;"
        f" print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(unwanted)!r}))"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert run.stdout.strip() == "[]"
