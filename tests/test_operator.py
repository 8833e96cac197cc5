"""The worker operator (cronoq.operator) and its deployment files.

The reconcile pass reads a REAL cronoq-server (a process on a free loopback
port, with a metrics token) and scales a fake scale API; the decision and
the schedule are checked alone; the CRD, the Helm chart (rendered offline)
and the KEDA examples are checked against the Kubernetes schemas.

The servers' desired capacity is made known by a pool's ``min`` (a floor of
desired) and raw workers' slots, and every scale is checked against the
desired the server itself reports, so the tests hold whether desired is
the capacity or follows queue pressure.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

import pytest
import yaml

from cronoq.client import Client
from cronoq.operator import ClusterError, DeploymentNotFound, ScalerSpec, SpecError, decide, reconcile, replicas_for
from cronoq.operator.app import Operator
from cronoq.operator.config import ConfigError, ServerEntry, load_config, parse_config
from cronoq.operator.decide import Reading
from cronoq.operator.reader import SnapshotReader
from cronoq.operator.schedule import ScalerTable
from serverkit import AUTH, CLIENT, LISTEN, METRICS, ROOT, WORKER, RawWorker

CHART = ROOT / "deploy" / "helm" / "cronoq-operator"
CRD = CHART / "crds" / "cronoqworkerscalers.yaml"
KEDA = ROOT / "deploy" / "keda"

# "default" does not autoscale, so its desired is the workers' capacity and stays put while the test
# reads it; "floor" autoscales, idle: its desired rests at its min.
CONFIG = LISTEN + AUTH + """
[[pools]]
name = "default"
autoscale = false
[[pools]]
name = "floor"
min = 10
"""


class FakeCluster:
    """The ClusterAPI seam: Deployments' replicas in a dict, every call recorded."""

    def __init__(self, replicas: Mapping[tuple[str, str], int] | None = None) -> None:
        self.replicas = dict(replicas or {})
        self.scaled: list[tuple[str, str, int]] = []
        self.statuses: list[tuple[str, str, dict[str, Any]]] = []
        self.fail_scale: Exception | None = None
        self.changed = asyncio.Event()

    async def get_replicas(self, namespace: str, deployment: str) -> int:
        if (namespace, deployment) not in self.replicas:
            raise DeploymentNotFound(f"deployments.apps {deployment!r} not found")
        return self.replicas[(namespace, deployment)]

    async def set_replicas(self, namespace: str, deployment: str, replicas: int) -> None:
        if self.fail_scale is not None:
            raise self.fail_scale
        self.scaled.append((namespace, deployment, replicas))
        self.replicas[(namespace, deployment)] = replicas

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.statuses.append((namespace, name, dict(status)))
        self.changed.set()


