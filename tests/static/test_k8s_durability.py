"""The production overlay keeps an acknowledged transition through the loss of the primary.

docs/api.md section 11: synchronous replication (`synchronous_commit = on`, a synchronous standby),
continuous backup (WAL archived to object storage, a scheduled base backup), a restore procedure,
alerts for a missing synchronous standby and replication lag. kubernetes-validate has no schemas
for custom resources, so the CloudNativePG objects are validated here against JSON Schemas of the
fields this project uses, transcribed from the CRDs of CloudNativePG 1.27 (api/v1:
SynchronousReplicaConfiguration, PluginConfiguration, MonitoringConfiguration, ScheduledBackupSpec)
and of the Barman Cloud plugin (barmancloud.cnpg.io/v1 ObjectStoreSpec): unknown fields and
values outside their enumerations fail, as the API server would refuse them.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import pytest
import yaml

from support.k8s_manifests import DOCS, build, of_kind, one

PROD = "overlays/prod"
CNPG_VERSION = "1.27"  # the CloudNativePG release these manifests are written for (docs/operating-k8s.md)
BARMAN_PLUGIN = "barman-cloud.cloudnative-pg.io"
SECRET_REF = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "key"],
    "properties": {"name": {"type": "string"}, "key": {"type": "string"}},
}
SYNCHRONOUS = {
    "type": "object",
    "additionalProperties": False,
    "required": ["method", "number"],
    "properties": {
        "method": {"enum": ["any", "first"]},
        "number": {"type": "integer", "minimum": 1},
        "maxStandbyNamesFromCluster": {"type": "integer", "minimum": 0},
        "standbyNamesPre": {"type": "array", "items": {"type": "string"}},
        "standbyNamesPost": {"type": "array", "items": {"type": "string"}},
        "dataDurability": {"enum": ["required", "preferred"]},
        "failoverQuorum": {"type": "boolean"},
    },
}
PLUGINS = {
    "type": "array",
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {
            "name": {"type": "string"},
            "enabled": {"type": "boolean"},
            "isWALArchiver": {"type": "boolean"},
            "parameters": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    },
}
MONITORING = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "customQueriesConfigMap": {"type": "array", "items": SECRET_REF},
        "customQueriesSecret": {"type": "array", "items": SECRET_REF},
        "disableDefaultQueries": {"type": "boolean"},
        "enablePodMonitor": {"type": "boolean"},
        "tls": {"type": "object"},
        "podMonitorMetricRelabelings": {"type": "array"},
        "podMonitorRelabelings": {"type": "array"},
    },
}
SCHEDULED_BACKUP = {
    "type": "object",
    "additionalProperties": False,
    "required": ["schedule", "cluster"],
    "properties": {
        "schedule": {"type": "string"},
        "suspend": {"type": "boolean"},
        "immediate": {"type": "boolean"},
        "backupOwnerReference": {"enum": ["none", "self", "cluster"]},
        "cluster": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {"name": {"type": "string"}},
        },
        "target": {"enum": ["primary", "prefer-standby"]},
        "method": {"enum": ["barmanObjectStore", "volumeSnapshot", "plugin"]},
        "pluginConfiguration": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}},
        },
        "online": {"type": "boolean"},
        "onlineConfiguration": {"type": "object"},
    },
}
COMPRESSION = {"enum": ["bzip2", "gzip", "lz4", "snappy", "xz", "zstd"]}
OBJECT_STORE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["configuration"],
    "properties": {
        "retentionPolicy": {"type": "string", "pattern": "^[1-9][0-9]*[dwm]$"},
        "instanceSidecarConfiguration": {"type": "object"},
        "configuration": {
            "type": "object",
            "additionalProperties": False,
            "required": ["destinationPath"],
            "not": {"required": ["serverName"]},  # the plugin forbids it here (a Cluster parameter)
            "properties": {
                "destinationPath": {"type": "string", "pattern": "^(s3|gs|https?)://"},
                "endpointURL": {"type": "string"},
                "endpointCA": SECRET_REF,
                "s3Credentials": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "accessKeyId": SECRET_REF,
                        "secretAccessKey": SECRET_REF,
                        "region": SECRET_REF,
                        "sessionToken": SECRET_REF,
                        "inheritFromIAMRole": {"type": "boolean"},
                    },
                },
                "azureCredentials": {"type": "object"},
                "googleCredentials": {"type": "object"},
                "wal": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "compression": COMPRESSION,
                        "encryption": {"enum": ["AES256", "aws:kms"]},
                        "maxParallel": {"type": "integer", "minimum": 1},
                        "archiveAdditionalCommandArgs": {"type": "array"},
                        "restoreAdditionalCommandArgs": {"type": "array"},
                    },
                },
                "data": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "compression": COMPRESSION,
                        "encryption": {"enum": ["AES256", "aws:kms"]},
                        "jobs": {"type": "integer", "minimum": 1},
                        "immediateCheckpoint": {"type": "boolean"},
                        "additionalCommandArgs": {"type": "array"},
                    },
                },
                "tags": {"type": "object"},
                "historyTags": {"type": "object"},
            },
        },
    },
}


def cluster() -> dict[str, Any]:
    return one(PROD, "Cluster", "effect-ledger-db")


def test_the_cloudnativepg_objects_match_their_api() -> None:
    spec = cluster()["spec"]
    jsonschema.validate(spec["postgresql"]["synchronous"], SYNCHRONOUS)
    jsonschema.validate(spec["plugins"], PLUGINS)
    jsonschema.validate(spec["monitoring"], MONITORING)
    for backup in of_kind(PROD, "ScheduledBackup"):
        assert backup["apiVersion"] == "postgresql.cnpg.io/v1"
        jsonschema.validate(backup["spec"], SCHEDULED_BACKUP)
    for store in of_kind(PROD, "ObjectStore"):
        assert store["apiVersion"] == "barmancloud.cnpg.io/v1"
        jsonschema.validate(store["spec"], OBJECT_STORE)


@pytest.mark.parametrize(
    ("schema", "broken"),
    [
        (SYNCHRONOUS, {"method": "any", "number": 1, "dataDurabilty": "required"}),  # typo
        (SYNCHRONOUS, {"method": "quorum", "number": 1}),
        (SCHEDULED_BACKUP, {"schedule": "0 0 3 * * *", "cluster": {"name": "x"}, "method": "barman"}),
        (OBJECT_STORE, {"configuration": {"destinationPath": "s3://b", "serverName": "x"}}),
        (OBJECT_STORE, {"configuration": {"destinationPath": "s3://b"}, "retentionPolicy": "30 days"}),
    ],
)
def test_the_schemas_refuse_what_the_api_server_would(schema: dict[str, Any], broken: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_prod_commits_wait_for_a_synchronous_standby() -> None:
    spec = cluster()["spec"]
    assert spec["postgresql"]["synchronous"] == {"method": "any", "number": 1, "dataDurability": "required"}
    assert spec["postgresql"]["parameters"]["synchronous_commit"] == "on"
    # the deprecated pair would also drive synchronous_standby_names, and relax durability when replicas fail
    assert "minSyncReplicas" not in spec and "maxSyncReplicas" not in spec
    assert spec["instances"] >= spec["postgresql"]["synchronous"]["number"] + 2  # one can fail, writes go on
    assert spec["affinity"]["podAntiAffinityType"] == "required"


def test_only_prod_promises_synchronous_replication() -> None:
    """The base (3 instances) and dev (1) stay asynchronous; the docs say what that risks."""
    for name in ("base", "overlays/dev"):
        spec = one(name, "Cluster", "effect-ledger-db")["spec"]
        assert "synchronous" not in spec["postgresql"], name
    text = DOCS.read_text()
    assert "asynchronous" in text and "lost `committed` makes its operation ID executable again" in text


def test_prod_archives_wal_and_takes_a_nightly_base_backup() -> None:
    spec = cluster()["spec"]
    (plugin,) = [p for p in spec["plugins"] if p["name"] == BARMAN_PLUGIN]
    assert plugin["isWALArchiver"] is True
    store = one(PROD, "ObjectStore", plugin["parameters"]["barmanObjectName"])
    configuration = store["spec"]["configuration"]
    assert configuration["destinationPath"].startswith("s3://")
    assert {ref["name"] for ref in configuration["s3Credentials"].values()} == {"effect-ledger-backup-s3"}
    assert store["spec"]["retentionPolicy"] == "30d"
    (backup,) = of_kind(PROD, "ScheduledBackup")
    assert backup["spec"]["cluster"]["name"] == cluster()["metadata"]["name"]
    assert backup["spec"]["method"] == "plugin"
    assert backup["spec"]["pluginConfiguration"]["name"] == BARMAN_PLUGIN
    assert len(backup["spec"]["schedule"].split()) == 6  # CloudNativePG's cron has a seconds field
    assert backup["spec"]["immediate"] is True  # a base backup exists from day one
    assert backup["metadata"].get("namespace", "effect-ledger") == cluster()["metadata"].get("namespace")


def test_the_backup_secret_and_the_restore_procedure_are_documented() -> None:
    text = DOCS.read_text()
    assert "`effect-ledger-backup-s3`" in text and "`ACCESS_KEY_ID`" in text and "`ACCESS_SECRET_KEY`" in text
    assert f"CloudNativePG {CNPG_VERSION}" in text
    section = text[text.index("## Backup and restore") :]
    restore = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))  # type: ignore[union-attr]
    assert restore["kind"] == "Cluster" and restore["metadata"]["name"] != "effect-ledger-db"
    recovery = restore["spec"]["bootstrap"]["recovery"]
    assert recovery["recoveryTarget"]["targetTime"]
    (source,) = restore["spec"]["externalClusters"]
    assert source["name"] == recovery["source"]
    assert source["plugin"]["name"] == BARMAN_PLUGIN
    assert source["plugin"]["parameters"] == {
        "barmanObjectName": "effect-ledger-backups",
        "serverName": "effect-ledger-db",
    }
    assert "restore point" in section and "executable again" in section


def _rules() -> dict[str, dict[str, Any]]:
    rule = one(PROD, "PrometheusRule", "effect-ledger-database")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_alerts_for_a_missing_synchronous_standby_and_replication_lag() -> None:
    rules = _rules()
    assert {"EffectLedgerNoSynchronousStandby", "EffectLedgerReplicationLagging"} <= set(rules)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert re.fullmatch(r"\d+m", rule["for"]), name
        # CloudNativePG's metrics only (the service's own are in the PrometheusRule effect-ledger)
        metrics = set(re.findall(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", rule["expr"]))
        assert metrics and all(m.startswith("cnpg_") for m in metrics), (name, metrics)
    assert rules["EffectLedgerNoSynchronousStandby"]["labels"]["severity"] == "critical"
    assert "cnpg_pg_replication_lag" in rules["EffectLedgerReplicationLagging"]["expr"]


def test_the_synchronous_standby_metric_comes_from_the_clusters_custom_query() -> None:
    (reference,) = cluster()["spec"]["monitoring"]["customQueriesConfigMap"]
    config = one(PROD, "ConfigMap", reference["name"])
    assert "cnpg.io/reload" in config["metadata"]["labels"]  # CloudNativePG reloads it on change
    queries = yaml.safe_load(config["data"][reference["key"]])
    exported = {
        f"cnpg_{query}_{metric}"
        for query, body in queries.items()
        for entry in body["metrics"]
        for metric in entry
    }
    assert "cnpg_effect_ledger_replication_sync_standbys" in exported
    assert (
        "cnpg_effect_ledger_replication_sync_standbys" in _rules()["EffectLedgerNoSynchronousStandby"]["expr"]
    )
    monitor = one(PROD, "PodMonitor", "effect-ledger-db")
    assert monitor["spec"]["selector"]["matchLabels"] == {"cnpg.io/cluster": "effect-ledger-db"}
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]


def test_the_monitoring_config_map_validates_strictly() -> None:
    import kubernetes_validate

    config = copy.deepcopy(one(PROD, "ConfigMap", "effect-ledger-db-monitoring"))
    assert kubernetes_validate.validate(config, "1.30", strict=True) == "1.30"
    assert all(obj["kind"] != "Secret" for obj in build(PROD))
