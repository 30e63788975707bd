"""The README's configuration table lists every setting, with the default settings.py gives it."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

from effect_ledger.settings import PREFIX, Settings

README = Path(__file__).resolve().parents[2] / "README.md"
ROW = re.compile(r"^\| `(EFFECT_LEDGER_[A-Z0-9_]+)` \| (.+?) \| (.+) \|$")


def documented() -> dict[str, str]:
    """variable -> default cell, from the table under "### Configuration" in "## Operating it"."""
    text = README.read_text()
    section = text.split("\n## Operating it\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("\n### Configuration\n", 1)[1].split("\n### ", 1)[0]
    rows = [ROW.match(line) for line in table.splitlines()]
    return {m.group(1): m.group(2).strip("`") for m in rows if m}


def shown(default: object) -> str:
    if default is None:
        return "—"
    if isinstance(default, bool):
        return "true" if default else "false"
    return str(default)


def test_every_setting_is_in_the_table_with_its_default() -> None:
    table = documented()
    expected = {}
    for f in fields(Settings):
        assert f.default is not MISSING, f.name
        expected[PREFIX + f.name.upper()] = shown(f.default)
    assert table == expected
