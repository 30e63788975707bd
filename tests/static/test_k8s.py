"""Static checks of the kustomize base and overlays: schemas, security policy, wiring."""

from __future__ import annotations

import copy
import re

import kubernetes_validate
import pytest

from support.k8s_manifests import (
    APP,
    APP_IMAGE_REPO,
    APP_UID,
    BASE,
    BUILDS,
    CNPG_BUILDS,
    OVERLAYS,
    VERSION_TAG,
    Obj,
    all_containers,
    app_container,
    build,
    config_map,
    cpu_millis,
    deployment,
    is_app_workload,
    memory_bytes,
    of_kind,
    one,
    selector_matches,
    split_image,
    workloads,
)

K8S_VERSION = "1.30"
# Custom resources: no schema in kubernetes-validate; their fields are checked below.
CRD_KINDS = {
    ("postgresql.cnpg.io/v1", "Cluster"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("postgresql.cnpg.io/v1", "ScheduledBackup"),
    ("barmancloud.cnpg.io/v1", "ObjectStore"),
}  # their fields: CNPG_CLUSTER_FIELDS below and tests/static/test_k8s_durability.py
SECRET_LIKE = re.compile(r"SECRET|PASSWORD|TOKEN|KEY|DATABASE_URL")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
EXPECTED_NAMESPACE = {
    "overlays/dev": "effect-ledger-dev",
    "overlays/prod": "effect-ledger",
    "overlays/citus": "effect-ledger-citus",
}
EXPECTED_REPLICAS = {"base": 3, "overlays/dev": 1, "overlays/prod": 6, "overlays/citus": 3}
DB_POD_LABELS = {
    "base": {"cnpg.io/cluster": "effect-ledger-db"},
    "overlays/dev": {"cnpg.io/cluster": "effect-ledger-db"},
    "overlays/prod": {"cnpg.io/cluster": "effect-ledger-db"},
    "overlays/citus": {"app.kubernetes.io/name": "citus", "app.kubernetes.io/component": "coordinator"},
}
ALLOWED_EGRESS = {("TCP", 5432), ("UDP", 53), ("TCP", 53)}

builds = pytest.mark.parametrize("name", BUILDS)
overlays = pytest.mark.parametrize("name", OVERLAYS)
cnpg_builds = pytest.mark.parametrize("name", CNPG_BUILDS)


# --- schemas -------------------------------------------------------------------------------


def test_kubernetes_validate_offers_the_target_version() -> None:
    assert f"{K8S_VERSION}.0" in kubernetes_validate.utils.all_versions()


@builds
def test_every_builtin_object_validates_strictly(name: str) -> None:
    for obj in build(name):
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue
        # Raises ValidationError (unknown field, wrong type, missing required field) or
        # SchemaNotFoundError (a kind we did not declare as a custom resource).
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == K8S_VERSION


def test_strict_validation_rejects_an_unknown_field() -> None:
    broken = copy.deepcopy(deployment(BASE))
    broken["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True  # typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


@builds
def test_only_declared_custom_resources(name: str) -> None:
    custom = {(o["apiVersion"], o["kind"]) for o in build(name) if "." in o["apiVersion"].split("/")[0]}
    builtin_groups = ("apps", "batch", "policy", "autoscaling", "networking.k8s.io")
    custom = {(api, kind) for api, kind in custom if api.split("/")[0] not in builtin_groups}
    assert custom <= CRD_KINDS


@builds
def test_expected_objects(name: str) -> None:
    names = {(o["kind"], o["metadata"]["name"]) for o in build(name) if o["kind"] != "ConfigMap"}
    expected = {
        ("ServiceAccount", APP),
        ("Deployment", APP),
        ("Service", APP),
        ("HorizontalPodAutoscaler", APP),
        ("PodDisruptionBudget", APP),
        ("NetworkPolicy", f"{APP}-server"),
        ("NetworkPolicy", f"{APP}-batch"),
        ("Job", f"{APP}-migrate"),
        ("CronJob", f"{APP}-sweep"),
        ("CronJob", f"{APP}-purge"),
        ("ServiceMonitor", APP),
        ("PrometheusRule", APP),
        ("Deployment", f"{APP}-log-signer"),
        ("Service", f"{APP}-log-signer"),
        ("NetworkPolicy", f"{APP}-log-signer"),
        ("PersistentVolumeClaim", f"{APP}-log-signer-state"),
    }
    if name in EXPECTED_NAMESPACE:
        expected.add(("Namespace", EXPECTED_NAMESPACE[name]))
    if name == "overlays/citus":
        expected |= {
            ("Service", "citus-coordinator"),
            ("Service", "citus-worker"),
            ("StatefulSet", "citus-coordinator"),
            ("StatefulSet", "citus-worker"),
            ("NetworkPolicy", "citus-coordinator"),
            ("NetworkPolicy", "citus-worker"),
            ("Job", "citus-register-nodes"),
        }
    else:
        expected.add(("Cluster", "effect-ledger-db"))
    if name == "overlays/prod":  # synchronous replication's alerts and continuous backup
        expected |= {
            ("ObjectStore", "effect-ledger-backups"),
            ("ScheduledBackup", "effect-ledger-db-nightly"),
            ("PodMonitor", "effect-ledger-db"),
            ("PrometheusRule", "effect-ledger-database"),
        }
    assert names == expected
    config_map(name)  # exactly one generated effect-ledger ConfigMap


def test_base_has_no_namespace() -> None:
    assert of_kind(BASE, "Namespace") == []
    assert [o["metadata"]["name"] for o in build(BASE) if "namespace" in o["metadata"]] == []


@overlays
def test_overlay_places_everything_in_a_restricted_namespace(name: str) -> None:
    namespace = EXPECTED_NAMESPACE[name]
    (ns,) = of_kind(name, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    others = [o for o in build(name) if o["kind"] != "Namespace"]
    assert {o["metadata"].get("namespace") for o in others} == {namespace}


# --- container security ----------------------------------------------------------------------


@builds
def test_every_container_is_locked_down(name: str) -> None:
    for where, pod_spec, container in all_containers(name):
        pod_sc = pod_spec.get("securityContext", {})
        sc = container.get("securityContext", {})
        assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, where
        uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
        assert isinstance(uid, int) and uid > 0, where
        assert sc.get("readOnlyRootFilesystem") is True, where
        assert sc.get("allowPrivilegeEscalation") is False, where
        assert sc.get("privileged", False) is False, where
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
        assert "add" not in sc.get("capabilities", {}), where
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
        assert seccomp.get("type") == "RuntimeDefault", where
        for host_field in ("hostNetwork", "hostPID", "hostIPC"):
            assert pod_spec.get(host_field, False) is False, where


@builds
def test_app_pods_run_as_the_image_user_with_a_writable_tmp(name: str) -> None:
    for obj, template in workloads(name):
        if not is_app_workload(obj):
            continue
        spec = template["spec"]
        assert spec["securityContext"]["runAsUser"] == APP_UID
        assert spec["serviceAccountName"] == APP
        assert spec["automountServiceAccountToken"] is False
        tmp_volumes = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        for container in spec["containers"]:
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts["/tmp"] in tmp_volumes  # noqa: S108 -- a mount path, not a temp file


@builds
def test_no_pod_mounts_a_service_account_token(name: str) -> None:
    (sa,) = of_kind(name, "ServiceAccount")
    assert sa["automountServiceAccountToken"] is False
    for obj, template in workloads(name):
        assert template["spec"]["automountServiceAccountToken"] is False, obj["metadata"]["name"]


@builds
def test_every_container_has_cpu_and_memory_requests_and_limits(name: str) -> None:
    for where, _, container in all_containers(name):
        resources = container["resources"]
        for bound in ("requests", "limits"):
            assert set(resources[bound]) >= {"cpu", "memory"}, where
        assert cpu_millis(resources["requests"]["cpu"]) <= cpu_millis(resources["limits"]["cpu"]), where
        assert memory_bytes(resources["requests"]["memory"]) <= memory_bytes(resources["limits"]["memory"]), (
            where
        )


@builds
def test_every_image_is_pinned(name: str) -> None:
    images = [(where, c["image"]) for where, _, c in all_containers(name)]
    images += [(f"Cluster/{c['metadata']['name']}", c["spec"]["imageName"]) for c in of_kind(name, "Cluster")]
    assert images
    for where, image in images:
        _, tag, digest = split_image(image)
        assert tag is not None or digest is not None, f"{where}: {image} has neither tag nor digest"
        assert tag != "latest", f"{where}: {image}"
        if tag is not None:
            assert VERSION_TAG.match(tag), f"{where}: {image} is not a version tag"
        if digest is not None:
            assert DIGEST.match(digest), f"{where}: {image}"


@builds
def test_app_image_is_the_release(name: str) -> None:
    for obj, template in workloads(name):
        if is_app_workload(obj):
            for container in template["spec"]["containers"]:
                repo, tag, _ = split_image(container["image"])
                assert (repo, tag) == (APP_IMAGE_REPO, "0.1.0")


# --- secrets ---------------------------------------------------------------------------------


@builds
def test_no_secret_carries_data(name: str) -> None:
    for secret in of_kind(name, "Secret"):
        assert "data" not in secret and "stringData" not in secret, secret["metadata"]["name"]


@builds
def test_secret_like_env_vars_come_from_secret_key_refs(name: str) -> None:
    checked = 0
    for where, _, container in all_containers(name):
        assert all("secretRef" not in source for source in container.get("envFrom", [])), where
        for env in container.get("env", []):
            if SECRET_LIKE.search(env["name"]):
                checked += 1
                if env["name"].endswith("_FILE") and "value" in env:  # a path into a read-only mount
                    assert any(
                        env["value"].startswith(m["mountPath"] + "/") and m.get("readOnly")
                        for m in container.get("volumeMounts", [])
                    ), f"{where}: {env['name']} is not a file of a read-only mount"
                    continue
                assert "value" not in env, f"{where}: {env['name']} has a literal value"
                ref = env["valueFrom"]["secretKeyRef"]
                assert ref["name"] and ref["key"], where
    assert checked > 0


@builds
def test_config_map_holds_no_secrets(name: str) -> None:
    data = config_map(name)["data"]
    for key, value in data.items():
        if SECRET_LIKE.search(key):
            assert key.endswith("_FILE"), f"{key} looks secret; only file paths may sit in a ConfigMap"
        assert not re.search(r"://[^/@\s]*:[^/@\s]*@", value), f"{key} holds credentials"


# --- the server ------------------------------------------------------------------------------


@builds
def test_deployment_replicas(name: str) -> None:
    assert deployment(name)["spec"]["replicas"] == EXPECTED_REPLICAS[name]


@builds
def test_probes(name: str) -> None:
    container = app_container(name)
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert container["args"] == ["serve"]


@builds
def test_service_hpa_and_pdb_target_the_deployment(name: str) -> None:
    dep = deployment(name)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    service = one(name, "Service", APP)
    assert selector_matches({"matchLabels": service["spec"]["selector"]}, pod_labels)
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]
    hpa = one(name, "HorizontalPodAutoscaler", APP)
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": APP}
    assert hpa["spec"]["minReplicas"] == dep["spec"]["replicas"]
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    pdb = one(name, "PodDisruptionBudget", APP)
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["selector"] == dep["spec"]["selector"]
    assert selector_matches(pdb["spec"]["selector"], pod_labels)
    assert pdb["spec"]["maxUnavailable"] == 1


# --- the receipts log's signer ---------------------------------------------------------------


@builds
def test_only_the_log_signer_mounts_the_signing_key(name: str) -> None:
    mounting = []
    for obj, template in workloads(name):
        secrets = {v["secret"]["secretName"] for v in template["spec"].get("volumes", []) if "secret" in v}
        envs = {
            e["valueFrom"]["secretKeyRef"]["name"]
            for c in template["spec"]["containers"]
            for e in c.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})
        }
        if f"{APP}-log-signer-key" in secrets | envs:
            mounting.append(obj["metadata"]["name"])
    assert mounting == [f"{APP}-log-signer"]
    signer = one(name, "Deployment", f"{APP}-log-signer")
    assert signer["spec"]["replicas"] == 1 and signer["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = signer["spec"]["template"]["spec"]["containers"]
    assert (
        container["args"][0] == "log-signer"
        and "--key=/etc/effect-ledger/log-signer/key" in container["args"]
    )
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["log-signer-key"]["readOnly"] is True
    volumes = {v["name"]: v for v in signer["spec"]["template"]["spec"]["volumes"]}
    assert volumes["log-signer-key"]["secret"]["defaultMode"] == 0o400
    state = volumes["log-signer-state"]["persistentVolumeClaim"]["claimName"]
    one(name, "PersistentVolumeClaim", state)  # the state outlives the pod, outside the database
    assert config_map(name)["data"]["EFFECT_LEDGER_LOG_SIGNER_URL"] == f"http://{APP}-log-signer:7380"


@builds
def test_the_signer_token_is_shared_by_the_servers_and_the_signer_only(name: str) -> None:
    """The signer answers only requests carrying the shared token (LOG_SIGNER_TOKEN_FILE): both ends
    mount the one Secret read-only at the path they are told, and no other workload holds it."""
    token_secret = f"{APP}-log-signer-token"
    holders = {}
    for obj, template in workloads(name):
        volumes = [
            v
            for v in template["spec"].get("volumes", [])
            if v.get("secret", {}).get("secretName") == token_secret
        ]
        if volumes:
            holders[obj["metadata"]["name"]] = (template["spec"], volumes[0])
    assert sorted(holders) == [APP, f"{APP}-log-signer"]
    for workload, (spec, volume) in holders.items():
        (container,) = spec["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["readOnly"] is True
        assert [item["path"] for item in volume["secret"]["items"]] == ["token"]
        path = f"{mount['mountPath']}/token"
        if workload == APP:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env["EFFECT_LEDGER_LOG_SIGNER_TOKEN_FILE"] == path
            assert volume["secret"]["defaultMode"] == 0o440
        else:
            assert f"--token-file={path}" in container["args"]
            assert volume["secret"]["defaultMode"] == 0o400
    assert "EFFECT_LEDGER_LOG_SIGNER_TOKEN_FILE" not in config_map(name)["data"]  # not every workload's


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_server_replica_reads_one_journal_key_ring(name: str) -> None:
    """Continuation payloads sealed by one pod must open on another: the key ring is one Secret,
    mounted read-only in the server pods and named by JOURNAL_STATE_KEY_FILE."""
    server = one(name, "Deployment", APP)
    (container,) = server["spec"]["template"]["spec"]["containers"]
    path = config_map(name)["data"]["EFFECT_LEDGER_JOURNAL_STATE_KEY_FILE"]
    assert path == "/etc/effect-ledger/journal/state.keys"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["journal-state-key"] == {
        "name": "journal-state-key",
        "mountPath": "/etc/effect-ledger/journal",
        "readOnly": True,
    }
    volumes = {v["name"]: v for v in server["spec"]["template"]["spec"]["volumes"]}
    secret = volumes["journal-state-key"]["secret"]
    assert secret["secretName"] == f"{APP}-journal-state" and secret["defaultMode"] == 0o440
    assert secret["items"] == [{"key": "state.keys", "path": "state.keys"}]
    assert server["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 10001


# --- network ---------------------------------------------------------------------------------


def _ports(rule: Obj) -> set[tuple[str, int]]:
    return {(p.get("protocol", "TCP"), p["port"]) for p in rule["ports"]}


@builds
def test_egress_allows_only_postgres_and_dns(name: str) -> None:
    policies = [p for p in of_kind(name, "NetworkPolicy") if "Egress" in p["spec"]["policyTypes"]]
    assert {p["metadata"]["name"] for p in policies} == {f"{APP}-server", f"{APP}-batch", f"{APP}-log-signer"}
    signer = one(name, "NetworkPolicy", f"{APP}-log-signer")
    assert "egress" not in signer["spec"]  # the signer (holding the key) reaches nothing at all
    assert signer["spec"]["ingress"] == [
        {
            "from": [
                {
                    "podSelector": {
                        "matchLabels": {
                            "app.kubernetes.io/name": APP,
                            "app.kubernetes.io/component": "server",
                        }
                    }
                }
            ],
            "ports": [{"protocol": "TCP", "port": 7380}],
        }
    ]
    policies.remove(signer)
    for policy in policies:
        rules = policy["spec"]["egress"]
        for rule in rules:
            assert rule["to"] and rule["ports"], "an egress rule without `to` or `ports` allows too much"
        allowed = ALLOWED_EGRESS | (
            {("TCP", 7380)} if policy["metadata"]["name"] == f"{APP}-server" else set()
        )
        assert set().union(*(_ports(r) for r in rules)) == allowed
        if ("TCP", 7380) in allowed:
            (signer_rule,) = [r for r in rules if _ports(r) == {("TCP", 7380)}]
            labels = {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": "log-signer"}
            assert signer_rule["to"] == [{"podSelector": {"matchLabels": labels}}]
        (db_rule,) = [r for r in rules if _ports(r) == {("TCP", 5432)}]
        assert db_rule["to"] == [{"podSelector": {"matchLabels": DB_POD_LABELS[name]}}]
        (dns_rule,) = [r for r in rules if _ports(r) == {("UDP", 53), ("TCP", 53)}]
        assert dns_rule["to"] == [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            }
        ]


@builds
def test_ingress_only_from_clients_and_monitoring(name: str) -> None:
    server = one(name, "NetworkPolicy", f"{APP}-server")
    assert server["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert server["spec"]["ingress"] == [
        {
            "from": [{"podSelector": {"matchLabels": {"effect-ledger/client": "true"}}}],
            "ports": [{"protocol": "TCP", "port": 8000}],
        },
        {
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            "ports": [{"protocol": "TCP", "port": 8000}],
        },
    ]
    batch = one(name, "NetworkPolicy", f"{APP}-batch")
    assert batch["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in batch["spec"]  # no ingress at all


@builds
def test_every_app_pod_is_covered_by_a_network_policy(name: str) -> None:
    policies = of_kind(name, "NetworkPolicy")
    for obj, template in workloads(name):
        labels = template["metadata"]["labels"]
        covering = [p for p in policies if selector_matches(p["spec"]["podSelector"], labels)]
        if is_app_workload(obj):
            assert len(covering) == 1, obj["metadata"]["name"]
            assert covering[0]["spec"]["policyTypes"] == ["Ingress", "Egress"]
        elif obj["kind"] == "StatefulSet":  # Citus nodes: ingress restricted
            assert len(covering) == 1, obj["metadata"]["name"]


# --- custom resources ------------------------------------------------------------------------

# Fields of CloudNativePG's ClusterSpec and RoleConfiguration (postgresql.cnpg.io/v1); an
# unknown key here is a typo the operator would reject.
CNPG_CLUSTER_FIELDS = {
    "description", "inheritedMetadata", "imageName", "imageCatalogRef", "imagePullPolicy",
    "schedulerName", "postgresUID", "postgresGID", "instances", "minSyncReplicas",
    "maxSyncReplicas", "postgresql", "replicationSlots", "bootstrap", "replica",
    "superuserSecret", "enableSuperuserAccess", "certificates", "imagePullSecrets", "storage",
    "serviceAccountTemplate", "walStorage", "ephemeralVolumeSource", "startDelay", "stopDelay",
    "smartShutdownTimeout", "switchoverDelay", "failoverDelay", "livenessProbeTimeout",
    "affinity", "topologySpreadConstraints", "resources", "ephemeralVolumesSizeLimit",
    "priorityClassName", "primaryUpdateStrategy", "primaryUpdateMethod", "backup",
    "nodeMaintenanceWindow", "monitoring", "externalClusters", "logLevel",
    "projectedVolumeTemplate", "env", "envFrom", "managed", "seccompProfile", "tablespaces",
    "enablePDB", "plugins", "probes",
}  # fmt: skip
CNPG_ROLE_FIELDS = {
    "name", "comment", "ensure", "login", "superuser", "createdb", "createrole", "inherit",
    "replication", "bypassrls", "connectionLimit", "validUntil", "inRoles", "passwordSecret",
    "disablePassword",
}  # fmt: skip
EXPECTED_INSTANCES = {"base": 3, "overlays/dev": 1, "overlays/prod": 3}


@cnpg_builds
def test_cloudnativepg_cluster(name: str) -> None:
    cluster = one(name, "Cluster", "effect-ledger-db")
    assert cluster["apiVersion"] == "postgresql.cnpg.io/v1"
    spec = cluster["spec"]
    assert set(spec) <= CNPG_CLUSTER_FIELDS
    assert spec["instances"] == EXPECTED_INSTANCES[name]
    assert spec["enableSuperuserAccess"] is False
    assert memory_bytes(spec["storage"]["size"]) > 0
    assert spec["bootstrap"]["initdb"]["database"] == "effect_ledger"
    assert spec["bootstrap"]["initdb"]["owner"] == "effect_ledger"
    assert spec["bootstrap"]["initdb"]["secret"]["name"] == "effect-ledger-db-owner"
    for bound in ("requests", "limits"):
        assert set(spec["resources"][bound]) >= {"cpu", "memory"}
    roles = {role["name"]: role for role in spec["managed"]["roles"]}
    assert set(roles) == {"effect_ledger_runtime", "effect_ledger_diag_reader"}
    for role in roles.values():
        assert set(role) <= CNPG_ROLE_FIELDS
        assert role["ensure"] == "present"
        assert role["login"] is True
        assert role["superuser"] is False
        assert role["bypassrls"] is False
        assert role["createrole"] is False
        assert role["inherit"] is False  # as the migration would create it (NOINHERIT)
    assert roles["effect_ledger_runtime"]["passwordSecret"] == {"name": "effect-ledger-db-runtime"}
    assert roles["effect_ledger_diag_reader"]["passwordSecret"] == {"name": "effect-ledger-db-diag-reader"}
    # The NetworkPolicies' database selector names this cluster.
    assert DB_POD_LABELS[name] == {"cnpg.io/cluster": cluster["metadata"]["name"]}


@builds
def test_service_monitor_scrapes_metrics(name: str) -> None:
    monitor = one(name, "ServiceMonitor", APP)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = one(name, "Service", APP)
    assert selector_matches(monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] == "http"
    assert endpoint["path"] == "/metrics"
    assert re.fullmatch(r"\d+s", endpoint["interval"])
