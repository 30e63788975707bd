"""The bench's statements (queries.sql beside this file), then the product's catalogue it measures."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from effect_ledger.db.catalogue import parse_catalogue, queries


@cache
def bench_queries() -> dict[str, str]:
    """The bench's own statements by name (effect_ledger_bench/queries.sql)."""
    return parse_catalogue(files("effect_ledger_bench").joinpath("queries.sql").read_text("utf-8"))


def sql(name: str) -> str:
    """The bench statement called `name`, or else the product's; a KeyError names neither."""
    own = bench_queries()
    return own[name] if name in own else queries()[name]


@cache
def lean_queries() -> dict[str, str]:
    """The lean yardstick's schema and statements (effect_ledger_bench/lean.sql)."""
    return parse_catalogue(files("effect_ledger_bench").joinpath("lean.sql").read_text("utf-8"))
