"""Helpers for the static Kubernetes tests: build a kustomization, walk pods and containers."""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
DOCS = ROOT / "docs" / "operating-k8s.md"

BASE = "base"
OVERLAYS = ("overlays/dev", "overlays/prod", "overlays/citus")
BUILDS = (BASE, *OVERLAYS)
CNPG_BUILDS = ("base", "overlays/dev", "overlays/prod")

APP = "effect-ledger"
APP_IMAGE_REPO = "ghcr.io/effect-ledger/effect-ledger"
APP_UID = 10001
# A release version (1.2.3, v1.2, 16.4, 1.2.3-rc.1), never `latest` or a branch name.
VERSION_TAG = re.compile(r"^v?\d+\.\d+(\.\d+)?([-.][0-9A-Za-z.-]+)?$")

Obj = dict[str, Any]

# Kinds with a pod template, and where that template sits.
_POD_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


@functools.cache
def build(name: str) -> tuple[Obj, ...]:
    """All objects of `kubectl kustomize k8s/<name>`, in output order."""
    result = subprocess.run(
        ["kubectl", "kustomize", str(K8S / name)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, f"kubectl kustomize k8s/{name} failed:\n{result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc is not None)


def of_kind(name: str, kind: str) -> list[Obj]:
    """Objects of one kind in a build."""
    return [obj for obj in build(name) if obj["kind"] == kind]


def one(name: str, kind: str, obj_name: str) -> Obj:
    """The single object of that kind and name; fails if absent or duplicated."""
    found = [obj for obj in of_kind(name, kind) if obj["metadata"]["name"] == obj_name]
    assert len(found) == 1, f"{name}: expected exactly one {kind}/{obj_name}, found {len(found)}"
    return found[0]


def config_map(name: str) -> Obj:
    """The generated effect-ledger ConfigMap (its name carries a content hash)."""
    found = [cm for cm in of_kind(name, "ConfigMap") if cm["metadata"]["name"].startswith(f"{APP}-config-")]
    assert len(found) == 1, f"{name}: expected one {APP}-config-<hash> ConfigMap, found {len(found)}"
    return found[0]


def deployment(name: str) -> Obj:
    """The effect-ledger Deployment of a build."""
    return one(name, "Deployment", APP)


def app_container(name: str) -> Obj:
    """The single container of the effect-ledger Deployment."""
    (container,) = deployment(name)["spec"]["template"]["spec"]["containers"]
    return container


def pod_template(obj: Obj) -> Obj | None:
    """The pod template of a workload, or None for other kinds."""
    path = _POD_TEMPLATE_PATHS.get(obj["kind"])
    if path is None:
        return None
    node: Any = obj
    for key in path:
        node = node[key]
    return node


def workloads(name: str) -> Iterator[tuple[Obj, Obj]]:
    """(workload, pod template) for every object that runs pods."""
    for obj in build(name):
        template = pod_template(obj)
        if template is not None:
            yield obj, template


def containers(pod_spec: Obj) -> list[Obj]:
    """Init, regular and ephemeral containers of a pod spec."""
    return [
        *pod_spec.get("initContainers", []),
        *pod_spec["containers"],
        *pod_spec.get("ephemeralContainers", []),
    ]


def all_containers(name: str) -> Iterator[tuple[str, Obj, Obj]]:
    """(`Kind/name/container`, pod spec, container) for every container in a build."""
    for obj, template in workloads(name):
        for container in containers(template["spec"]):
            yield f"{obj['kind']}/{obj['metadata']['name']}/{container['name']}", template["spec"], container


def is_app_workload(obj: Obj) -> bool:
    """Workloads that run the effect-ledger image (server, migrate, sweep, purge)."""
    return obj["metadata"]["labels"].get("app.kubernetes.io/name") == APP


def selector_matches(selector: Obj, labels: dict[str, str]) -> bool:
    """Kubernetes LabelSelector semantics (matchLabels + matchExpressions)."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def split_image(image: str) -> tuple[str, str | None, str | None]:
    """(repository, tag, digest) of an image reference."""
    digest = None
    if "@" in image:
        image, digest = image.split("@", 1)
    tag = None
    last_slash = image.rfind("/")
    last_colon = image.rfind(":")
    if last_colon > last_slash:
        image, tag = image[:last_colon], image[last_colon + 1 :]
    return image, tag, digest


_CPU = re.compile(r"^(\d+(?:\.\d+)?)(m?)$")
_MEM = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|K|M|G|T)?$")
_MEM_FACTOR = {
    None: 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def cpu_millis(quantity: str | int | float) -> float:
    """CPU quantity in millicores."""
    match = _CPU.match(str(quantity))
    assert match, f"unparseable cpu quantity {quantity!r}"
    value = float(match.group(1))
    return value if match.group(2) == "m" else value * 1000


def memory_bytes(quantity: str | int) -> int:
    """Memory quantity in bytes."""
    match = _MEM.match(str(quantity))
    assert match, f"unparseable memory quantity {quantity!r}"
    return int(float(match.group(1)) * _MEM_FACTOR[match.group(2)])


def secret_refs(name: str) -> set[tuple[str, str]]:
    """Every (Secret name, key) the manifests of a build expect to exist."""
    refs: set[tuple[str, str]] = set()
    for _, _, container in all_containers(name):
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs.add((ref["name"], ref["key"]))
    for _, template in workloads(name):
        for volume in template["spec"].get("volumes", []):
            if "secret" in volume:
                for item in volume["secret"].get("items", []):
                    refs.add((volume["secret"]["secretName"], item["key"]))
    for cluster in of_kind(name, "Cluster"):
        initdb = cluster["spec"]["bootstrap"]["initdb"]
        refs.update({(initdb["secret"]["name"], "username"), (initdb["secret"]["name"], "password")})
        for role in cluster["spec"]["managed"]["roles"]:
            refs.update(
                {(role["passwordSecret"]["name"], "username"), (role["passwordSecret"]["name"], "password")}
            )
    return refs
