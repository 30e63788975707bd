"""Row 7 of the bench: every ratio row is printed, even when its denominator row finished no cycle."""

from __future__ import annotations

from pathlib import Path

from effect_ledger_bench.counters import Window
from effect_ledger_bench.runner import Bench, BenchConfig, Layer


def bench_with(rates: dict[str, int], load: float) -> Bench:
    bench = Bench(BenchConfig(), cluster=None, workdir=Path("."))  # type: ignore[arg-type]
    bench.load_before = load
    for key, cycles in rates.items():
        bench.layers[key] = Layer(
            key, cycles, Window(url="", postmaster=None, seconds=1.0, postgres_cpu=cycles * 0.002)
        )
    return bench


def ratio_rows(bench: Bench) -> dict[str, tuple[str, str]]:
    bench.targets()
    return {row.name: (row.rate, row.target) for row in bench.rows if row.step == "7"}


LAYERS = ("lean", "service", "unbatched", "log_off", "log_on_again", "log_on_third", "log_off_again")


def test_a_denominator_row_with_no_cycle_prints_not_measured_and_says_why() -> None:
    bench = bench_with(dict(zip(LAYERS, (1000, 400, 0, 0, 380, 390, 410), strict=True)), load=0.1)
    rows = ratio_rows(bench)
    assert rows["natural batching: service on / off, cycles/s"] == (
        "not reported",
        "> 1 keeps it: NOT MEASURED",
    )
    assert rows["receipts log: service on / off, cycles/s"] == ("not reported", ">= 0.95: NOT MEASURED")
    assert rows["service / lean yardstick, cycles/s"] == (
        "0.40",
        ">= 0.50: MISS",
    )  # the quiet ones still print
    notes = {row.name: row.notes for row in bench.rows if row.rate == "not reported"}
    assert notes == {
        "natural batching: service on / off, cycles/s": "not measured: the batching-off row finished no cycle",
        "receipts log: service on / off, cycles/s": "not measured: the log-off row finished no cycle",
    }


def test_quiet_run_with_every_row_reports_every_ratio() -> None:
    bench = bench_with(dict(zip(LAYERS, (1000, 600, 300, 620, 580, 590, 610), strict=True)), load=0.1)
    rows = ratio_rows(bench)
    assert rows["natural batching: service on / off, cycles/s"] == ("2.00", "> 1 keeps it: PASS")
    # off, on, on, off: (580 + 590) / 2 against (620 + 610) / 2; the main service row (600) is not one
    assert rows["receipts log: service on / off, cycles/s"] == ("0.95", ">= 0.95: PASS")
    why = [
        row.notes for row in bench.rows if row.name.startswith(("natural batching", "receipts log: service"))
    ]
    assert why == [
        "600 / 300 cycles/s; PostgreSQL 2.00 / 2.00 ms per cycle",
        "585 / 615 cycles/s (rows: off 620, on 580 and 590, off 610); WAL 0 / 0 B per cycle",
    ]


def test_the_log_ratio_is_missed_when_its_on_rows_are_more_than_five_percent_slower() -> None:
    bench = bench_with(dict(zip(LAYERS, (1000, 600, 300, 620, 575, 580, 610), strict=True)), load=0.1)
    assert ratio_rows(bench)["receipts log: service on / off, cycles/s"] == ("0.94", ">= 0.95: MISS")


def test_a_log_on_row_without_cycles_counts_as_zero_not_as_missing() -> None:
    # the log stopped the service in one "on" row: (0 + 600) / 2 against (620 + 610) / 2, not 600 / 615
    bench = bench_with(dict(zip(LAYERS, (1000, 600, 300, 620, 0, 600, 610), strict=True)), load=0.1)
    assert ratio_rows(bench)["receipts log: service on / off, cycles/s"] == ("0.49", ">= 0.95: MISS")


def test_busy_machine_withholds_every_ratio_with_the_reason() -> None:
    bench = bench_with(dict(zip(LAYERS, (1000, 600, 0, 620, 580, 580, 620), strict=True)), load=6.77)
    rows = ratio_rows(bench)
    for name in ("service / lean yardstick, cycles/s", "natural batching: service on / off, cycles/s"):
        assert rows[name][0] == "not reported"
    busy = {row.notes for row in bench.rows if row.rate == "not reported"}
    assert busy == {"busy: load average 6.77 > 1 at the start"}


