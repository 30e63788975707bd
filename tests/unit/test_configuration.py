"""Settings: validated at start-up with one message per bad value, documented in one generated table."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from effect_ledger.settings import Settings, SettingsError, documentation, variable

ROOT = Path(__file__).resolve().parents[2]


def test_docs_configuration_md_is_generated_from_the_settings() -> None:
    assert (ROOT / "docs" / "configuration.md").read_text() == documentation(), "run `effect-ledger schema`"


def test_every_setting_has_a_row_with_its_variable_flag_and_a_meaning() -> None:
    rows = re.findall(
        r"^\| `(EFFECT_LEDGER_\w+)` \| `(--[a-z-]+)` \| .+ \| .+ \| (.+) \|$", documentation(), re.M
    )
    assert [(v, flag) for v, flag, _ in rows] == [
        (variable(f), "--" + f.name.replace("_", "-")) for f in fields(Settings)
    ]
    assert all(len(meaning.split()) >= 2 for _, _, meaning in rows)


def test_every_bad_value_is_named_at_once() -> None:
    env = {
        "EFFECT_LEDGER_PORT": "eighty",
        "EFFECT_LEDGER_WORKERS": "0",
        "EFFECT_LEDGER_LOG_LEVEL": "loud",
        "EFFECT_LEDGER_BACKGROUND_SWEEP": "maybe",
        "EFFECT_LEDGER_DATABASE_URL": "mysql://x/y",
        "EFFECT_LEDGER_JWT_PUBLIC_KEY_FILE": "/nonexistent/key.pem",
        "EFFECT_LEDGER_POOL_SIZE": "5",
    }
    with pytest.raises(SettingsError) as bad:
        Settings.from_env(env)
    assert bad.value.problems == [
        "EFFECT_LEDGER_PORT (--port) = 'eighty': must be an integer",
        "EFFECT_LEDGER_BACKGROUND_SWEEP (--background-sweep) = 'maybe': must be true or false",
        "EFFECT_LEDGER_DATABASE_URL (--database-url) = 'mysql://x/y': must be a postgresql:// URL",
        "EFFECT_LEDGER_WORKERS (--workers) = 0: must be at least 1",
        "EFFECT_LEDGER_JWT_PUBLIC_KEY_FILE (--jwt-public-key-file) = '/nonexistent/key.pem': must be a readable file",
        "EFFECT_LEDGER_LOG_LEVEL (--log-level) = 'loud': must be one of debug, info, warning, error",
    ]


def test_flags_win_over_variables_and_are_checked_alike() -> None:
    settings = Settings.from_env({"EFFECT_LEDGER_PORT": "9000"}, port=9001, background_sweep="off")
    assert (settings.port, settings.background_sweep) == (9001, False)
    with pytest.raises(SettingsError) as bad:
        Settings.from_env({}, port=70000)
    assert bad.value.problems == ["EFFECT_LEDGER_PORT (--port) = 70000: must be from 1 to 65535"]


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`effect-ledger ARGS` with only these variables set."""
    return subprocess.run(
        [sys.executable, "-m", "effect_ledger.cli", *args],
        env={**env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_prints_the_problems_and_exits_2() -> None:
    run = _cli({"EFFECT_LEDGER_LOG_LEVEL": "loud"}, "serve", "--workers", "0")
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        "effect-ledger: invalid configuration (see docs/configuration.md):",
        "  EFFECT_LEDGER_WORKERS (--workers) = 0: must be at least 1",
        "  EFFECT_LEDGER_LOG_LEVEL (--log-level) = 'loud': must be one of debug, info, warning, error",
    ]


def test_config_prints_values_in_effect_with_secrets_hidden() -> None:
    run = _cli(
        {"EFFECT_LEDGER_DATABASE_URL": "postgresql://owner:pw@db:5432/ledger"},
        "config",
        "--jwt-secret",
        "s3cr3t",
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == len(fields(Settings))
    assert "EFFECT_LEDGER_DATABASE_URL=postgresql://owner:(hidden)@db:5432/ledger" in lines
    assert "EFFECT_LEDGER_JWT_SECRET=(hidden)" in lines and "EFFECT_LEDGER_PORT=8000" in lines
    assert "s3cr3t" not in run.stdout and ":pw@" not in run.stdout


def test_library_code_raises_no_system_exit() -> None:
    offenders = []
    for path in (ROOT / "service").rglob("*.py"):
        if path.name != "cli.py" and re.search(r"raise SystemExit|sys\.exit\(", path.read_text()):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_witnesses_the_log_could_not_use_are_refused_with_the_reason() -> None:
    """LOG_WITNESSES is checked with the other settings, so serve refuses to start and says why,
    instead of failing when the log first reads it; a quorum above the witnesses (which no checkpoint
    could ever meet, so no proof would ever be served) is refused too."""
    from effect_ledger.domain.note import ALG_COSIGNATURE_V1, Signer

    vkey = Signer("witness.example/w1", bytes(range(32)), ALG_COSIGNATURE_V1).verifier.vkey
    good = f'[{{"url": "http://w1", "vkey": "{vkey}"}}]'
    assert Settings(log_witnesses=good, log_witness_quorum=1).log_witnesses == good
    refused = {
        "not json": ({"log_witnesses": "w1"}, "EFFECT_LEDGER_LOG_WITNESSES: Expecting value"),
        "no list": ({"log_witnesses": '{"url": "u"}'}, "must be a JSON list"),
        "no vkey": ({"log_witnesses": '[{"url": "u"}]'}, "must be a JSON list"),
        "bad vkey": ({"log_witnesses": '[{"url": "u", "vkey": "w1+00"}]'}, "a vkey has three parts"),
        "quorum": (
            {"log_witnesses": good, "log_witness_quorum": 2},
            "EFFECT_LEDGER_LOG_WITNESS_QUORUM (2) is more than the 1 witnesses configured",
        ),
    }
    for what, (values, why) in refused.items():
        with pytest.raises(SettingsError) as raised:
            Settings(**values)
        assert why in str(raised.value), what


def test_config_hides_a_password_given_in_the_urls_query() -> None:
    """libpq takes `?password=` too; until round 24 `effect-ledger config` printed it."""
    url = "postgresql://owner@db:5432/ledger?sslmode=require&password=s3cr3t-pw"
    run = _cli({"EFFECT_LEDGER_DATABASE_URL": url}, "config")
    assert run.returncode == 0, run.stderr
    shown = "EFFECT_LEDGER_DATABASE_URL=postgresql://owner@db:5432/ledger?sslmode=require&password=(hidden)"
    assert shown in run.stdout.splitlines() and "s3cr3t-pw" not in run.stdout
