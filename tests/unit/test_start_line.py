"""`serve` says where it listens: one start-up line, for people on a terminal and as JSON otherwise."""

from __future__ import annotations

import json

import pytest

from effect_ledger import __version__
from effect_ledger.cli import _announce, server_of
from effect_ledger.logs import configure_logging
from effect_ledger.settings import Settings

SERVER = "postgresql://owner:s3cr3t@db.internal:5433/ledger?sslmode=require&password=other"


def test_a_configured_server_is_named_without_password_or_options() -> None:
    assert server_of(SERVER) == "postgresql://owner@db.internal:5433/ledger"
    assert server_of("postgresql:///ledger?host=/run/pg") == "postgresql://localhost/ledger"


def test_on_a_terminal_the_line_is_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    configured = Settings(data_dir="/srv/ledger-data", log_format="console")
    ready = Settings(
        database_url="postgresql://postgres@/postgres", port=8123, workers=2, log_format="console"
    )
    _announce(configured, ready)
    assert capsys.readouterr().out == (
        f"effect-ledger {__version__} on http://127.0.0.1:8123 (API docs: http://127.0.0.1:8123/schema), "
        "embedded PostgreSQL in /srv/ledger-data, 2 workers\n"
    )


def test_otherwise_it_is_one_json_record(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "json")
    try:
        configured = Settings(database_url=SERVER, log_format="json")
        _announce(configured, configured)
        record = json.loads(capsys.readouterr().out)
    finally:
        configure_logging("info")
    assert {k: record[k] for k in ("event", "version", "url", "docs", "database", "workers")} == {
        "event": "serving",
        "version": __version__,
        "url": "http://127.0.0.1:8000",
        "docs": "http://127.0.0.1:8000/schema",
        "database": "PostgreSQL at postgresql://owner@db.internal:5433/ledger",
        "workers": 1,
    }
    assert "s3cr3t" not in json.dumps(record)


def test_console_logs_are_rendered_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    import structlog

    configure_logging("info", "console")
    try:
        structlog.get_logger("t").info("hello_people", answer=42)
        out = capsys.readouterr().out
    finally:
        configure_logging("info")
    assert "hello_people" in out and "answer" in out and not out.lstrip().startswith("{")
