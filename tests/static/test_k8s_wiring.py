"""Static checks of how the manifests fit together: settings, batch, capacity, Citus, docs."""

from __future__ import annotations

import re

import pytest

from support.k8s_manifests import (
    APP,
    BUILDS,
    DOCS,
    VERSION_TAG,
    all_containers,
    app_container,
    config_map,
    deployment,
    is_app_workload,
    of_kind,
    one,
    secret_refs,
    selector_matches,
    split_image,
    workloads,
)

DATABASE_SECRET = {
    "base": "effect-ledger-database",
    "overlays/dev": "effect-ledger-database",
    "overlays/prod": "effect-ledger-database",
    "overlays/citus": "effect-ledger-citus-database",
}
CONFIG_KEYS = {
    "EFFECT_LEDGER_HOST",
    "EFFECT_LEDGER_PORT",
    "EFFECT_LEDGER_JWT_ALGORITHM",
    "EFFECT_LEDGER_JWT_PUBLIC_KEY_FILE",
    "EFFECT_LEDGER_JOURNAL_STATE_KEY_FILE",
    "EFFECT_LEDGER_JWT_AUDIENCE",
    "EFFECT_LEDGER_JWT_ISSUER",
    "EFFECT_LEDGER_RETENTION_DAYS",
    "EFFECT_LEDGER_DIAGNOSTICS_RETENTION_DAYS",
    "EFFECT_LEDGER_WORKERS",
    "EFFECT_LEDGER_POOL_SIZE",
    "EFFECT_LEDGER_READER_POOL_SIZE",
    "EFFECT_LEDGER_SHUTDOWN_TIMEOUT_SECONDS",
    "EFFECT_LEDGER_LOG_LEVEL",
    "EFFECT_LEDGER_BACKGROUND_SWEEP",
    "EFFECT_LEDGER_LOG_SIGNER_URL",
}

builds = pytest.mark.parametrize("name", BUILDS)


# --- secrets and settings --------------------------------------------------------------------


@builds
def test_database_urls_come_from_the_overlays_database_secret(name: str) -> None:
    expected = DATABASE_SECRET[name]
    for where, _, container in all_containers(name):
        for env in container.get("env", []):
            if env["name"].endswith("DATABASE_URL"):
                assert env["valueFrom"]["secretKeyRef"]["name"] == expected, where


@builds
def test_every_secret_and_key_is_documented(name: str) -> None:
    docs = DOCS.read_text(encoding="utf-8")
    for secret, key in sorted(secret_refs(name)):
        assert f"`{secret}`" in docs, f"Secret {secret} is not documented in {DOCS.name}"
        assert f"`{key}`" in docs, f"key {key} of Secret {secret} is not documented"


# --- the server ------------------------------------------------------------------------------


@builds
def test_graceful_drain(name: str) -> None:
    spec = deployment(name)["spec"]["template"]["spec"]
    command = app_container(name)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "/bin/sleep"
    shutdown = int(config_map(name)["data"]["EFFECT_LEDGER_SHUTDOWN_TIMEOUT_SECONDS"])
    # Kubernetes kills the pod grace seconds after it starts the preStop hook.
    assert spec["terminationGracePeriodSeconds"] >= int(command[1]) + shutdown + 5


@builds
def test_spread_across_zones_and_hosts(name: str) -> None:
    template = deployment(name)["spec"]["template"]
    constraints = template["spec"]["topologySpreadConstraints"]
    keys = {c["topologyKey"] for c in constraints}
    assert keys == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    for constraint in constraints:
        assert selector_matches(constraint["labelSelector"], template["metadata"]["labels"])


@builds
def test_config_map_settings(name: str) -> None:
    cm = config_map(name)
    data = cm["data"]
    assert set(data) == CONFIG_KEYS
    assert data["EFFECT_LEDGER_HOST"] == "0.0.0.0"  # noqa: S104 -- pods must listen on the pod IP
    assert data["EFFECT_LEDGER_PORT"] == "8000"
    assert data["EFFECT_LEDGER_BACKGROUND_SWEEP"] == "false"
    assert data["EFFECT_LEDGER_JWT_ALGORITHM"] in {"RS256", "ES256"}
    for obj, template in workloads(name):
        if not is_app_workload(obj):
            continue
        spec = template["spec"]
        (container,) = spec["containers"]
        assert container["envFrom"] == [{"configMapRef": {"name": cm["metadata"]["name"]}}]
        if obj["metadata"]["labels"].get("app.kubernetes.io/component") == "log-signer":
            # the signer verifies no JWTs: it mounts its own key and the token it shares with the
            # servers only (tests/static/test_k8s.py)
            assert {v["name"] for v in spec["volumes"]} == {
                "tmp",
                "log-signer-key",
                "log-signer-state",
                "log-signer-token",
            }
            continue
        # Each key file path lies in a read-only mount of a Secret that projects that file (settings
        # check that a configured file is readable, so every workload mounts both).
        for setting in ("EFFECT_LEDGER_JWT_PUBLIC_KEY_FILE", "EFFECT_LEDGER_JOURNAL_STATE_KEY_FILE"):
            key_path = data[setting]
            mount = next(m for m in container["volumeMounts"] if key_path.startswith(m["mountPath"] + "/"))
            assert mount["readOnly"] is True
            volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
            relative = key_path[len(mount["mountPath"]) + 1 :]
            assert [item["path"] for item in volume["secret"]["items"]] == [relative]