def free_port() -> int:
    """A loopback port with nothing listening (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spec(**changes: Any) -> dict[str, Any]:
    base = {"server": "main", "pool": "default", "deployment": "workers", "slotsPerReplica": 4,
            "minReplicas": 0, "maxReplicas": 100}
    base.update(changes)
    return {key: value for key, value in base.items() if value is not None}


def operator_config(tmp_path: Path, servers: Mapping[str, str], token: str = METRICS):
    """An operator configuration naming ``servers`` (name -> url), each with ``token`` in a file."""
    token_file = tmp_path / "metrics-token"
    token_file.write_text(token + "\n")     # a mounted Secret often ends with a newline
    return parse_config({"read_timeout_s": 10, "servers": [
        {"name": name, "url": url, "token_file": str(token_file)} for name, url in servers.items()]})


async def reported_desired(server, pool: str) -> int:
    async with Client(server.target, token=METRICS) as client:
        snapshot = await client.snapshot()
    return next(entry["desired"] for entry in snapshot["pools"] if entry["name"] == pool)


# ---------------------------------------------------------------- the decision


@pytest.mark.parametrize("desired, slots, low, high, expected", [
    (0, 4, 0, 100, 0),
    (1, 4, 0, 100, 1),        # one slot still needs a pod
    (4, 4, 0, 100, 1),
    (5, 4, 0, 100, 2),
    (400, 4, 0, 100, 100),
    (401, 4, 0, 100, 100),    # clamped to max
    (0, 4, 2, 100, 2),        # clamped to min
    (10**15 + 1, 1, 0, 10**16, 10**15 + 1),   # exact: no float rounding
])
def test_replicas_are_the_ceiling_of_desired_over_slots_within_bounds(desired, slots, low, high, expected):
    assert replicas_for(desired, slots, low, high) == expected


def test_spec_defaults_and_refusals():
    parsed = ScalerSpec.from_resource({"server": "main", "pool": "p", "deployment": "d", "slotsPerReplica": 2,
                                       "maxReplicas": 5})
    assert (parsed.min_replicas, parsed.interval_s) == (0, 15)
    for bad, field in [({"slotsPerReplica": 0}, "spec.slotsPerReplica"), ({"maxReplicas": None}, "spec.maxReplicas"),
                       ({"minReplicas": 7, "maxReplicas": 5}, "spec.minReplicas"), ({"pool": ""}, "spec.pool"),
                       ({"intervalSeconds": True}, "spec.intervalSeconds"), ({"server": 3}, "spec.server")]:
        with pytest.raises(SpecError, match=field):
            ScalerSpec.from_resource(spec(**bad))


def test_a_failed_reading_holds_and_says_why():
    decision = decide(ScalerSpec.from_resource(spec()), Reading.failed("ServerUnreachable", "down"))
    assert (decision.action, decision.replicas, decision.reason, decision.message) == ("hold", None,
                                                                                      "ServerUnreachable", "down")
    clamped = decide(ScalerSpec.from_resource(spec(maxReplicas=3)), Reading.of(40))
    assert (clamped.action, clamped.replicas) == ("scale", 3)
    assert "clamped to [0, 3]" in clamped.message


# ---------------------------------------------------------------- the schedule


def test_each_scaler_is_due_by_its_own_interval_and_at_once_when_changed():
    table = ScalerTable()
    table.upsert(("ns", "a"), spec(intervalSeconds=5), 1, now=100.0)
    table.upsert(("ns", "b"), spec(), 1, now=100.0)            # the default, 15 s
    assert [key for key, _, _ in table.due(100.0)] == [("ns", "a"), ("ns", "b")]
    assert table.due(100.0) == [] and table.next_due() is None  # both running
    table.done(("ns", "a"), 101.0)
    table.done(("ns", "b"), 101.0)
    assert table.next_due() == 106.0
    assert [key for key, _, _ in table.due(106.0)] == [("ns", "a")]
    table.upsert(("ns", "a"), spec(intervalSeconds=5, maxReplicas=7), 2, now=107.0)   # changed while running
    table.done(("ns", "a"), 108.0)
    assert [(key, gen) for key, _, gen in table.due(108.0)] == [(("ns", "a"), 2)]
    table.upsert(("ns", "b"), spec(), 1, now=109.0)           # the same spec: no extra pass
    assert table.due(109.0) == []
    table.remove(("ns", "b"))
    assert len(table) == 1


# ---------------------------------------------------------------- the configuration


def test_configuration_file_tokens_from_files_or_the_environment(tmp_path, monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text("secret-one\n")
    path = tmp_path / "operator.toml"
    path.write_text(f'''
read_timeout_s = 3
[[servers]]
name = "main"
url = "http://cronoq.cronoq:7070"
token_file = "{token_file}"
[[servers]]
name = "other"
url = "https://other:7070"
token_env = "OTHER_TOKEN"
''')
    config = load_config(path)
    assert config.read_timeout_s == 3.0 and list(config.servers) == ["main", "other"]
    assert config.servers["main"].token() == "secret-one"
    monkeypatch.setenv("OTHER_TOKEN", "secret-two")
    assert config.servers["other"].token() == "secret-two"
    token_file.write_text("rotated")            # a rotated Secret is read on the next pass
    assert config.servers["main"].token() == "rotated"
    assert ServerEntry("x", "h:1").token() is None


@pytest.mark.parametrize("data, message", [
    ({"servers": [{"name": "a"}]}, r"servers\[0\]\.url: required"),
    ({"servers": [{"name": "a", "url": "h:1"}, {"name": "a", "url": "h:2"}]}, "named twice"),
    ({"servers": [{"name": "a", "url": "h:1", "token_file": "f", "token_env": "E"}]}, "at most one"),
    ({"servers": [{"name": "a", "url": "http://h:1", "ca_file": "ca"}]}, "needs an https"),
    ({"servers": [{"name": "a", "url": "h:1", "token": "inline"}]}, "unknown key"),
    ({"read_timeout_s": 0}, "read_timeout_s"),
])
def test_configuration_refusals_name_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(data)


def test_command_line_checks_the_configuration(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[[servers]]\nname = "main"\nurl = "127.0.0.1:7070"\ntoken_env = "T"\n')
    bad = tmp_path / "bad.toml"
    bad.write_text('[[servers]]\nname = "main"\n')
    ran = subprocess.run([sys.executable, "-m", "cronoq.operator", "--check", "--config", str(good)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert ran.returncode == 0 and "configuration is valid: 1 server(s)" in ran.stdout, ran.stderr
    ran = subprocess.run([sys.executable, "-m", "cronoq.operator", "--check", "--config", str(bad)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert ran.returncode == 2 and "servers[0].url: required" in ran.stderr


# ---------------------------------------------------------------- against a real server


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="operator")


@pytest.mark.asyncio
async def test_replicas_follow_the_desired_slots_the_server_reports(server, tmp_path):
    reader = SnapshotReader(operator_config(tmp_path, {"main": f"http://{server.target}"}))
    cluster = FakeCluster({("team", "workers"): 1, ("team", "floor-workers"): 0})
    workers = [RawWorker(server.target, WORKER) for _ in range(2)]
    try:
        for worker, slots in zip(workers, (5, 4)):
            await worker.register("default", slots=slots)
        desired = await reported_desired(server, "default")
        assert desired == 9          # autoscale = false: desired is the capacity the workers brought
        now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
        status = await reconcile("team", "default-workers", spec(slotsPerReplica=4), reader=reader,
                                 cluster=cluster, now=now, generation=3)
        assert cluster.scaled == [("team", "workers", math.ceil(desired / 4))]
        assert status == {"observedGeneration": 3, "desiredSlots": desired, "replicas": math.ceil(desired / 4),
                          "lastReadTime": "2026-01-02T03:04:05Z", "reason": "Scaled",
                          "message": status["message"]}
        assert cluster.statuses == [("team", "default-workers", status)]

        # Unchanged replicas: the scale subresource is read, not written again.
        await reconcile("team", "default-workers", spec(slotsPerReplica=4), reader=reader, cluster=cluster)
        assert len(cluster.scaled) == 1 and cluster.statuses[-1][2]["reason"] == "Scaled"

        # A pool's min is a floor of desired: 10 slots -> at least ceil(10 / 3) = 4 pods.
        floor = await reported_desired(server, "floor")
        assert floor >= 10
        status = await reconcile("team", "floor", spec(pool="floor", deployment="floor-workers", slotsPerReplica=3),
                                 reader=reader, cluster=cluster)
        assert cluster.scaled[-1] == ("team", "floor-workers", math.ceil(floor / 3))
        assert status["desiredSlots"] == floor
    finally:
        for worker in workers:
            await worker.close()
        await reader.close()


@pytest.mark.asyncio
async def test_replicas_are_clamped_to_the_scalers_bounds(server, tmp_path):
    reader = SnapshotReader(operator_config(tmp_path, {"main": server.target}))
    cluster = FakeCluster({("team", "workers"): 0})
    try:
        desired = await reported_desired(server, "floor")
        status = await reconcile("team", "s", spec(pool="floor", slotsPerReplica=1, maxReplicas=2), reader=reader,
                                 cluster=cluster)
        assert desired > 2 and cluster.scaled == [("team", "workers", 2)]
        assert status["replicas"] == 2 and "clamped to [0, 2]" in status["message"]
        status = await reconcile("team", "s", spec(pool="floor", slotsPerReplica=1000, minReplicas=6,
                                                   maxReplicas=9), reader=reader, cluster=cluster)
        assert cluster.scaled[-1] == ("team", "workers", 6) and status["replicas"] == 6
    finally:
        await reader.close()


@pytest.mark.asyncio
async def test_an_unknown_pool_leaves_the_deployment_alone(server, tmp_path):
    reader = SnapshotReader(operator_config(tmp_path, {"main": server.target}))
    cluster = FakeCluster({("team", "workers"): 3})
    try:
        status = await reconcile("team", "s", spec(pool="nowhere"), reader=reader, cluster=cluster)
        assert cluster.scaled == [] and cluster.replicas[("team", "workers")] == 3
        assert status["reason"] == "PoolNotReported"
        assert "does not report pool 'nowhere'" in status["message"] and "left alone" in status["message"]
        # The last good values stay: the pass writes neither desired slots, replicas nor a read time.
        assert not {"desiredSlots", "replicas", "lastReadTime"} & set(status)
    finally:
        await reader.close()


@pytest.mark.asyncio
async def test_a_refused_token_and_an_unknown_server_leave_the_deployment_alone(server, tmp_path):
    reader = SnapshotReader(operator_config(tmp_path, {"main": server.target}, token=CLIENT))   # not metrics
    cluster = FakeCluster({("team", "workers"): 3})
    try:
        status = await reconcile("team", "s", spec(), reader=reader, cluster=cluster)
        assert status["reason"] == "ReadRefused" and cluster.scaled == []
        status = await reconcile("team", "s", spec(server="elsewhere"), reader=reader, cluster=cluster)
        assert status["reason"] == "UnknownServer" and "'elsewhere'" in status["message"]
        assert "known: main" in status["message"] and cluster.scaled == []
    finally:
        await reader.close()


@pytest.mark.asyncio
async def test_a_server_that_cannot_be_reached_leaves_the_deployment_alone(servers, tmp_path):
    down = f"127.0.0.1:{free_port()}"
    reader = SnapshotReader(operator_config(tmp_path, {"down": down}))
    cluster = FakeCluster({("team", "workers"): 3})
    try:
        status = await reconcile("team", "s", spec(server="down"), reader=reader, cluster=cluster)
        assert cluster.scaled == [] and cluster.replicas[("team", "workers")] == 3
        assert status["reason"] == "ServerUnreachable" and "cannot read server 'down'" in status["message"]

        # A server that stops between two passes: scaled, then left alone.
        own = servers(CONFIG, name="stopping")
        reader.config = operator_config(tmp_path, {"down": own.target})
        status = await reconcile("team", "s", spec(server="down", pool="floor", slotsPerReplica=1), reader=reader,
                                 cluster=cluster)
        assert len(cluster.scaled) == 1 and status["reason"] == "Scaled"
        own.stop()
        status = await reconcile("team", "s", spec(server="down", pool="floor", slotsPerReplica=1), reader=reader,
                                 cluster=cluster)
        assert len(cluster.scaled) == 1 and status["reason"] == "ServerUnreachable"
    finally:
        await reader.close()


@pytest.mark.asyncio
async def test_cluster_failures_and_invalid_specs_are_reported(server, tmp_path):
    reader = SnapshotReader(operator_config(tmp_path, {"main": server.target}))
    cluster = FakeCluster({("team", "workers"): 0})
    try:
        status = await reconcile("team", "s", spec(deployment="missing", pool="floor"), reader=reader,
                                 cluster=cluster)
        assert status["reason"] == "DeploymentNotFound" and "'missing'" in status["message"]
        cluster.fail_scale = ClusterError("403 Forbidden")
        status = await reconcile("team", "s", spec(pool="floor"), reader=reader, cluster=cluster)
        assert status["reason"] == "ScaleFailed" and "403 Forbidden" in status["message"]
        assert "replicas" not in status           # nothing was set
        status = await reconcile("team", "s", spec(minReplicas=9, maxReplicas=2), reader=reader, cluster=cluster)
        assert status["reason"] == "InvalidSpec" and "spec.minReplicas" in status["message"]
        assert cluster.scaled == []
    finally:
        await reader.close()


@pytest.mark.asyncio
async def test_the_operator_loop_reconciles_what_kopf_reports(server, tmp_path):
    reader = SnapshotReader(operator_config(tmp_path, {"main": server.target}))
    cluster = FakeCluster({("team", "workers"): 0})
    operator = Operator(reader, cluster)
    loop = asyncio.get_running_loop().create_task(operator.run())
    try:
        body = {"metadata": {"generation": 1}, "spec": spec(pool="floor", slotsPerReplica=5)}
        operator.seen(None, "team", "s", body)       # the initial listing
        while not cluster.scaled:
            await asyncio.wait_for(cluster.changed.wait(), 30)
            cluster.changed.clear()
        desired = await reported_desired(server, "floor")
        assert cluster.scaled == [("team", "workers", math.ceil(desired / 5))]
        operator.seen("DELETED", "team", "s", body)
        assert len(operator.table) == 0
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
        await reader.close()


# ---------------------------------------------------------------- the CRD, the chart, KEDA


def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD.read_text())


def test_the_crd_is_a_valid_customresourcedefinition():
    import kubernetes_validate

    document = crd()
    kubernetes_validate.validate(document, "1.30", strict=True)
    version = document["spec"]["versions"][0]
    assert (document["spec"]["group"], version["name"], document["spec"]["scope"]) == (
        "cronoq.io", "v1alpha1", "Namespaced")
    assert version["subresources"] == {"status": {}}
    columns = {column["name"]: column["jsonPath"] for column in version["additionalPrinterColumns"]}
    assert {".status.desiredSlots", ".status.replicas", ".status.reason"} <= set(columns.values())


def test_the_books_scaler_validates_and_the_crd_defaults_match_the_operator():
    import jsonschema

    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    book = yaml.safe_load("""
