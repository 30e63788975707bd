"""The README walk-through against `effect-ledger serve` started as a subprocess, as outside programs do."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from support.server import free_port

CLI = [sys.executable, "-m", "effect_ledger.cli"]


def start(env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            assert proc.stderr is not None
            with proc.stderr:
                raise AssertionError(f"serve exited early: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("serve did not become ready within 60 s")


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    finally:
        if proc.stderr is not None:
            proc.stderr.close()


def mint(env: dict[str, str], scope: str) -> str:
    out = subprocess.run(
        [*CLI, "token", "--tenant", "acme", "--sub", "exec-1", "--scope", scope],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def postgres_running(data_dir: Path) -> bool:
    return (data_dir / "pgdata" / "postmaster.pid").exists()


@pytest.fixture
def base_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_LEDGER_")}
    env["EFFECT_LEDGER_DATA_DIR"] = str(tmp_path / "data")
    yield env


def walk(port: int, token: str, op: str) -> dict[str, object]:
    h = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=h, timeout=30) as http:
        body = {"tool": "measure", "tool_version": "2.1.0", "intent": {"sensor": "s-1"}}
        claimed = http.post(f"/v1/operations/{op}/claim", json=body)
        assert claimed.status_code == 201, claimed.text
        tok = claimed.json()["claim"]["token"]
        submitted = http.post(f"/v1/operations/{op}/submit", json={"token": tok, "effect_ref": "req-19"})
        assert submitted.status_code == 200 and submitted.json()["status"] == "submitted"
        receipt = {"external_ref": "m-7", "result": {"value": 21.5}}
        done = http.post(
            f"/v1/operations/{op}/complete", json={"token": tok, "outcome": "committed", "receipt": receipt}
        )
        assert done.status_code == 200 and done.json()["status"] == "committed"
        again = http.post(f"/v1/operations/{op}/claim", json=body)
        assert again.status_code == 200 and again.json()["action"] == "reuse_receipt"
        assert again.json()["operation"]["receipt"]["external_ref"] == "m-7"
        assert http.get("/schema/openapi.json").status_code == 200
        return again.json()["operation"]  # type: ignore[no-any-return]


def test_serve_with_configured_secret_walkthrough_and_restart(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    env = {
        **base_env,
        "EFFECT_LEDGER_JWT_SECRET": "walkthrough-secret-0123456789abcdef-0123456789abcdef",
        "EFFECT_LEDGER_JWT_ALGORITHM": "HS256",
    }
    port = free_port()
    proc = start(env, port)
    try:
        first = walk(port, mint(env, "ledger:execute"), "op-walk")
    finally:
        code = stop(proc)
    assert code == 0
    assert not postgres_running(tmp_path / "data"), "stopping serve must stop the embedded PostgreSQL"
    proc = start(env, port)  # a second start reuses the data
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            token = mint(env, "ledger:execute")
            got = http.get("/v1/operations/op-walk", headers={"Authorization": f"Bearer {token}"})
            # the same view; GET also looks the receipt up in the log (log_index, API.md section 14):
            # leaf 0 once the integrator reached it, null before
            assert got.status_code == 200 and got.json()["log_index"] in (0, None)
            assert got.json() == {**first, "log_index": got.json()["log_index"]}
    finally:
        assert stop(proc) == 0


def test_serve_without_jwt_settings_creates_a_development_secret(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    proc = start(base_env, port)
    try:
        assert (tmp_path / "data" / "dev-jwt-secret").stat().st_mode & 0o777 == 0o600
        walk(port, mint(base_env, "ledger:execute"), "op-dev")
    finally:
        assert stop(proc) == 0


async def test_migrate_then_serve_against_an_existing_server(
    base_env: dict[str, str], pg_admin_url: str
) -> None:
    """The second documented start: a superuser URL of a fresh, empty database, `migrate`, then `serve`."""
    import asyncpg

    from support.database import with_database

    admin = await asyncpg.connect(pg_admin_url)
    await admin.execute('DROP DATABASE IF EXISTS "el_external"')
    await admin.execute('CREATE DATABASE "el_external"')
    try:
        env = {
            **base_env,
            "EFFECT_LEDGER_DATABASE_URL": with_database(pg_admin_url, "el_external"),
            "EFFECT_LEDGER_JWT_SECRET": "external-secret-0123456789abcdef-0123456789abcdef",
            "EFFECT_LEDGER_JWT_ALGORITHM": "HS256",
        }
        # -X importtime lists every module imported (on stderr): the first run migrates with Alembic, a
        # second one finds the database at head and leaves Alembic (and SQLAlchemy) unloaded
        for expected in (True, False):
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-X", "importtime", *CLI[1:], "migrate"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            loaded = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
            assert ("alembic" in loaded, "sqlalchemy" in loaded) == (expected, expected)
        port = free_port()
        proc = start(env, port)
        try:
            walk(port, mint(env, "ledger:execute"), "op-external")
            sessions = await admin.fetch(
                "SELECT DISTINCT usename FROM pg_stat_activity"
                " WHERE datname = 'el_external' AND application_name = 'effect-ledger'"
            )
            assert {r["usename"] for r in sessions} <= {"effect_ledger_runtime", "effect_ledger_diag_reader"}
            assert "effect_ledger_runtime" in {r["usename"] for r in sessions}
        finally:
            assert stop(proc) == 0
    finally:
        await admin.execute('DROP DATABASE IF EXISTS "el_external" WITH (FORCE)')
        await admin.close()
