"""`effect-ledger schema`: regenerate (or check) schema/*.sql and *.json, and docs/configuration.md."""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from effect_ledger.settings import Settings, documentation

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = ROOT / "schema"


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of the app as served at /schema/openapi.json."""
    from effect_ledger.http.app import create_app

    app = create_app(Settings(database_url="postgresql://unused/unused"), jwt_secret="unused")  # noqa: S106 - never verifies a token
    document = app.openapi_schema.to_schema()
    assert isinstance(document, dict)
    return document


def render_openapi() -> str:
    """schema/openapi.json's content: stable key order, two-space indent."""
    return json.dumps(openapi_document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def render_ledger_sql_embedded() -> str:
    """Migrate a throwaway embedded database and dump its schema."""
    from effect_ledger.db.embedded import start_embedded, stop_embedded
    from effect_ledger.db.migrate import migrate
    from effect_ledger.db.schema_dump import render_ledger_sql

    with tempfile.TemporaryDirectory(prefix="effect-ledger-schema-") as tmp:
        server, url = start_embedded(Path(tmp))
        try:
            asyncio.run(migrate(Settings(database_url=url)))
            return render_ledger_sql(url)
        finally:
            stop_embedded(server)


def schema_flags(parser: argparse.ArgumentParser) -> None:
    """`effect-ledger schema`'s own flag."""
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1)")


def schema_command(args: argparse.Namespace, settings: Settings) -> int:
    """Write the generated files (with --check: exit 1 if any is stale)."""
    wanted = {
        "schema/ledger.sql": render_ledger_sql_embedded(),
        "schema/openapi.json": render_openapi(),
        "docs/configuration.md": documentation(),
    }
    stale = [
        name
        for name, text in wanted.items()
        if not (ROOT / name).exists() or (ROOT / name).read_text() != text
    ]
    if getattr(args, "check", False):
        for name in stale:
            print(f"{name} is stale; run `effect-ledger schema`")
        return 1 if stale else 0
    for name, text in wanted.items():
        (ROOT / name).parent.mkdir(exist_ok=True)
        (ROOT / name).write_text(text)
        print(f"wrote {name}")
    return 0
