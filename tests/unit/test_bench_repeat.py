"""bench's repeat tool: PostgreSQL's processes told apart by their titles, as ps shows them."""

from __future__ import annotations

import pytest

from effect_ledger_bench.repeat import kind_of


@pytest.mark.parametrize(
    ("title", "kind"),
    [
        ("postgres: autovacuum worker effect_ledger_repeat", "autovacuum"),
        ("postgres: autovacuum launcher", "auxiliary"),
        ("postgres: checkpointer", "auxiliary"),
        ("postgres: walwriter", "auxiliary"),
        ("postgres: background writer", "auxiliary"),
        ("postgres: logical replication launcher", "auxiliary"),
        ("postgres: io worker 0", "auxiliary"),
        ("postgres: effect_ledger_runtime effect_ledger_repeat 127.0.0.1(51234) idle", "backend"),
        ("postgres: postgres effect_ledger_repeat 127.0.0.1(40000) SELECT", "backend"),
        ("/usr/lib/postgresql/15/bin/postgres -D /tmp/data", "other"),
        ("postgres: stats", "other"),
    ],
)
def test_each_process_title_gets_its_kind(title: str, kind: str) -> None:
    assert kind_of(title.split()) == kind
