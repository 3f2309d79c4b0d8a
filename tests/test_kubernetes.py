"""The Kubernetes manifests (``deploy/kubernetes``) keep what docs/kubernetes.md promises.

Each kustomization is rendered here, in Python, by the part of kustomize it uses (resources,
components, strategic-merge and JSON patches, a ConfigMap generator, images), so that the fast
lane checks the manifests without a tool. ``.ci/kubernetes-check`` renders them with the real
kustomize (``kubectl kustomize``), validates the API schemas, lints them, and runs this module
again with ``KUBERNETES_RENDERED`` naming its renderings: every invariant then holds of what
``kubectl apply -k`` would send as well.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).parents[1]
DEPLOY = ROOT / "deploy" / "kubernetes"

Obj = dict[str, Any]
#: libyaml's loader where PyYAML has it: the pure-Python one takes most of this module's time.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load(text: str) -> Any:
    return yaml.load(text, Loader=_LOADER)  # a safe loader (CSafeLoader or SafeLoader)


def _load_all(text: str) -> list[Any]:
    return [
        o for o in yaml.load_all(text, Loader=_LOADER) if o
    ]  # a safe loader (CSafeLoader or SafeLoader)


# --- Rendering (the part of kustomize these manifests use) ------------------------------------

#: Lists a strategic-merge patch merges item by item, by this key (kustomize's patchMergeKey).
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}


def _identity(obj: Obj) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def _merge(base: Any, patch: Any, key: str = "") -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for name, value in patch.items():
            merged[name] = _merge(base[name], value, name) if name in base else value
        return merged
    if isinstance(base, list) and isinstance(patch, list) and key in _MERGE_KEYS:
        by = _MERGE_KEYS[key]
        merged_list = list(base)
        for item in patch:
            found = [i for i, old in enumerate(merged_list) if old.get(by) == item.get(by)]
            if found:
                merged_list[found[0]] = _merge(merged_list[found[0]], item)
            else:
                merged_list.append(item)
        return merged_list
    return patch


def _json_patch(obj: Obj, operations: list[Obj]) -> None:
    for operation in operations:
        *parents, last = operation["path"].strip("/").split("/")
        node: Any = obj
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        value = copy.deepcopy(operation.get("value"))
        if operation["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        elif isinstance(node, list) and operation["op"] == "add":
            node.insert(len(node) if last == "-" else int(last), value)
        elif operation["op"] in ("add", "replace"):
            node[int(last) if isinstance(node, list) else last] = value
        else:
            raise ValueError(f"unsupported JSON patch operation {operation!r}")


def _matches(obj: Obj, target: Obj) -> bool:
    kind, namespace, name = _identity(obj)
    wanted = {"kind": kind, "namespace": namespace, "name": name}
    return all(wanted.get(field) == value for field, value in target.items())


def _apply_patch(objects: list[Obj], directory: Path, patch: Obj) -> None:
    content = _load((directory / patch["path"]).read_text())
    if isinstance(content, list):
        targets = [o for o in objects if _matches(o, patch["target"])]
        assert targets, f"{directory}: {patch['path']} patches nothing"
        for obj in targets:
            _json_patch(obj, content)
        return
    identity = _identity(content)
    for index, obj in enumerate(objects):
        if _identity(obj) == identity:
            objects[index] = _merge(obj, content)
            return
    raise AssertionError(f"{directory}: {patch['path']} patches nothing")


def _set_images(objects: list[Obj], images: list[Obj]) -> None:
    for spec in _pod_specs(objects):
        for container in _containers(spec):
            name = re.split(r"[:@]", container["image"])[0]
            for image in images:
                if image["name"] == name:
                    new = str(image.get("newName", name))
                    tag = f"@{image['digest']}" if "digest" in image else f":{image['newTag']}"
                    container["image"] = new + tag


def render(directory: Path) -> list[Obj]:
    """The objects a kustomization (or a component) makes, as ``kubectl kustomize`` would
    (but for generated names, which keep no hash suffix here)."""
    kustomization = _load((directory / "kustomization.yaml").read_text())
    objects: list[Obj] = []
    for resource in kustomization.get("resources", []):
        path = directory / resource
        if path.is_dir():
            objects += render(path)
        else:
            objects += _load_all(path.read_text())
    for generator in kustomization.get("configMapGenerator", []):
        data = {Path(f).name: (directory / f).read_text() for f in generator["files"]}
        meta = {"name": generator["name"], "namespace": generator["namespace"]}
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    for component in kustomization.get("components", []):
        objects = _with_component(objects, directory / component)
    for patch in kustomization.get("patches", []):
        _apply_patch(objects, directory, patch)
    _set_images(objects, kustomization.get("images", []))
    return objects


def _with_component(objects: list[Obj], directory: Path) -> list[Obj]:
    component = _load((directory / "kustomization.yaml").read_text())
    assert component["kind"] == "Component", directory
    objects = copy.deepcopy(objects)
    for patch in component.get("patches", []):
        _apply_patch(objects, directory, patch)
    return objects


def _base_with_components() -> list[Obj]:
    objects = render(DEPLOY / "base")
    for name in ("prometheus-adapter", "apparmor-localhost"):
        objects = _with_component(objects, DEPLOY / "components" / name)
    return objects


#: What is rendered, by the name of the real rendering .ci/kubernetes-check writes.
TARGETS: dict[str, Callable[[], list[Obj]]] = {
    "base": lambda: render(DEPLOY / "base"),
    "overlays-snekbox": lambda: render(DEPLOY / "overlays" / "snekbox"),
    "overlays-packages": lambda: render(DEPLOY / "overlays" / "packages"),
    "node-setup": lambda: render(DEPLOY / "node-setup"),
    "with-components": _base_with_components,
}
#: The targets that deploy the gateway and an evaluation service.
STACKS = ("base", "overlays-snekbox", "overlays-packages", "with-components")
#: Those whose evaluation service is the built-in evaluator.
BUILTIN = ("base", "overlays-packages", "with-components")


def _sources() -> Iterator[tuple[str, Callable[[str], list[Obj]]]]:
    yield "python", lambda target: TARGETS[target]()
    rendered = os.environ.get("KUBERNETES_RENDERED")
    if rendered:

        def real(target: str) -> list[Obj]:
            return _load_all((Path(rendered) / f"{target}.yaml").read_text())

        yield "kustomize", real


SOURCES = dict(_sources())


def _cases(targets: tuple[str, ...]) -> list[Any]:
    return [
        pytest.param(source, target, id=f"{source}-{target}")
        for source in SOURCES
        for target in targets
    ]


@functools.cache
def _rendered(source: str, target: str) -> list[Obj]:
    return SOURCES[source](target)


def _objects(source: str, target: str) -> list[Obj]:
    """The objects of ``target`` as ``source`` renders it (each test gets its own copy)."""
    return copy.deepcopy(_rendered(source, target))


# --- Reading the objects ------------------------------------------------------------------------

_WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet")


def _pod_specs(objects: list[Obj]) -> Iterator[Obj]:
    for obj in objects:
        if obj["kind"] in _WORKLOADS:
            yield obj["spec"]["template"]["spec"]


def _containers(spec: Obj) -> list[Obj]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def _one(objects: list[Obj], kind: str, name: str, namespace: str | None = None) -> Obj:
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and o["metadata"]["name"] == name
        and namespace in (None, o["metadata"].get("namespace"))
    ]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _env(container: Obj) -> dict[str, Obj]:
    return {item["name"]: item for item in container.get("env", [])}


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


GATEWAY_NS = "python-mcp-server"
SANDBOX_NS = "python-mcp-server-sandbox"
GATEWAY = {"app.kubernetes.io/name": "python-mcp-server", "app.kubernetes.io/component": "gateway"}
EVALUATOR = {**GATEWAY, "app.kubernetes.io/component": "evaluator"}


def _gateway(objects: list[Obj]) -> tuple[Obj, Obj]:
    deployment = _one(objects, "Deployment", "gateway", GATEWAY_NS)
    return deployment, deployment["spec"]["template"]["spec"]["containers"][0]


# --- The gateway --------------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "target"), _cases(STACKS))
def test_the_gateway_runs_two_replicas_or_more(source: str, target: str) -> None:
    objects = _objects(source, target)
    deployment, _ = _gateway(objects)
    assert deployment["spec"]["replicas"] >= 2
    autoscaler = _one(objects, "HorizontalPodAutoscaler", "gateway", GATEWAY_NS)
    assert autoscaler["spec"]["scaleTargetRef"]["name"] == "gateway"
    assert autoscaler["spec"]["minReplicas"] >= 2
    budget = _one(objects, "PodDisruptionBudget", "gateway", GATEWAY_NS)
    assert _selects(budget["spec"]["selector"]["matchLabels"], GATEWAY)
    assert budget["spec"]["minAvailable"] >= 1


@pytest.mark.parametrize(("source", "target"), _cases(STACKS))
def test_the_gateways_secrets_come_from_a_secret(source: str, target: str) -> None:
    deployment, container = _gateway(_objects(source, target))
    env = _env(container)
    for name in ("MCP_AUTH_TOKEN", "MCP_AUTH_TOKENS", "MCP_SESSION_SECRET"):
        assert "value" not in env.get(name, {}), f"{name} is written in the manifest"
    assert env["MCP_SESSION_SECRET"]["valueFrom"]["secretKeyRef"]["key"]
    assert env.get("MCP_ALLOW_UNAUTHENTICATED", {}).get("value", "false") == "false"
    # The tokens: a file in a mounted Secret.
    tokens = Path(env["MCP_AUTH_TOKENS_FILE"]["value"])
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == tokens.parent]
    assert len(mounts) == 1 and mounts[0]["readOnly"]
    assert "secret" in volumes[mounts[0]["name"]]


@pytest.mark.parametrize(("source", "target"), _cases(STACKS))
def test_the_gateway_is_probed_on_healthz_and_readyz(source: str, target: str) -> None:
    deployment, container = _gateway(_objects(source, target))
    port = int(_env(container)["MCP_PORT"]["value"])
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert named.get(get["port"], get["port"]) == port
    spec = deployment["spec"]["template"]["spec"]
    # The gateways at their fewest can fill the evaluators' slots at their most.
    objects = _objects(source, target)
    gateways = _one(objects, "HorizontalPodAutoscaler", "gateway", GATEWAY_NS)["spec"]
    evaluators = _one(objects, "HorizontalPodAutoscaler", "evaluator", SANDBOX_NS)["spec"]
    evaluator = _one(objects, "Deployment", "evaluator", SANDBOX_NS)["spec"]["template"]["spec"]
    slots = int(evaluator["containers"][0]["resources"]["limits"]["cpu"])
    in_flight = int(_env(container)["MCP_MAX_IN_FLIGHT"]["value"])
    assert in_flight * gateways["minReplicas"] >= slots * evaluators["maxReplicas"]
    grace = int(_env(container)["MCP_SHUTDOWN_GRACE"]["value"])
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert spec["terminationGracePeriodSeconds"] > grace + pause


# --- Every workload -----------------------------------------------------------------------------

#: Workloads that may not meet the common rules, and the one they are excused (each also
#: carries the linter's exceptions, with reasons: test_every_linter_exception_says_why).
_PRIVILEGED = {("overlays-snekbox", "evaluator")}  # NsJail needs a privileged container
_ROOT = {("node-setup", "seccomp-installer")}  # writes into the node's kubelet directory


@pytest.mark.parametrize(("source", "target"), _cases(tuple(TARGETS)))
def test_every_container_is_bounded_and_holds_no_privilege(source: str, target: str) -> None:
    workloads = [o for o in _objects(source, target) if o["kind"] in _WORKLOADS]
    assert workloads
    for workload in workloads:
        name = workload["metadata"]["name"]
        spec = workload["spec"]["template"]["spec"]
        assert spec.get("automountServiceAccountToken") is False, name
        assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), name
        for container in _containers(spec):
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][kind]), (name, kind)
            context = container.get("securityContext", {})
            if (target, name) in _PRIVILEGED:
                assert context == {"privileged": True}
                continue
            assert context["privileged"] is False, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name
            non_root = context.get("runAsNonRoot", spec["securityContext"].get("runAsNonRoot"))
            assert non_root is ((target, name) not in _ROOT), name


@pytest.mark.parametrize(("source", "target"), _cases(STACKS))
def test_the_gateways_namespace_is_restricted(source: str, target: str) -> None:
    namespace = _one(_objects(source, target), "Namespace", GATEWAY_NS)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    spec = _gateway(_objects(source, target))[0]["spec"]["template"]["spec"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["securityContext"]["runAsUser"] != 0


# --- The evaluation service ---------------------------------------------------------------------


@pytest.mark.parametrize(("source", "target"), _cases(STACKS))
def test_snekbox_url_names_the_headless_service(source: str, target: str) -> None:
    objects = _objects(source, target)
    _, container = _gateway(objects)
    url = urlsplit(_env(container)["SNEKBOX_URL"]["value"])
    assert url.scheme == "http"  # the gateway balances and pins only over http://
    name, namespace, *rest = (url.hostname or "").split(".")
    assert rest in (["svc"], ["svc", "cluster", "local"])
    service = _one(objects, "Service", name, namespace)
    assert service["spec"]["clusterIP"] == "None"
    assert not service["spec"].get("publishNotReadyAddresses", False)
    assert url.port in [p["port"] for p in service["spec"]["ports"]]
    assert service["spec"]["selector"] == EVALUATOR
    deployment = _one(objects, "Deployment", "evaluator", namespace)
    assert _selects(
        service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"]
    )
    budget = _one(objects, "PodDisruptionBudget", "evaluator", namespace)
    assert budget["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize(("source", "target"), _cases(BUILTIN))
def test_the_evaluator_gets_exactly_what_its_sandboxes_need(source: str, target: str) -> None:
    objects = _objects(source, target)
    deployment = _one(objects, "Deployment", "evaluator", SANDBOX_NS)
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    context = container["securityContext"]
    assert spec["hostUsers"] is False
    assert context["procMount"] == "Unmasked"
    assert spec["securityContext"]["runAsNonRoot"] is True
    profile = spec["securityContext"]["seccompProfile"]
    assert profile["type"] == "Localhost"
    # The profile node-setup installs, under the kubelet's seccomp directory.
    installer = _one(_objects("python", "node-setup"), "DaemonSet", "seccomp-installer")
    script = installer["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    host = installer["spec"]["template"]["spec"]["volumes"][1]["hostPath"]["path"]
    assert host == "/var/lib/kubelet/seccomp"
    assert '"/host-seccomp/python-mcp-server"' in script and "evaluator-seccomp.json" in script
    assert profile["localhostProfile"] == "python-mcp-server/evaluator-seccomp.json"
    # Runs at once: the pod's CPUs (the default would count the node's).
    env = _env(container)
    assert int(env["EVALUATOR_CONCURRENCY"]["value"]) == int(
        container["resources"]["limits"]["cpu"]
    )
    # Baseline from policy 1.35: the first to admit procMount Unmasked in a user namespace.
    labels = _one(objects, "Namespace", SANDBOX_NS)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    version = labels["pod-security.kubernetes.io/enforce-version"]
    assert version == "latest" or tuple(map(int, version[1:].split("."))) >= (1, 35)
    # Scaling in waits out an idle session's timeout: a removed pod loses its interpreters.
    autoscaler = _one(objects, "HorizontalPodAutoscaler", "evaluator", SANDBOX_NS)
    window = autoscaler["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
    assert window >= int(env["EVALUATOR_SESSION_IDLE_TIMEOUT"]["value"])


def test_the_snekbox_variant_is_privileged_in_a_privileged_namespace() -> None:
    objects = render(DEPLOY / "overlays" / "snekbox")
    spec = _one(objects, "Deployment", "evaluator", SANDBOX_NS)["spec"]["template"]["spec"]
    assert [c["image"].split(":")[0] for c in spec["containers"]] == ["python-mcp-server-snekbox"]
    assert "hostUsers" not in spec and "seccompProfile" not in spec["securityContext"]
    labels = _one(objects, "Namespace", SANDBOX_NS)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    config = _one(objects, "ConfigMap", "snekbox-config", SANDBOX_NS)
    assert config["data"]["snekbox.cfg"] == (ROOT / "docker/snekbox/snekbox.cfg").read_text()


def test_the_copies_of_the_docker_files_are_equal() -> None:
    pairs = [
        ("node-setup/evaluator-seccomp.json", "docker/evaluator-seccomp.json"),
        ("overlays/snekbox/snekbox.cfg", "docker/snekbox/snekbox.cfg"),
    ]
    for copy_path, original in pairs:
        assert (DEPLOY / copy_path).read_bytes() == (ROOT / original).read_bytes(), (
            f"{original} changed: cp {original} deploy/kubernetes/{copy_path}"
        )


# --- Network policies ---------------------------------------------------------------------------


def _policies(objects: list[Obj], namespace: str, labels: dict[str, str]) -> list[Obj]:
    return [
        o["spec"]
        for o in objects
        if o["kind"] == "NetworkPolicy"
        and o["metadata"]["namespace"] == namespace
        and all(
            labels.get(k) == v for k, v in o["spec"]["podSelector"].get("matchLabels", {}).items()
        )
    ]


def _peer_is(peer: Obj, namespace: str, labels: dict[str, str]) -> bool:
    return bool(
        peer.get("namespaceSelector", {}).get("matchLabels")
        == {"kubernetes.io/metadata.name": namespace}
        and peer.get("podSelector", {}).get("matchLabels") == labels
    )


_DNS = {"k8s-app": "kube-dns"}


def _rules(policies: list[Obj], direction: str) -> list[Obj]:
    kind = direction.capitalize()
    return [r for p in policies if kind in p["policyTypes"] for r in p.get(direction, [])]


@pytest.mark.parametrize(("source", "target"), _cases(STACKS))
def test_network_policies_deny_all_but_the_designs_paths(source: str, target: str) -> None:
    objects = _objects(source, target)
    for namespace in (GATEWAY_NS, SANDBOX_NS):
        default = [p for p in _policies(objects, namespace, {}) if p["podSelector"] == {}]
        assert default == [{"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}]
    evaluator = _policies(objects, SANDBOX_NS, EVALUATOR)
    # Evaluators: reached only by the gateways, on the service's port.
    ingress = _rules(evaluator, "ingress")
    assert ingress
    for rule in ingress:
        assert all(_peer_is(peer, GATEWAY_NS, GATEWAY) for peer in rule["from"])
        assert rule["ports"] == [{"port": 8060, "protocol": "TCP"}]
    # ... and reach out only where packages are on, to DNS and the package mirror alone.
    egress = _rules(evaluator, "egress")
    spec = _one(objects, "Deployment", "evaluator", SANDBOX_NS)["spec"]["template"]["spec"]
    packages = _env(spec["containers"][0]).get("EVALUATOR_PACKAGES", {}).get("value", "off")
    assert bool(egress) == (packages != "off")
    for rule in egress:
        for peer in rule["to"]:
            assert "ipBlock" not in peer
            assert _peer_is(peer, "kube-system", _DNS) or _peer_is(
                peer, "package-mirror", {"app.kubernetes.io/name": "package-mirror"}
            )
    # Gateways: out to the evaluators and DNS only; in on their port.
    gateway = _policies(objects, GATEWAY_NS, GATEWAY)
    for rule in _rules(gateway, "egress"):
        (peer,) = rule["to"]
        assert _peer_is(peer, SANDBOX_NS, EVALUATOR) or _peer_is(peer, "kube-system", _DNS)
    assert [r["ports"] for r in _rules(gateway, "ingress")] == [
        [{"port": 18080, "protocol": "TCP"}]
    ]


# --- Scaling and the linter's exceptions --------------------------------------------------------


def test_the_adapter_scales_on_a_metric_the_gateway_serves() -> None:
    objects = _base_with_components()
    autoscaler = _one(objects, "HorizontalPodAutoscaler", "evaluator", SANDBOX_NS)
    names = [
        m["external"]["metric"]["name"]
        for m in autoscaler["spec"]["metrics"]
        if m["type"] == "External"
    ]
    assert names == ["mcp_evaluations_waiting"]
    assert f'"{names[0]}"' in (ROOT / "gateway" / "metrics.py").read_text()
    assert any(m["type"] == "Resource" for m in autoscaler["spec"]["metrics"])


#: Every exception to the linter (checkov), by object: each must say why in its annotation.
ALLOWED_EXCEPTIONS = {
    "gateway": {"CKV_K8S_43", "CKV_K8S_35"},
    "evaluator": {"CKV_K8S_43", "CKV_K8S_31"},
    "seccomp-installer": {"CKV_K8S_43", "CKV_K8S_23", "CKV_K8S_40"},
}
#: ... and the Snekbox variant's evaluator, privileged as NsJail needs.
SNEKBOX_EXCEPTIONS = {"CKV_K8S_16", "CKV_K8S_20", "CKV_K8S_22", "CKV_K8S_23", "CKV_K8S_28",
                      "CKV_K8S_31", "CKV_K8S_37", "CKV_K8S_40", "CKV_K8S_43"}  # fmt: skip


@pytest.mark.parametrize(("source", "target"), _cases(tuple(TARGETS)))
def test_every_linter_exception_says_why(source: str, target: str) -> None:
    for obj in _objects(source, target):
        annotations = obj["metadata"].get("annotations", {})
        skips = {k: v for k, v in annotations.items() if k.startswith("checkov.io/skip")}
        checks = set()
        for value in skips.values():
            check, _, reason = value.partition("=")
            assert re.fullmatch(r"CKV_K8S_\d+", check) and len(reason) > 20, value
            checks.add(check)
        name = obj["metadata"]["name"]
        allowed = (
            SNEKBOX_EXCEPTIONS
            if target == "overlays-snekbox" and name == "evaluator"
            else ALLOWED_EXCEPTIONS.get(name, set())
        )
        assert checks <= allowed, (name, checks - allowed)