# --- batch -----------------------------------------------------------------------------------


@builds
def test_migration_job(name: str) -> None:
    job = one(name, "Job", f"{APP}-migrate")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["migrate"]
    assert "EFFECT_LEDGER_DATABASE_URL" in {e["name"] for e in container["env"]}
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


@builds
def test_sweep_and_purge_cronjobs(name: str) -> None:
    sweep = one(name, "CronJob", f"{APP}-sweep")
    purge = one(name, "CronJob", f"{APP}-purge")
    assert sweep["spec"]["schedule"] == "* * * * *"
    assert re.fullmatch(r"\d{1,2} \d{1,2} \* \* \*", purge["spec"]["schedule"])
    for cron, command in ((sweep, "sweep"), (purge, "purge")):
        assert cron["spec"]["concurrencyPolicy"] == "Forbid"
        (container,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
        assert container["args"] == [command]
        assert "EFFECT_LEDGER_DATABASE_URL" in {e["name"] for e in container["env"]}


# --- database capacity -----------------------------------------------------------------------


def _max_connections(name: str) -> int:
    clusters = of_kind(name, "Cluster")
    if clusters:
        (cluster,) = clusters
        return int(cluster["spec"]["postgresql"]["parameters"]["max_connections"])
    coordinator = one(name, "StatefulSet", "citus-coordinator")
    (container,) = coordinator["spec"]["template"]["spec"]["containers"]
    (setting,) = [a for a in container["args"] if a.startswith("max_connections=")]
    return int(setting.split("=", 1)[1])


@builds
def test_connection_budget_fits_max_connections(name: str) -> None:
    data = config_map(name)["data"]
    hpa = one(name, "HorizontalPodAutoscaler", APP)
    per_process = int(data["EFFECT_LEDGER_POOL_SIZE"]) + int(data["EFFECT_LEDGER_READER_POOL_SIZE"])
    batch_headroom = 10  # migrate, sweep and purge connect directly
    superuser_reserved = 3
    demand = hpa["spec"]["maxReplicas"] * int(data["EFFECT_LEDGER_WORKERS"]) * per_process + batch_headroom
    assert demand <= _max_connections(name) - superuser_reserved


# --- Citus -----------------------------------------------------------------------------------

CITUS = "overlays/citus"


def test_citus_replaces_the_cloudnativepg_cluster() -> None:
    assert of_kind(CITUS, "Cluster") == []
    coordinator = one(CITUS, "StatefulSet", "citus-coordinator")
    workers = one(CITUS, "StatefulSet", "citus-worker")
    assert coordinator["spec"]["replicas"] == 1
    assert workers["spec"]["replicas"] >= 2
    for sts in (coordinator, workers):
        (container,) = sts["spec"]["template"]["spec"]["containers"]
        repo, tag, _ = split_image(container["image"])
        assert repo == "citusdata/citus" and tag is not None and VERSION_TAG.match(tag)
        # the tenant binding (SET LOCAL) must reach the workers' shards (docs/citus.md)
        assert "citus.propagate_set_commands=local" in container["args"]
        service = one(CITUS, "Service", sts["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None"
        assert selector_matches(
            {"matchLabels": service["spec"]["selector"]}, sts["spec"]["template"]["metadata"]["labels"]
        )
        env = {e["name"]: e for e in container["env"]}
        assert env["POSTGRES_DB"]["value"] == "effect_ledger"
        assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "citus-superuser",
            "key": "password",
        }
        assert [v["metadata"]["name"] for v in sts["spec"]["volumeClaimTemplates"]] == ["data"]


def test_citus_node_registration_matches_the_worker_count() -> None:
    job = one(CITUS, "Job", "citus-register-nodes")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert (
        int(env["CITUS_WORKER_COUNT"]["value"])
        == one(CITUS, "StatefulSet", "citus-worker")["spec"]["replicas"]
    )
    (script_cm,) = [
        c for c in of_kind(CITUS, "ConfigMap") if c["metadata"]["name"].startswith("citus-register-nodes-")
    ]
    script = script_cm["data"]["register-nodes.sh"]
    for needle in ("citus_set_coordinator_host", "citus_add_node", "pg_dist_authinfo", "CREATE ROLE"):
        assert needle in script
    (volume,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == script_cm["metadata"]["name"]
