"""The migrations' headers say their own place in the chain: `Revision ID` and `Revises` in each docstring
match `revision` and `down_revision`, and the chain is one line from 0001 to the head."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

VERSIONS = sorted((Path(__file__).resolve().parents[2] / "alembic" / "versions").glob("*.py"))


def _header(path: Path) -> tuple[str | None, str | None, str | None, str | None]:
    """(Revision ID, Revises) from the docstring and (revision, down_revision) from the code."""
    module = ast.parse(path.read_text("utf-8"))
    docstring = ast.get_docstring(module) or ""
    said = [
        re.search(rf"^{label}:[ \t]*(\S*)$", docstring, re.MULTILINE) for label in ("Revision ID", "Revises")
    ]
    values: dict[str, str | None] = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("revision", "down_revision"):
                    values[target.id] = node.value.value
    revision_id, revises = ((m.group(1) or None) if m else None for m in said)
    return revision_id, revises, values.get("revision"), values.get("down_revision")


@pytest.mark.parametrize("path", VERSIONS, ids=[p.name for p in VERSIONS])
def test_the_docstring_names_the_revision_and_its_parent(path: Path) -> None:
    revision_id, revises, revision, down_revision = _header(path)
    assert (revision_id, revises) == (revision, down_revision)
    assert path.name.startswith(f"{revision}_")


def test_the_chain_is_one_line() -> None:
    parents = [_header(path)[3] for path in VERSIONS]
    revisions = [_header(path)[2] for path in VERSIONS]
    assert parents == [None, *revisions[:-1]]


def test_head_revision_read_from_the_files_is_alembics_head() -> None:
    from alembic.script import ScriptDirectory

    from effect_ledger.db.migrate import alembic_config, head_revision

    alembic_head = ScriptDirectory.from_config(alembic_config("postgresql://unused")).get_current_head()
    last = _header(VERSIONS[-1])[2]
    assert head_revision() == alembic_head == last
