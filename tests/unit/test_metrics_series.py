"""http/metrics' shortcuts through prometheus_client's series give the same samples as its public calls."""

from __future__ import annotations

from effect_ledger.domain.model import EventDraft
from effect_ledger.http.metrics import Metrics, _Observation


def _samples(metrics: Metrics, name: str, route: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "route"))): s.value
        for family in metrics.registry.collect()
        if family.name == name
        for s in family.samples
        if s.labels.get("route") == route and not s.name.endswith("_created")
    }


def test_the_latency_observation_counts_as_histogram_observe_on_and_around_every_bound() -> None:
    metrics = Metrics()
    public = metrics.requests.labels("/public", "POST", "2xx")
    shortcut = _Observation(metrics.requests.labels("/shortcut", "POST", "2xx"))
    bounds = [b for b in public._upper_bounds if b != float("inf")]
    values = [0.0, -1.0, 1e-9, 1e6, *bounds, *(b * 0.999999 for b in bounds), *(b * 1.000001 for b in bounds)]
    for value in values:
        public.observe(value)
        shortcut.observe(value)
    name = metrics.requests._name
    expected = _samples(metrics, name, "/public")
    assert expected and _samples(metrics, name, "/shortcut") == expected
    assert shortcut._sum is not None  # the shortcut itself was used, not its public fallback


def test_decisions_count_the_same_series_as_before() -> None:
    metrics = Metrics()
    claimed = (EventDraft("claimed", "p", None, "pending", 1, {}),)
    for _ in range(3):
        metrics.observe("claim", "created", claimed)
    transitions = {
        tuple(sorted(s.labels.items())): s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if family.name == metrics.transitions._name and s.name.endswith("_total")
    }
    assert transitions[(("from_status", "none"), ("to_status", "pending"))] == 3
    claims = {
        tuple(sorted(s.labels.items())): s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if family.name == metrics.claims._name and s.name.endswith("_total")
    }
    assert sum(claims.values()) == 3
