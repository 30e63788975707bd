"""Lint and types are part of the test run, so `.ci/run` (the README's test command) fails on them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support import early

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / command[0]), *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=280
    )


def test_ruff_check() -> None:
    run = _run("ruff", "check", "--no-cache", "service", "bench", "mcp", "tests")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def test_ruff_format() -> None:
    run = _run("ruff", "format", "--check", "--no-cache", "service", "bench", "mcp", "tests")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


@pytest.mark.timeout(300)
def test_mypy_strict() -> None:
    run = early.finished("mypy", early.MYPY, timeout=300)  # started with the run, niced (support/early.py)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert run.stdout.startswith("Success: no issues found")
