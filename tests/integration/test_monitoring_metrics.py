"""Every metric name in the Grafana dashboard and the alert rules is one the service exports:
scraped from a real app's /metrics, so a renamed metric cannot leave a panel or an alert blank."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from effect_ledger.settings import Settings
from support.server import Service

MONITORING = Path(__file__).resolve().parents[2] / "k8s" / "base" / "monitoring"
NAME = re.compile(r"\beffect_ledger_[a-z0-9_]+")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}


def used_names() -> dict[str, set[str]]:
    board = json.loads((MONITORING / "effect-ledger-dashboard.json").read_text())
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    used: dict[str, set[str]] = {}
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            for name in NAME.findall(target["expr"]):
                used.setdefault(name, set()).add(f"dashboard: {panel['title']}")
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            for name in NAME.findall(r["expr"]):
                used.setdefault(name, set()).add(f"alert: {r['alert']}")
    return used


async def test_dashboard_and_alerts_use_only_exported_metrics(settings: Settings) -> None:
    async with Service(settings) as service, httpx.AsyncClient(base_url=service.base_url) as http:
        assert (await http.get("/livez")).status_code == 200
        text = (await http.get("/metrics")).text
    exported = {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in SUFFIXES.get(family.type, ("",))
    }
    used = used_names()
    assert len(used) >= 12
    missing = {name: sorted(where) for name, where in used.items() if name not in exported}
    assert missing == {}
    # and the overload metrics this issue added are among those watched
    for name in (
        "effect_ledger_rate_limited_total",
        "effect_ledger_db_pool_shed_total",
        "effect_ledger_db_pool_waiting",
        "effect_ledger_claim_attempts_total",
        "effect_ledger_unknown_outcome_oldest_age_seconds",
        "effect_ledger_purge_overdue_seconds",
    ):
        assert name in used, name