def test_a_lean_row_without_cycles_or_without_postgresql_cpu_says_which() -> None:
    bench = bench_with(dict(zip(LAYERS, (0, 600, 300, 620, 580, 580, 620), strict=True)), load=0.1)
    rows = ratio_rows(bench)
    assert rows["service / lean yardstick, cycles/s"] == ("not reported", ">= 0.50: NOT MEASURED")
    elsewhere = bench_with(dict(zip(LAYERS, (1000, 600, 300, 620, 580, 580, 620), strict=True)), load=0.1)
    for layer in elsewhere.layers.values():
        layer.window.postgres_cpu = None  # EFFECT_LEDGER_DATABASE_URL: PostgreSQL's processes are not ours
    rows = ratio_rows(elsewhere)
    assert rows["service / lean yardstick, cycles/s"] == ("0.60", ">= 0.50: PASS")
    assert rows["PostgreSQL CPU per cycle, service / lean"] == ("not reported", "<= 1.5: NOT MEASURED")
    notes = {row.name: row.notes for row in bench.rows + elsewhere.rows if row.rate == "not reported"}
    assert notes == {
        "service / lean yardstick, cycles/s": "not measured: the lean yardstick row finished no cycle",
        "PostgreSQL CPU per cycle, service / lean": "not measured: PostgreSQL runs elsewhere, its CPU is not seen",
    }


def test_the_lean_ratios_use_the_mean_of_the_lean_rows_before_and_after_the_service() -> None:
    rates = dict(zip(LAYERS, (1000, 450, 300, 450, 450, 580, 620), strict=True))
    bench = bench_with({**rates, "lean_again": 900}, load=0.1)
    rows = ratio_rows(bench)
    assert rows["service / lean yardstick, cycles/s"] == ("0.47", ">= 0.50: MISS")  # 450 / (1000+900)/2
    notes = {row.name: row.notes for row in bench.rows if row.step == "7"}
    assert notes["service / lean yardstick, cycles/s"] == (
        "450 / 950 cycles/s (mean of 1,000 before and 900 after; 2.00 and 2.00 ms)"
    )
    assert notes["ratios reported"].startswith(
        "load average 0.10 at the start, other load <= 0.00 cores, lean yardstick rows within 1.11 x"
    )


def test_lean_rows_that_drifted_apart_withhold_every_ratio() -> None:
    rates = dict(zip(LAYERS, (1000, 450, 300, 450, 450, 580, 620), strict=True))
    bench = bench_with({**rates, "lean_again": 800}, load=0.1)
    rows = ratio_rows(bench)
    assert rows["service / lean yardstick, cycles/s"] == ("not reported", ">= 0.50: NOT MEASURED")
    assert rows["natural batching: service on / off, cycles/s"] == (
        "not reported",
        "> 1 keeps it: NOT MEASURED",
    )
    assert rows["ratios reported"] == ("no", "")
    why = {row.notes for row in bench.rows if row.rate == "not reported"}
    assert why == {"busy: the lean yardstick rows (before, after) differ 1.25 x (> 1.2)"}


def test_a_service_row_with_a_log_process_prints_its_share_of_the_python() -> None:
    window = Window(url="", postmaster=None, seconds=1.0, postgres_cpu=0.4, python_cpu=0.5, log_cpu=0.05)
    assert "Python 0.50 ms (the log process 0.050 ms), WAL" in window.per_cycle(1000)
    window.log_cpu = None  # no log process (the log off)
    assert "Python 0.50 ms, WAL" in window.per_cycle(1000)


def test_log_off_rows_that_disagree_withhold_the_log_ratio_and_say_why() -> None:
    """The two log-off rows bracket the log-on rows in time: more than LEAN_DRIFT (1.2 x) apart, the
    sitting changed speed within the four rows, and the ratio is not reported (round 34: off 1,487 then
    1,159 in a run whose lean rows agreed, printed as 0.95, PASS). Within it, the ratio stands."""
    drifting = bench_with(dict(zip(LAYERS, (1000, 600, 300, 620, 560, 540, 480), strict=True)), load=0.1)
    rows = ratio_rows(drifting)
    assert rows["receipts log: service on / off, cycles/s"] == ("not reported", ">= 0.95: NOT MEASURED")
    assert rows["service / lean yardstick, cycles/s"] == ("0.60", ">= 0.50: PASS")  # the others stand
    (note,) = [row.notes for row in drifting.rows if row.name == "receipts log: service on / off, cycles/s"]
    assert note.startswith(
        "the log-off rows before and after the log-on rows differ 1.29 x (> 1.2; rows: off 620, on 560 and "
        "540, off 480): the sitting changed speed within them"
    )
    steady = bench_with(dict(zip(LAYERS, (1000, 600, 300, 620, 560, 540, 530), strict=True)), load=0.1)
    assert ratio_rows(steady)["receipts log: service on / off, cycles/s"] == ("0.96", ">= 0.95: PASS")
