"""The named query catalogue (queries.sql), loaded once, in the manner of procrastinate's sql/queries.sql."""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files

_NAME = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)


def parse_catalogue(text: str) -> dict[str, str]:
    """Split catalogue text into {name: statement}; each name must appear once."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.strip().splitlines() if not line.startswith("--")]
        statement = "\n".join(lines).strip().rstrip(";")
        if name in queries:
            raise ValueError(f"query {name} is defined twice")
        queries[name] = statement
    return queries


@cache
def queries() -> dict[str, str]:
    """All statements of db/queries.sql by name."""
    return parse_catalogue(files("effect_ledger.db").joinpath("queries.sql").read_text("utf-8"))


def sql(name: str) -> str:
    """The statement called `name`; a KeyError names a query that does not exist."""
    return queries()[name]
