"""Structure the codebase promises: layering, one SQL catalogue, generated schema files up to date."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from effect_ledger.db.catalogue import parse_catalogue, queries

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "service" / "effect_ledger"
BENCH = ROOT / "bench" / "effect_ledger_bench"


def test_layering_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), str(ROOT / "mcp" / "src")]),
    }  # bench, MCP gateway: from source
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "Contracts: " in result.stdout and " broken" in result.stdout
    assert re.search(r"Contracts: \d+ kept, 0 broken", result.stdout)


def test_every_named_query_used_in_code_exists_and_none_is_defined_twice() -> None:
    text = (PACKAGE / "db" / "queries.sql").read_text()
    names = re.findall(r"^-- name: ([a-z_]+)\s*$", text, re.MULTILINE)
    assert len(names) == len(set(names))
    defined = set(queries())
    used = set()
    for path in PACKAGE.rglob("*.py"):
        used |= set(re.findall(r"""\bsql\(\s*["']([a-z_]+)["']\s*\)""", path.read_text()))
    assert used - defined == set()
    assert used, "the catalogue is used"


def test_the_bench_keeps_its_statements_in_its_own_catalogue() -> None:
    from effect_ledger_bench.catalogue import bench_queries

    own = set(bench_queries())
    assert own and all(name.startswith("bench_") for name in own)
    assert not any(name.startswith("bench_") for name in queries()), "bench SQL belongs to the bench"
    used = set()
    for path in BENCH.rglob("*.py"):
        used |= set(re.findall(r"""\bsql\(\s*["']([a-z_]+)["']\s*\)""", path.read_text()))
    assert used - own - set(queries()) == set()
    assert own <= used, "every bench statement is used"


def test_every_query_has_a_purpose_line() -> None:
    for catalogue in (PACKAGE / "db" / "queries.sql", BENCH / "queries.sql"):
        text = catalogue.read_text()
        for match in re.finditer(r"^-- name: ([a-z_]+)\s*\n(.*)$", text, re.MULTILINE):
            assert match.group(2).startswith("-- "), f"query {match.group(1)} lacks a one-line purpose"


def test_catalogue_parser_rejects_duplicates() -> None:
    assert parse_catalogue("-- name: a\nSELECT 1;\n") == {"a": "SELECT 1"}
    try:
        parse_catalogue("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")
    except ValueError as exc:
        assert "twice" in str(exc)
    else:
        raise AssertionError("duplicate names must be refused")


def test_no_sql_is_built_by_string_formatting_outside_the_catalogue() -> None:
    offenders = []
    pattern = re.compile(r"""f["'](?:SELECT|INSERT|UPDATE|DELETE|WITH)\b""", re.IGNORECASE)
    for path in [*PACKAGE.rglob("*.py"), *BENCH.rglob("*.py")]:
        if pattern.search(path.read_text()):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_openapi_json_is_up_to_date() -> None:
    from effect_ledger.schema_cli import render_openapi

    assert (ROOT / "schema" / "openapi.json").read_text() == render_openapi(), "run `effect-ledger schema`"