apiVersion: cronoq.io/v1alpha1
kind: CronoqWorkerScaler
metadata: { name: default-workers }
spec:
  server: main
  pool: default
  deployment: default-workers
  slotsPerReplica: 4
  minReplicas: 0
  maxReplicas: 100
""")
    jsonschema.validate(book, schema)
    parsed = ScalerSpec.from_resource(book["spec"])
    properties = schema["properties"]["spec"]["properties"]
    assert properties["minReplicas"]["default"] == parsed.min_replicas
    assert properties["intervalSeconds"]["default"] == parsed.interval_s
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**book, "spec": {**book["spec"], "slotsPerReplica": 0}}, schema)


CHART_VALUES = {"servers": [
    {"name": "main", "url": "http://cronoq.cronoq:7070", "tokenSecret": {"name": "cronoq-tokens", "key": "metrics"}},
    {"name": "tls", "url": "https://cronoq.other:7070", "tokenSecret": {"name": "other", "key": "metrics"},
     "caSecret": {"name": "other-ca", "key": "ca.crt"}},
]}


def render(values: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    import helm_python as helm
    chart = helm.Chart.load(str(CHART))
    chart.validate_schema(values)
    rendered = chart.render(values, name="cronoq-operator", namespace="ops", is_install=True)
    return {Path(path).name: [doc for doc in yaml.safe_load_all(text) if doc] for path, text in rendered.items()}


def test_the_chart_renders_valid_manifests_with_least_privilege():
    import kubernetes_validate

    manifests = render(CHART_VALUES)
    for documents in manifests.values():
        for document in documents:
            kubernetes_validate.validate(document, "1.30", strict=True)
    role = manifests["rbac.yaml"][0]
    rights = {(group, resource): sorted(rule["verbs"]) for rule in role["rules"]
              for group in rule["apiGroups"] for resource in rule["resources"]}
    assert rights == {("cronoq.io", "cronoqworkerscalers"): ["get", "list", "watch"],
                      ("cronoq.io", "cronoqworkerscalers/status"): ["get", "patch", "update"],
                      ("apps", "deployments/scale"): ["get", "patch", "update"],
                      ("", "events"): ["create"]}
    assert manifests["rbac.yaml"][1]["kind"] == "ClusterRoleBinding"

    pod = manifests["deployment.yaml"][0]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["command"] == ["cronoq-operator"]

    # The configuration names each server, and its token file is where its Secret is mounted.
    text = manifests["configmap.yaml"][0]["data"]["operator.toml"]
    config = parse_config(__import__("tomllib").loads(text))
    assert {name: entry.url for name, entry in config.servers.items()} == {
        "main": "http://cronoq.cronoq:7070", "tls": "https://cronoq.other:7070"}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    for entry, server in zip(config.servers.values(), CHART_VALUES["servers"]):
        for path, secret in ((entry.token_file, server["tokenSecret"]), (entry.ca_file, server.get("caSecret"))):
            if secret is None:
                assert path is None
                continue
            assert path is not None
            volume = volumes[mounts[str(Path(path).parent)]]["secret"]
            assert volume["secretName"] == secret["name"]
            assert volume["items"] == [{"key": secret["key"], "path": Path(path).name}]


def test_the_chart_binds_only_the_namespaces_it_watches_and_refuses_bad_values():
    manifests = render({**CHART_VALUES, "namespaces": ["team-a", "team-b"]})
    bindings = manifests["rbac.yaml"][1:]
    assert [(b["kind"], b["metadata"]["namespace"]) for b in bindings] == [("RoleBinding", "team-a"),
                                                                          ("RoleBinding", "team-b")]
    args = manifests["deployment.yaml"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    helm = pytest.importorskip("helm_python")
    report = helm.lint(str(CHART), CHART_VALUES, strict=True)
    assert report["errors"] == [] and all(message["severity"] < 2 for message in report["messages"]), report
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmError, match="tokenSecret"):
        chart.validate_schema({"servers": [{"name": "main", "url": "http://cronoq:7070"}]})


def test_the_keda_examples():
    prometheus = yaml.safe_load((KEDA / "scaledobject-prometheus.yaml").read_text())
    external = yaml.safe_load((KEDA / "scaledobject-external.yaml").read_text())
    for document in (prometheus, external):
        assert (document["apiVersion"], document["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
        assert document["spec"]["scaleTargetRef"]["name"] == "default-workers"
        assert (document["spec"]["minReplicaCount"], document["spec"]["maxReplicaCount"]) == (0, 100)
    trigger = prometheus["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    assert 'cronoq_pool_desired_workers{pool="default"}' in trigger["metadata"]["query"]
    # The metric the query names is one the server exports.
    telemetry = (ROOT / "cronoq" / "telemetry").glob("*.py")
    assert any("cronoq_pool_desired_workers" in path.read_text() for path in telemetry)
    trigger = external["spec"]["triggers"][0]
    assert trigger["type"] in ("external", "external-push") and trigger["metadata"]["pool"] == "default"
    # Only keys the server's external scaler reads (docs/server.md lists them).
    assert set(trigger["metadata"]) <= {"scalerAddress", "pool", "slotsPerReplica", "tokenFromEnv", "token"}
    assert int(trigger["metadata"]["slotsPerReplica"]) >= 1


# ---------------------------------------------------------------- the whole operator process


@pytest.mark.asyncio
async def test_the_operator_process_scales_through_a_kubernetes_api_with_its_rights_only(server, tmp_path):
    """``python -m cronoq.operator`` (kopf, the kubernetes client) against a fake
    Kubernetes API and the real server: it lists and watches the scalers,
    scales through deployments/scale, writes the scalers' status and asks
    for nothing else."""
    import os
    import signal

    from kubekit import FakeKubernetes

    kube = await FakeKubernetes().start()
    kube.replicas[("team", "floor-workers")] = 0
    kube.replicas[("team", "other-workers")] = 5
    kube.add_scaler("team", "floor", spec(pool="floor", deployment="floor-workers", slotsPerReplica=3,
                                          intervalSeconds=1))
    token = tmp_path / "token"
    token.write_text(METRICS)
    config = tmp_path / "operator.toml"
    config.write_text(f'[[servers]]\nname = "main"\nurl = "http://{server.target}"\ntoken_file = "{token}"\n')
    env = {key: value for key, value in os.environ.items() if not key.startswith("KUBERNETES_")}
    env.update(KUBECONFIG=str(kube.kubeconfig(tmp_path / "kubeconfig")),
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    log = (tmp_path / "operator.log").open("w")
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "cronoq.operator", "--config", str(config),
                                                   stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                                   cwd=str(tmp_path))

    async def until(check, what: str) -> None:
        while not check():
            try:
                async with asyncio.timeout(60):
                    await kube.changed.wait()
            except TimeoutError:
                raise AssertionError(f"{what}; the operator logged:\n{(tmp_path / 'operator.log').read_text()}")
            kube.changed.clear()

    try:
        await until(lambda: kube.scale_patches, "the operator did not scale")
        desired = await reported_desired(server, "floor")
        assert kube.scale_patches == [("team", "floor-workers", math.ceil(desired / 3))]
        await until(lambda: kube.scalers[("team", "floor")].get("status", {}).get("reason") == "Scaled",
                    "no Scaled status")
        status = kube.scalers[("team", "floor")]["status"]
        assert (status["desiredSlots"], status["replicas"]) == (desired, math.ceil(desired / 3))

        # A scaler added later arrives through the watch; its unknown pool leaves its Deployment alone.
        kube.add_scaler("team", "other", spec(pool="nowhere", deployment="other-workers"))
        await until(lambda: kube.scalers[("team", "other")].get("status", {}).get("reason") == "PoolNotReported",
                    "no PoolNotReported status")
        assert kube.replicas[("team", "other-workers")] == 5
        assert all(patch[1] != "other-workers" for patch in kube.scale_patches)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        log.close()
        await kube.stop()

    # Patches a real API server accepts: custom resources take no strategic merge patch (415).
    assert kube.patch_types <= {("status", "application/merge-patch+json"),
                                ("scale", "application/merge-patch+json"),
                                ("scale", "application/strategic-merge-patch+json")}, kube.patch_types
    assert {what for what, _ in kube.patch_types} == {"status", "scale"}
    allowed = {("GET", "/api"), ("GET", "/api/v1"), ("GET", "/apis"), ("GET", "/apis/cronoq.io/v1alpha1"),
               ("GET", "/apis/cronoq.io/v1alpha1/cronoqworkerscalers")}
    for method, path in kube.requests:
        if (method, path) in allowed:
            continue
        if path.startswith("/apis/apps/v1/namespaces/team/deployments/") and path.endswith("/scale"):
            assert method in ("GET", "PATCH"), (method, path)
        elif path.startswith("/apis/cronoq.io/v1alpha1/namespaces/team/cronoqworkerscalers/"):
            assert path.endswith("/status") and method == "PATCH", (method, path)   # never the scaler itself
        else:
            assert (method, path) == ("POST", "/api/v1/namespaces/team/events"), (method, path)


def test_the_operator_runs_from_the_repositorys_image():
    import re
    import tomllib

    root = CHART.parents[2]
    dockerfile = (root / "Dockerfile").read_text()
    extras = re.search(r'pip install "\.\[([a-z,]+)\]"', dockerfile).group(1).split(",")
    assert "operator" in extras   # the image the chart names has the operator installed
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["cronoq-operator"].startswith("cronoq.operator")
    user, group = re.findall(r"^USER (\d+):(\d+)$", dockerfile, re.M)[-1]
    pod = render(CHART_VALUES)["deployment.yaml"][0]["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"] == ["cronoq-operator"]
    assert pod["containers"][0]["image"].startswith("cronoq:")
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (int(user), int(group))
