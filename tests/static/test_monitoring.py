"""Static checks of the Grafana dashboard and the PrometheusRule in k8s/base/monitoring.

Which metric names they may use is checked against a real scrape in
tests/integration/test_monitoring_metrics.py; here: structure, wiring and the promised alerts.
"""

from __future__ import annotations

import json
import re

import pytest

from support.k8s_manifests import APP, BUILDS, K8S, build, one

MONITORING = K8S / "base" / "monitoring"
DASHBOARD_FILE = MONITORING / "effect-ledger-dashboard.json"
# The list: unknown outcomes waiting, lease expiries rising, 5xx rate, 429 per route,
# pool saturation (and its consequence, shedding), purge falling behind; and the receipts log's
# refusals, which API.md section 14 says are alerted on.
ALERTS = {
    "EffectLedgerUnknownOutcomeWaiting",
    "EffectLedgerLeaseExpiriesRising",
    "EffectLedgerHigh5xxRate",
    "EffectLedgerRateLimited",
    "EffectLedgerPoolSaturated",
    "EffectLedgerLoadShedding",
    "EffectLedgerPurgeBehind",
    "EffectLedgerLogRefused",
}
builds = pytest.mark.parametrize("name", BUILDS)


def dashboard() -> dict:
    return json.loads(DASHBOARD_FILE.read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def rule_exprs() -> list[str]:
    rule = one("base", "PrometheusRule", APP)
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


def balanced(expr: str) -> bool:
    depth = {"(": 0, "[": 0, "{": 0}
    closing = {")": "(", "]": "[", "}": "{"}
    for ch in expr:
        if ch in depth:
            depth[ch] += 1
        elif ch in closing:
            depth[closing[ch]] -= 1
            if depth[closing[ch]] < 0:
                return False
    return not any(depth.values())


@builds
def test_dashboard_config_map_is_labelled_for_the_grafana_sidecar(name: str) -> None:
    cm = one(name, "ConfigMap", f"{APP}-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["effect-ledger-dashboard.json"]) == dashboard()


def test_dashboard_panels_query_prometheus() -> None:
    board = dashboard()
    assert board["uid"] == "effect-ledger" and board["title"] == "effect-ledger"
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in board["panels"] if p["type"] != "row"]
    assert len(graphs) >= 12
    for panel in graphs:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert balanced(target["expr"]) and "effect_ledger_" in target["expr"], panel["title"]


@builds
def test_prometheus_rule_has_the_promised_alerts(name: str) -> None:
    rule = one(name, "PrometheusRule", APP)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    for r in rules:
        assert set(r) == {"alert", "expr", "for", "labels", "annotations"}, r["alert"]
        assert re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]
        assert r["labels"]["severity"] in ("info", "warning", "critical"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        assert balanced(r["expr"]) and "effect_ledger_" in r["expr"], r["alert"]


def test_no_tenant_labels_in_queries() -> None:
    """/metrics has no tenant data; a query grouping by one would silently show nothing."""
    for expr in dashboard_exprs() + rule_exprs():
        assert not re.search(r"\b(tenant|principal|operation_id)\b", expr), expr


def test_the_rule_file_builds_once_per_build() -> None:
    for name in BUILDS:
        rules = [o for o in build(name) if o["kind"] == "PrometheusRule" and o["metadata"]["name"] == APP]
        assert len(rules) == 1  # the database's own (CloudNativePG metrics): test_k8s_durability.py
