"""The Helm chart (deploy/helm/cronoq) and the image (Dockerfile).

The chart is rendered offline by Helm's own engine (helm-python-sdk binds
Helm's Go SDK), linted strictly, and every rendered object is validated
against a pinned Kubernetes version's schemas (kubernetes-validate, strict:
unknown fields are errors). The server configuration the chart renders is
then checked by ``cronoq-server --check`` as each pod would run it. The
Dockerfile is parsed and held to the chart (user, ports, configuration
path), and its builder's install steps are replayed into a fresh venv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from certkit import CA
from serverkit import ROOT, run_cli

CHART = ROOT / "deploy" / "helm" / "cronoq"
DOCKERFILE = ROOT / "Dockerfile"
# The oldest Kubernetes the chart promises to work on; strict schemas.
KUBE_VERSION = "1.30.0"
NAMESPACE = "jobs"
ROLES = ("client", "worker", "metrics", "admin")

POOLS = '[[pools]]\nname = "default"\nmax = 50\nlease_ttl_s = 30\n\n[[pools]]\nname = "llm"\nmax = 200\n'
SHARDS = [{"name": "cpu", "number": 1, "pools": ["default"]},
          {"name": "gpu", "number": 2, "pools": ["llm"], "replicas": 3}]
SHARD_MESSAGE = "shards forward callers' tokens to each other: set tls.secretName"

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "postgres-ha": {"replicas": 3, "auth": {"existingSecret": "tokens"},
                    "store": {"postgres": {"urlSecret": {"name": "pg", "key": "dsn"}}},
                    "config": POOLS},
    "shards-tls": {"shards": SHARDS, "tls": {"secretName": "cronoq-tls"}, "config": POOLS},
    "shards-insecure-peer-http": {"shards": SHARDS, "insecurePeerHttp": True, "config": POOLS},
}


def render(values: dict[str, Any], release: str = "cronoq") -> list[dict[str, Any]]:
    """Every object the chart renders, as an install would."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=release, namespace=NAMESPACE, is_install=True)
    objects = []
    for name, text in sorted(manifests.items()):
        if name.endswith(".txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def the_config(objects: list[dict[str, Any]]) -> str:
    (config_map,) = of_kind(objects, "ConfigMap")
    text: str = config_map["data"]["cronoq.toml"]
    return text


def server_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "server"
    return container


def mount_path(deployment: dict[str, Any], volume: str) -> str:
    mounts = {m["name"]: m["mountPath"] for m in server_container(deployment)["volumeMounts"]}
    return mounts[volume]


# -- the chart ---------------------------------------------------------------

@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_the_chart_lints_strictly(values):
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    # Severity 1 is information ("icon is recommended"); warnings fail under strict.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_is_valid_kubernetes(values):
    objects = render(values)
    assert {obj["kind"] for obj in objects} == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
    for obj in objects:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        assert obj["metadata"]["namespace"] == NAMESPACE


def _check_env(values: dict[str, Any], deployment: dict[str, Any]) -> dict[str, str]:
    """The pod's environment, with made-up values for what comes from Secrets."""
    env = {}
    for var in server_container(deployment)["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = (f"postgresql://cronoq:pw@127.0.0.1:1/cronoq" if var["name"] == "DATABASE_URL"
                                else f"{ref['key']}-" + "s" * 32)
    return env


def _tls_files(directory: Path, objects: list[dict[str, Any]]) -> None:
    """tls.crt, tls.key and ca.crt as cert-manager writes them, naming every Service."""
    ca = CA()
    names = [f"{svc['metadata']['name']}.{NAMESPACE}.svc.cluster.local" for svc in of_kind(objects, "Service")]
    cert, key = ca.issue(names, server=True)
    directory.mkdir()
    (directory / "tls.crt").write_bytes(cert)
    (directory / "tls.key").write_bytes(key)
    (directory / "ca.crt").write_bytes(ca.pem)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_the_rendered_configuration_passes_check_in_every_pod(tmp_path, values):
    objects = render(values)
    config = the_config(objects)
    for deployment in of_kind(objects, "Deployment"):
        text = config
        if values.get("tls", {}).get("secretName"):
            # The pod reads the Secret where it is mounted; here, from a directory of the test's.
            tls_dir = tmp_path / "tls"
            if not tls_dir.exists():
                _tls_files(tls_dir, objects)
            text = text.replace(f'"{mount_path(deployment, "tls")}/', f'"{tls_dir}/')
        path = tmp_path / "cronoq.toml"
        path.write_text(text)
        result = run_cli("--config", str(path), "--check", *server_container(deployment).get("args", []),
                         env=_check_env(values, deployment))
        assert result.returncode == 0, (deployment["metadata"]["name"], result.stderr, text)
        assert "configuration is valid" in result.stdout


def test_shards_need_tls_or_explicitly_trusted_peers():
    with pytest.raises(helm.HelmRenderError, match=re.escape(SHARD_MESSAGE)):
        render({"shards": SHARDS, "config": POOLS})
    # (helm lint runs templates in its lenient mode, where fail only logs: rendering is what refuses.)


@pytest.mark.parametrize("values, message", [
    ({"store": {"kind": "memory"}}, 'store.kind "memory" keeps state in one process'),
    ({"shards": SHARDS, "insecurePeerHttp": True, "store": {"postgres": {"schema": "cronoq"}}},
     "store.postgres.schema must contain {shard}"),
    ({"shards": [SHARDS[0], {**SHARDS[1], "name": "cpu"}], "insecurePeerHttp": True}, 'the name "cpu" is given twice'),
    ({"shards": [SHARDS[0], {**SHARDS[1], "number": 1}], "insecurePeerHttp": True}, "the number 1 is given twice"),
])
def test_the_chart_refuses_unusable_value_sets(values, message):
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(values)


def test_the_values_schema_rejects_misspelt_keys():
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema({"replicas": 2})
        with pytest.raises(helm.HelmValuesError, match="replica"):
            chart.validate_schema({"replica": 2})
        with pytest.raises(helm.HelmValuesError, match="number"):
            chart.validate_schema({"shards": [{"name": "cpu", "number": 256, "pools": ["default"]}]})


def test_the_default_store_is_postgres_with_standbys_and_the_chart_schema():
    objects = render({})
    (deployment,) = of_kind(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    store = tomllib.loads(the_config(objects))["store"]
    assert store == {"kind": "postgres", "url_env": "DATABASE_URL", "schema": "cronoq", "keep_finished_s": 604800}
    assert "0.0.0.0" in tomllib.loads(the_config(objects))["server"]["grpc_addr"]  # non-loopback: tokens required


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_tokens_and_the_database_url_come_from_the_secrets(values):
    objects = render(values)
    config = tomllib.loads(the_config(objects))
    secret = values.get("auth", {}).get("existingSecret", "cronoq-tokens")
    url = {"name": "cronoq-db", "key": "url"} | values.get("store", {}).get("postgres", {}).get("urlSecret", {})
    assert sorted(t["role"] for t in config["auth"]["tokens"]) == sorted(ROLES)
    assert all("token" not in t for t in config["auth"]["tokens"])
    for deployment in of_kind(objects, "Deployment"):
        env = {var["name"]: var.get("valueFrom", {}).get("secretKeyRef") for var in server_container(deployment)["env"]}
        for token in config["auth"]["tokens"]:
            assert env[token["token_env"]] == {"name": secret, "key": token["role"]}
        assert env[config["store"]["url_env"]] == url


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_pods_are_locked_down_and_probed_on_healthz(values):
    tls = bool(values.get("tls"))
    for deployment in of_kind(render(values), "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        container = server_container(deployment)
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        for probe in ("livenessProbe", "readinessProbe"):
            get = container[probe]["httpGet"]
            assert (get["path"], get["port"], get["scheme"]) == ("/healthz", "http", "HTTPS" if tls else "HTTP")
        assert pod["terminationGracePeriodSeconds"] > tomllib.loads(the_config(render(values)))["server"]["shutdown_grace_s"]


def test_tls_is_mounted_and_configured_on_both_listeners_and_between_shards():
    objects = render(VALUE_SETS["shards-tls"])
    config = tomllib.loads(the_config(objects))
    deployment = of_kind(objects, "Deployment")[0]
    tls_dir = mount_path(deployment, "tls")
    assert config["server"]["tls"] == {"cert": f"{tls_dir}/tls.crt", "key": f"{tls_dir}/tls.key"}
    assert config["server"]["peer_tls"] == {"ca": f"{tls_dir}/ca.crt"}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "cronoq-tls"
    assert "insecure_peer_http" not in config["server"]
    # mTLS on request: the CA in the same Secret signs the clients' certificates.
    config = tomllib.loads(the_config(render({"tls": {"secretName": "t", "requireClientCerts": True}})))
    assert config["server"]["tls"]["client_ca"] == f"{tls_dir}/ca.crt"
    assert "peer_tls" not in config["server"]


@pytest.mark.parametrize("release, prefix", [("prod", "prod-cronoq"), ("cronoq-prod", "cronoq-prod")])
@pytest.mark.parametrize("scheme, extra", [("https", {"tls": {"secretName": "t"}}), ("http", {"insecurePeerHttp": True})])
def test_each_shard_has_its_deployment_service_and_budget(release, prefix, scheme, extra):
    objects = render({"shards": SHARDS, "config": POOLS, **extra}, release=release)
    config = tomllib.loads(the_config(objects))
    assert config["server"].get("insecure_peer_http", False) is (scheme == "http")
    assert config["store"]["schema"] == "cronoq_{shard}"
    deployments = {d["metadata"]["name"]: d for d in of_kind(objects, "Deployment")}
    services = {s["metadata"]["name"]: s for s in of_kind(objects, "Service")}
    budgets = {b["metadata"]["name"]: b for b in of_kind(objects, "PodDisruptionBudget")}
    assert set(deployments) == set(budgets) == {f"{prefix}-cpu", f"{prefix}-gpu"}
    assert set(services) == {prefix, f"{prefix}-cpu", f"{prefix}-gpu"}
    grpc_port = {p["name"]: p["port"] for p in services[prefix]["spec"]["ports"]}["grpc"]
    for shard, section in zip(SHARDS, config["shards"], strict=True):
        name = f"{prefix}-{shard['name']}"
        assert (section["name"], section["number"], section["pools"]) == (shard["name"], shard["number"], shard["pools"])
        assert section["endpoint"] == f"{scheme}://{name}.{NAMESPACE}.svc.cluster.local:{grpc_port}"
        deployment = deployments[name]
        assert server_container(deployment)["args"] == ["--shard", shard["name"]]
        assert deployment["spec"]["replicas"] == shard.get("replicas", 2)
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        # The shard's Service and budget select its pods only; the main Service every shard's.
        for selector in (services[name]["spec"]["selector"], budgets[name]["spec"]["selector"]["matchLabels"],
                         services[prefix]["spec"]["selector"]):
            assert selector.items() <= pod_labels.items()
        others = [d for d in deployments.values() if d is not deployment]
        for other in others:
            other_labels = other["spec"]["template"]["metadata"]["labels"]
            assert not services[name]["spec"]["selector"].items() <= other_labels.items()
            assert not deployment["spec"]["selector"]["matchLabels"].items() <= other_labels.items()


def test_config_values_are_appended_verbatim():
    extra = POOLS + '\n[limits]\nmax_wait_s = 120\n\n[[resources]]\nname = "gpu"\nkind = "semaphore"\npermits = 8\n'
    config = tomllib.loads(the_config(render({"config": extra})))
    assert [p["name"] for p in config["pools"]] == ["default", "llm"]
    assert config["limits"] == {"max_wait_s": 120}
    assert config["resources"] == [{"name": "gpu", "kind": "semaphore", "permits": 8}]


# -- the image ---------------------------------------------------------------

def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments), continuations joined."""
    lines, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        if not current and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        lines.append(current + raw)
        current = ""
    stages: list[list[tuple[str, str]]] = [[]]
    for line in lines:
        instruction, _, arguments = line.strip().partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        stages[-1].append((instruction.upper(), arguments.strip()))
    return stages


def final_stage() -> dict[str, list[str]]:
    instructions: dict[str, list[str]] = {}
    for instruction, arguments in dockerfile_stages()[-1]:
        instructions.setdefault(instruction, []).append(arguments)
    return instructions


def image_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    env = {}
    for instruction, arguments in stage:
        if instruction == "ENV":
            for pair in arguments.split():
                name, _, value = pair.partition("=")
                env[name] = value
    return env


def test_the_image_is_a_slim_python_3_11_and_copies_only_the_venv():
    stages = dockerfile_stages()
    (base,) = [args for instruction, args in stages[0] if instruction == "ARG"]
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11-slim(-\w+)?", base)
    assert [stage[0] for stage in stages[1:]] == [("FROM", "${PYTHON_IMAGE} AS builder"), ("FROM", "${PYTHON_IMAGE}")]
    copies = final_stage()["COPY"]
    assert [c for c in copies if c.startswith("--from=")] == ["--from=builder /opt/cronoq /opt/cronoq"]
    assert final_stage()["ENV"][0].startswith("PATH=/opt/cronoq/bin:")
    assert "RUN" not in final_stage()   # nothing runs a shell in the final image


def test_the_image_runs_the_server_as_a_numeric_non_root_user():
    final = final_stage()
    user, _, group = final["USER"][-1].partition(":")
    assert user.isdigit() and int(user) != 0 and group.isdigit() and int(group) != 0
    # Exec form, so that cronoq-server is PID 1 and receives SIGTERM itself.
    assert json.loads(final["ENTRYPOINT"][-1]) == ["cronoq-server"]
    (deployment,) = of_kind(render({}), "Deployment")
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert (pod_security["runAsUser"], pod_security["runAsGroup"]) == (int(user), int(group))


def test_the_image_exposes_the_charts_ports_and_reads_the_mounted_configuration():
    final = final_stage()
    exposed = sorted(int(port.split("/")[0]) for line in final["EXPOSE"] for port in line.split())
    objects = render({})
    (deployment,) = of_kind(objects, "Deployment")
    container_ports = sorted(p["containerPort"] for p in server_container(deployment)["ports"])
    service_ports = sorted(p["port"] for p in of_kind(objects, "Service")[0]["spec"]["ports"])
    assert exposed == container_ports == service_ports == [7070, 7071]
    env = image_env(dockerfile_stages()[-1])
    (config_map,) = of_kind(objects, "ConfigMap")
    (key,) = config_map["data"]
    assert env["CRONOQ_CONFIG"] == f"{mount_path(deployment, 'config')}/{key}"
    assert "--config" not in server_container(deployment).get("args", [])
    # The example configuration sits where CRONOQ_CONFIG points, for `docker run` without a mount.
    assert f"deploy/cronoq.example.toml {env['CRONOQ_CONFIG']}" in final["COPY"]
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore's rule: the last matching pattern wins, ! re-includes."""
    from fnmatch import fnmatch
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch(path, pattern) or path.startswith(pattern + "/") or fnmatch(path, pattern.removeprefix("**/")):
            ignored = not negated
    return ignored


def _builder_stage() -> list[tuple[str, str]]:
    (builder,) = [stage for stage in dockerfile_stages() if stage and stage[0][1].endswith(" AS builder")]
    return builder


def _builder_copies() -> list[str]:
    sources = []
    for instruction, arguments in _builder_stage():
        if instruction == "COPY" and "--from" not in arguments:
            *parts, _ = arguments.split()
            sources += parts
    return sources


def test_the_dockerignore_keeps_what_the_dockerfile_copies():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for source in _builder_copies() + ["deploy/cronoq.example.toml"]:
        assert not _ignored(source, patterns), source
    for tracked in ("tests/test_helm_chart.py", ".venv", "deploy/helm/cronoq/values.yaml", "cronoq/__pycache__"):
        assert _ignored(tracked, patterns), tracked


def test_the_builders_install_steps_give_a_working_server(tmp_path):
    """The builder's COPY lines replayed into a clean source tree, built into a
    wheel and installed into a fresh venv: packaging mistakes (a file the
    build needs but the Dockerfile does not copy, package data missing from
    the wheel) fail here. The build backend comes from PyPI, as in the image;
    the runtime dependencies from this environment."""
    src = tmp_path / "src"
    src.mkdir()
    for source in _builder_copies():
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, src / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / source, src / source)
    run = {"check": True, "capture_output": True, "text": True, "timeout": 300}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(tmp_path / "dist"), str(src)], cwd=tmp_path, **run)
    (wheel,) = (tmp_path / "dist").glob("cronoq-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], **run)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   cwd=tmp_path, **run)
    # The dependencies the builder would download: this environment's, after the venv's own packages.
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               **run).stdout.strip())
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    before = sorted(p for p in venv.rglob("*"))
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "CRONOQ_CONFIG")}
    env |= image_env(dockerfile_stages()[-1]) | {"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}
    env.pop("CRONOQ_CONFIG")
    env |= {f"CRONOQ_{role.upper()}_TOKEN": f"{role}-" + "e" * 32 for role in ROLES}
    where = subprocess.run([str(python), "-c", "import cronoq, cronoq.server; print(cronoq.__file__)"],
                           env=env, cwd=tmp_path, **run)
    assert Path(where.stdout.strip()).is_relative_to(venv)
    result = subprocess.run([str(venv / "bin" / "cronoq-server"), "--config", str(ROOT / "deploy" / "cronoq.example.toml"),
                             "--check"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "configuration is valid" in result.stdout
    # The image's environment keeps the venv as installed: nothing written at run time.
    assert sorted(p for p in venv.rglob("*")) == before
    # The extras the builder installs are the package's own (pip only warns about unknown ones).
    (install,) = [args for instruction, args in _builder_stage() if instruction == "RUN" and "pip install" in args]
    extras = re.search(r'"\.\[([a-z,]+)\]"', install).group(1).split(",")
    metadata = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.metadata('cronoq').get_all('Provides-Extra'))"],
                              env=env, cwd=tmp_path, **run).stdout
    assert {"server", "postgres"} <= set(extras) and all(f"'{extra}'" in metadata for extra in extras), (extras, metadata)
    # What the server serves from package data came along.
    installed = Path(where.stdout.strip()).parent
    for data in ("_migrations/env.py", "_proto/cronoq.proto", "server/ui", "py.typed"):
        assert (installed / data).exists(), data


def test_the_notes_name_the_secrets_and_the_shard_endpoints():
    with helm.Chart.load(CHART) as chart:
        notes = chart.render(VALUE_SETS["shards-tls"], name="prod", namespace=NAMESPACE)["cronoq/templates/NOTES.txt"]
    assert "create secret generic prod-cronoq-tokens" in notes and "prod-cronoq-db" in notes
    for shard in SHARDS:
        assert f"prod-cronoq-{shard['name']}.{NAMESPACE}.svc.cluster.local:7070" in notes
    assert "must name every shard's Service" in notes
