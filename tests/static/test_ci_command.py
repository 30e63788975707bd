"""The README's test command is what `.ci/run` runs (its main lane), step by step."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_test_command() -> list[str]:
    fenced = (ROOT / "README.md").read_text("utf-8").split("```bash\n", 1)[1].split("```", 1)[0]
    (line,) = [line for line in fenced.splitlines() if line.endswith("pytest")]
    return [step.strip() for step in line.split("&&")]


def _ci_steps() -> list[str]:
    text = (ROOT / ".ci" / "run").read_text("utf-8").replace("\\\n", " ")
    (install,) = [line for line in text.splitlines() if line.startswith("phase python3 -m venv")]
    steps = [
        step.strip().removeprefix("phase ").replace(" -q", "")
        for step in install.split("|| main=$?")[0].split("&&")
    ]
    (test,) = [line.strip() for line in text.splitlines() if re.match(r"\s*phase \.venv/bin/pytest", line)]
    return [re.sub(r"\s+", " ", s) for s in steps] + [test.split("||")[0].removeprefix("phase ").strip()]


def test_the_readme_test_command_is_the_ci_main_lane() -> None:
    assert _readme_test_command() == _ci_steps()


def test_the_test_command_installs_with_uv_into_the_clones_venv() -> None:
    steps = _readme_test_command()
    assert steps[:2] == ["python3 -m venv .venv", ".venv/bin/pip install uv"]
    assert all("--python .venv/bin/python" in s for s in steps if s.startswith(".venv/bin/uv pip install"))


def test_where_pyenv_chooses_python3_both_commands_take_the_systems_optimised_build() -> None:
    # both README commands start with `python3 -m venv`, run in the repository: pyenv's shim (and uv)
    # read .python-version there; `system` is the distribution's interpreter (round 33: Debian's
    # PGO + LTO build spent 12 - 18 % less CPU a request than pyenv's default build)
    assert (ROOT / ".python-version").read_text("ascii") == "system\n"
    fenced = (ROOT / "README.md").read_text("utf-8").split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split(" && ")[0] for line in fenced.splitlines()] == ["python3 -m venv .venv"] * 2
