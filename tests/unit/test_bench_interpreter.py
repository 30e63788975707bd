"""The bench says which Python serve ran on, and `repeat` can run serve on another one: the build of
the interpreter is a lever of its own (docs/performance.md, round 33)."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import pytest

from effect_ledger_bench.procs import interpreter, libpython_mapped
from effect_ledger_bench.service import SERVE_PYTHON, ServiceProcess, serve_command

SHARED_MAPS = """\
55d4c000-55d4d000 r--p 00000000 fd:01 1234  /root/.pyenv/versions/3.11.7/bin/python3.11
7f10a000-7f10b000 r-xp 00001000 fd:01 5678  /root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0
7f20a000-7f20b000 rw-p 00000000 00:00 0
7f30a000-7f30b000 r--p 00000000 fd:01 9012  /usr/lib/x86_64-linux-gnu/libc.so.6
"""

STATIC_MAPS = """\
55d4c000-55d4d000 r--p 00000000 fd:01 1234  /usr/bin/python3.11
7f20a000-7f20b000 rw-p 00000000 00:00 0
7f30a000-7f30b000 r--p 00000000 fd:01 9012  /usr/lib/x86_64-linux-gnu/libc.so.6
7f40a000-7f40b000 r--p 00000000 fd:01 3456  /usr/lib/python3.11/lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so
"""


def test_a_shared_libpython_is_named_and_an_interpreter_linked_in_is_not() -> None:
    assert libpython_mapped(SHARED_MAPS) == "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0"
    assert libpython_mapped(STATIC_MAPS) is None
    assert libpython_mapped("") is None


def test_the_interpreter_line_names_this_python_and_how_its_libpython_is_linked() -> None:
    line = interpreter()
    assert line.startswith(f"Python {platform.python_version()} ({os.path.realpath(sys.executable)}, ")
    maps = Path("/proc/self/maps").read_text()
    library = libpython_mapped(maps)
    assert line.endswith(f"libpython shared: {library})" if library else "libpython linked in)")


def test_serve_runs_from_the_script_beside_the_interpreter_asked_for(tmp_path: Path) -> None:
    other = tmp_path / "bin"
    other.mkdir()
    (other / "python").touch()
    assert serve_command(str(other / "python")) == [str(other / "python"), "-m", "effect_ledger.cli"]
    (other / "effect-ledger").touch()
    assert serve_command(str(other / "python")) == [str(other / "effect-ledger")]
    beside = Path(sys.executable).parent / "effect-ledger"
    assert beside.exists()  # the test extras install the service's scripts beside this interpreter
    assert serve_command() == [str(beside)]


def test_only_a_variant_chooses_serves_interpreter_and_serve_never_sees_the_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "venv" / "bin"
    other.mkdir(parents=True)
    (other / "effect-ledger").touch()
    variant = ServiceProcess(
        "postgresql://x/y", "s", 1, tmp_path, {SERVE_PYTHON: str(other / "python"), "A": "b"}
    )
    assert variant.command()[:2] == [str(other / "effect-ledger"), "serve"]
    assert SERVE_PYTHON not in variant._env and variant._env["A"] == "b"
    # set in the bench's own environment it is not a variant: the bench's rows run on its title's Python
    monkeypatch.setenv(SERVE_PYTHON, str(other / "python"))
    plain = ServiceProcess("postgresql://x/y", "s", 1, tmp_path)
    assert plain.command()[0] == serve_command()[0] != str(other / "effect-ledger")
