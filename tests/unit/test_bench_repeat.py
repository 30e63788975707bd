"""bench's repeat tool: PostgreSQL's processes told apart by their titles, as ps shows them, and
the sampler that adds up their CPU."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import time

import psutil  # type: ignore[import-untyped]
import pytest

from effect_ledger_bench.repeat import (
    Figures,
    Sampler,
    bracketed,
    comparison,
    kind_of,
    log_on,
    parse_variant,
)
from effect_ledger_bench.stats import ratio_interval


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
        # with cluster_name set, the name comes first
        ("postgres: main: checkpointer", "auxiliary"),
        ("postgres: main: autovacuum worker effect_ledger_repeat", "autovacuum"),
        ("postgres: main: effect_ledger_runtime effect_ledger_repeat 127.0.0.1(51234) idle", "backend"),
    ],
)
def test_each_process_title_gets_its_kind(title: str, kind: str) -> None:
    assert kind_of(title.split()) == kind


def test_the_sampler_counts_a_child_process_cpu_from_the_sample_that_first_sees_it() -> None:
    # A parent of its own (this process may have other children: xdist, the suite's early jobs) starts
    # one child, which idles first (the sampler sees it before it works), burns 0.5 s of its own CPU,
    # then idles again so that a sample reads its final time before it ends.
    burn = (
        "import time\n"
        "time.sleep(0.5)\n"
        "start = time.process_time()\n"
        "while time.process_time() - start < 0.5:\n"
        "    pass\n"
        "time.sleep(1.0)\n"
    )
    parent_code = (
        "import subprocess, sys, time\n"
        "time.sleep(0.3)\n"
        f"sys.exit(subprocess.call([sys.executable, '-c', {burn!r}]))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    sampler = Sampler(parent.pid)
    sampler.start()
    try:
        assert parent.wait(timeout=30) == 0
        spent = sampler.take()
    finally:
        sampler.stop()
    # the 0.5 s it burned, plus at most its interpreter's start-up (before the first sample that saw
    # it, not counted) and the idle waits
    assert 0.45 <= spent["other"] <= 0.65, dict(spent)
    assert set(spent) <= {"other"}


def test_a_variant_is_an_environment_and_a_pair_without_a_key_or_equals_sign_is_refused() -> None:
    assert parse_variant(["LOG_ENABLED=false", "A=b=c", "EMPTY="]) == {
        "LOG_ENABLED": "false",
        "A": "b=c",
        "EMPTY": "",
    }
    for bad in ("LOG_ENABLED", "=x"):
        with pytest.raises(SystemExit, match="KEY=VALUE"):
            parse_variant([bad])


def _exec_done(children: list[psutil.Process], title: str) -> bool:
    try:
        return len(children) == 1 and " ".join(children[0].cmdline()).startswith(title)
    except psutil.NoSuchProcess:
        return False


def test_a_named_backend_is_counted_under_its_application_name() -> None:
    # the child's title reads like a client backend's; the sampler is told its application_name
    title = "postgres: effect_ledger_runtime effect_ledger_repeat 127.0.0.1(51234) idle"
    parent_code = (
        "import subprocess, sys\n"
        f"sys.exit(subprocess.call(['bash', '-c', 'exec -a \"{title}\" sleep 1.5']))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        deadline = time.monotonic() + 10
        while not _exec_done(children := psutil.Process(parent.pid).children(), title):
            assert time.monotonic() < deadline, [c.cmdline() for c in children]
            time.sleep(0.05)
        assert len(children) == 1
        # sampled only once the child carries its title: forked and not yet exec'd (python, then bash),
        # its title is another's and the sampler rightly counts it under "other" (a race CI met)
        sampler = Sampler(parent.pid)
        sampler.name_backends({children[0].pid: "effect-ledger-maintenance"})
        sampler.start()
        try:
            assert parent.wait(timeout=30) == 0
            spent = sampler.take()
        finally:
            sampler.stop()
    finally:
        parent.kill()
        parent.wait()
    assert set(spent) == {"backend effect-ledger-maintenance"}, dict(spent)


def test_a_round_has_the_log_on_as_serve_would_read_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EFFECT_LEDGER_LOG_ENABLED", raising=False)
    assert log_on({}) and log_on({"EFFECT_LEDGER_WORKERS": "2"})
    for off in ("false", "no", "0", "off", "False"):
        assert not log_on({"EFFECT_LEDGER_LOG_ENABLED": off}), off
    monkeypatch.setenv("EFFECT_LEDGER_LOG_ENABLED", "off")  # serve inherits this process's environment
    assert not log_on({}) and log_on({"EFFECT_LEDGER_LOG_ENABLED": "true"})


def test_alternating_rounds_are_summed_up_side_by_side() -> None:
    # round 30's first sitting: the log on (base) and off (the variant), its first four pairs
    base = [Figures(1375, 183, 48), Figures(1328, 189, 51), Figures(1359, 185, 49), Figures(1280, 193, 52)]
    variant = [Figures(1217, 200, 0), Figures(1351, 176, 0), Figures(1557, 157, 0), Figures(1388, 167, 0)]
    assert comparison(base, variant) == (
        "summary: base 1,336, variant 1,378 cycles/s on the means (4 + 4 rounds); base / variant 0.969"
        " (variant / base 1.032); pairs 0.87 - 1.13 (median 0.953); bracketed 0.978, 95 % interval 0.698 -"
        " 1.371 (3 variant rounds between base rounds); serve's worker 170.8 / 175.0 us a request; its log"
        " process 48 - 52 / 0 - 0 us a cycle"
    )


def test_an_odd_round_count_pairs_what_it_can_and_a_lone_side_is_said() -> None:
    base = [Figures(1000, 200, 60), Figures(1100, 190, 60), Figures(900, 210, 60)]
    variant = [Figures(1000, 180, 0), Figures(1000, 180, 0)]
    line = comparison(base, variant)
    assert "base 1,000, variant 1,000 cycles/s on the means (3 + 2 rounds); base / variant 1.000" in line
    assert "pairs 1.00 - 1.10 (median 1.050)" in line
    assert "bracketed 1.025, 95 % interval" in line  # 1,050 / 1,000 and 1,000 / 1,000
    assert comparison(base, []) == "summary: no variant rounds to compare"
    assert "bracketed: too few rounds for an interval" in comparison(base[:2], variant[:1])


def test_a_steady_drift_moves_every_pair_and_not_the_bracketed_ratio() -> None:
    # the same code on both sides while the sitting slows by 100 cycles/s a round: each pair (a base
    # round, then the variant round after it) reads 1.07 - 1.14, the bracketed ratio exactly 1
    rates = [1600 - 100 * k for k in range(10)]
    base = [Figures(r, 200, 50) for r in rates[0::2]]
    variant = [Figures(r, 200, 50) for r in rates[1::2]]
    assert bracketed(base, variant) == [1.0, 1.0, 1.0, 1.0]
    line = comparison(base, variant)
    assert "pairs 1.07 - 1.14" in line
    assert "bracketed 1.000, 95 % interval 1.000 - 1.000 (4 variant rounds between base rounds)" in line


def test_the_interval_is_students_t_on_the_logarithms_of_the_ratios() -> None:
    # logarithms -0.1, 0, 0.1: mean 0, standard deviation 0.1, t(2) = 4.303; half-width 4.303 * 0.1 / sqrt(3)
    ratio, low, high = ratio_interval([math.exp(-0.1), 1.0, math.exp(0.1)])
    assert ratio == pytest.approx(1.0)
    assert (low, high) == (pytest.approx(0.780021, abs=1e-6), pytest.approx(1.282016, abs=1e-6))
    # forty ratios: past the table, t is taken as 2.0
    _, low, high = ratio_interval([math.exp(0.1), math.exp(-0.1)] * 20)
    half = 2.0 * statistics.stdev([0.1, -0.1] * 20) / math.sqrt(40)
    assert (low, high) == (pytest.approx(math.exp(-half)), pytest.approx(math.exp(half)))
    with pytest.raises(ValueError):
        ratio_interval([1.0])
