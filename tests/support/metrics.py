"""Reading a Prometheus exposition (/metrics) in assertions."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by name and label set."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def by_label(found: Samples, name: str, label: str) -> dict[str, float]:
    """One counter's values keyed by its single label."""
    return {dict(labels)[label]: value for (n, labels), value in found.items() if n == name}


def metric(text: str, name: str, **labels: str) -> float:
    """One sample's value from an exposition."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    raise KeyError(name, labels)


async def scrape(http: httpx.AsyncClient) -> Samples:
    """Every sample the service's /metrics shows now."""
    return samples((await http.get("/metrics")).text)


async def scraped(http: httpx.AsyncClient, name: str, **labels: str) -> float:
    """One sample's value on the service's /metrics now."""
    return metric((await http.get("/metrics")).text, name, **labels)
