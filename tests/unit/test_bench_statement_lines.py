"""repeat --statements' printed lines: the total counts top-level statements only (a function's nested
statements run inside its call), and entries under 1 % of it are left out."""

from __future__ import annotations

from effect_ledger_bench.statements import QUERY_CHARS, Statement, one_line, report


def test_the_total_is_the_top_level_statements_and_small_ones_are_left_out() -> None:
    entries = [
        Statement(True, 1.0, 300.0, 1.0, 20.0, 1500.0, "SELECT claim()"),
        Statement(False, 1.0, 100.0, 1.0, 5.0, 700.0, "INSERT INTO t"),
        Statement(True, 0.02, 99.0, 3.0, 8.0, 0.0, "SELECT chains"),
        Statement(True, 1.0, 3.9, 1.0, 0.0, 0.0, "SELECT tiny"),  # 0.98 % of 402.9
    ]
    lines = report(entries)
    assert lines == [
        "  statements per cycle (pg_stat_statements): top-level 402.9 us of execution, 1,500 WAL B; 3 of 4 shown",
        "       300.0 us   1.000 calls    1.00 rows    20.0 buffers    1500 WAL B  SELECT claim()",
        "       100.0 us   1.000 calls    1.00 rows     5.0 buffers     700 WAL B  INSERT INTO t (nested)",
        "        99.0 us   0.020 calls    3.00 rows     8.0 buffers       0 WAL B  SELECT chains",
    ]


def test_a_statement_is_one_line_cut_to_its_width() -> None:
    assert one_line("SELECT a,\n       b\n  FROM t") == "SELECT a, b FROM t"
    long = "SELECT " + "x, " * 100
    cut = one_line(long)
    assert len(cut) == QUERY_CHARS and cut.endswith("…") and cut.startswith("SELECT x, x,")
