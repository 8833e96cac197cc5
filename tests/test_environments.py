"""The catalog of environments (cronoq/environments.py): its format and
every error; the server's [server] environment/region and [environments]
(inline, or a file relative to the configuration); the identity in
snapshots and the stream's hello; GET /v1/environments and its roles; and
the command line's --env, --environments and `cronoq environments`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from clikit import cronoq, err, text
from cronoq.cli.app import main
from cronoq.environments import CatalogError, Environment, load_catalog, parse_catalog
from cronoq.server.config import ConfigError, load, parse
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS, WORKER, run_cli

CATALOG = """
[environments.prod]
region = "eu-west-1"
http = "https://cronoq.prod.example:7071/"
grpc = "https://cronoq.prod.example:7070"
description = "production"

[environments.staging-2]
grpc = "10.0.0.5:7070"

[environments.lab]
http = "http://lab.example"
"""


# ---------------------------------------------------------------- the catalog


def test_a_catalog_lists_its_environments_in_order_with_their_keys():
    prod, staging, lab = parse_catalog(CATALOG)
    assert prod == Environment("prod", "eu-west-1", "https://cronoq.prod.example:7071",
                               "https://cronoq.prod.example:7070", "production")
    assert staging == Environment("staging-2", grpc="10.0.0.5:7070")
    assert lab.http == "http://lab.example" and lab.grpc is None and lab.region == ""
    assert prod.as_json("prod") == {"name": "prod", "region": "eu-west-1", "http": "https://cronoq.prod.example:7071",
                                    "grpc": "https://cronoq.prod.example:7070", "description": "production",
                                    "current": True}
    assert lab.as_json("prod")["grpc"] == "" and lab.as_json("prod")["current"] is False


@pytest.mark.parametrize("body,expected", [
    ('[environments.prod]\ngrpc = "a:1"\ntoken = "x"', "environments.prod.token: a catalog holds no credentials"),
    ('[environments.prod]\ngrpc = "a:1"\nsecret = "x"', "environments.prod.secret: a catalog holds no credentials"),
    ('[environments.prod]\ngrpc = "a:1"\npassword = "x"', "environments.prod.password: a catalog holds no credentials"),
    ('[environments.prod]\ngrpc = "a:1"\ntoken_env = "X"', "environments.prod.token_env: a catalog holds no credentials"),
    ('[environments.prod]\ngrpc = "a:1"\ncolour = "x"', "environments.prod.colour: unknown key"),
    ('[environments.Prod]\ngrpc = "a:1"', "environments: the name 'Prod' must match"),
    ('[environments."-x"]\ngrpc = "a:1"', "environments: the name '-x' must match"),
    (f'[environments.{"a" * 64}]\ngrpc = "a:1"', "must match [a-z0-9][a-z0-9_-]{0,62}"),
    ('[environments.prod]\nregion = "x"', "environments.prod: needs http (its HTTP URL), grpc (its gRPC target) or both"),
    ('[environments.prod]\nhttp = "ftp://h:1"', "environments.prod.http: must be an http:// or https:// URL"),
    ('[environments.prod]\nhttp = "https://h:1/ui/"', "environments.prod.http: must be https://HOST[:PORT] without a path"),
    ('[environments.prod]\nhttp = "https://h:99999"', "environments.prod.http: has an invalid port"),
    ('[environments.prod]\nhttp = "https://me:pw@h:1"', "environments.prod.http: must not hold a user or a password"),
    ('[environments.prod]\nhttp = "https://"', "environments.prod.http: must be https://HOST[:PORT]"),
    ('[environments.prod]\ngrpc = "h"', "environments.prod.grpc: must be HOST:PORT"),
    ('[environments.prod]\ngrpc = "ftp://h:1"', "environments.prod.grpc: must be HOST:PORT"),
    ('[environments.prod]\ngrpc = "h:1/x"', "environments.prod.grpc: must be HOST:PORT"),
    ('[environments.prod]\ngrpc = 7070', "environments.prod.grpc: must be a string, got 7070"),
    ('[environments.prod]\ngrpc = "a:1"\nregion = ""', "environments.prod.region: must not be empty"),
    ('[environments.prod]\ngrpc = "a:1"\nregion = " eu"', "environments.prod.region: must not begin or end"),
    ('[environments.prod]\ngrpc = "a:1"\ndescription = "a\\nb"', "environments.prod.description: must be printable"),
    ('environments = 3', "environments: must be a table of [environments.NAME] tables"),
    ('[environments]\nprod = "x"', "environments.prod: must be a table"),
    ('[environments.prod]\ngrpc = "a:1"\n[server]\nx = 1', "server: unknown key (a catalog holds [environments.NAME] tables only)"),
    ('[other]\nx = 1', "defines no environments"),
    ('[environments]', "defines no environments"),
    ('[environments', "not valid TOML"),
])
def test_each_catalog_error_names_its_key(body, expected):
    with pytest.raises(CatalogError) as caught:
        parse_catalog(body, "envs.toml")
    assert any(expected in problem for problem in caught.value.errors), caught.value.errors
    assert all(problem.startswith("envs.toml") for problem in caught.value.errors)


def test_every_problem_of_a_catalog_is_reported_at_once():
    with pytest.raises(CatalogError) as caught:
        parse_catalog('[environments.a]\ntoken = "s3cr3t-value"\n[environments.b]\nhttp = "x"\n', "c.toml")
    assert [problem.split(":")[1].strip() for problem in caught.value.errors] == \
        ["environments.a.token", "environments.a", "environments.b.http"]
    assert "s3cr3t-value" not in str(caught.value)   # (a token's value is never repeated)


def test_an_unreadable_catalog_names_its_path(tmp_path):
    with pytest.raises(CatalogError, match="cannot read .*missing.toml"):
        load_catalog(tmp_path / "missing.toml")
    (tmp_path / "latin.toml").write_bytes(b"[environments.a]\ndescription = \"\xe9\"\n")
    with pytest.raises(CatalogError, match="is not UTF-8"):
        load_catalog(tmp_path / "latin.toml")


# ---------------------------------------------------------------- the server's configuration


def test_the_server_takes_an_inline_catalog_and_its_identity():
    config = parse('[server]\nenvironment = "prod"\nregion = "eu-west-1"\n' + CATALOG)
    assert (config.server.environment, config.server.region) == ("prod", "eu-west-1")
    assert [e.name for e in config.environments] == ["prod", "staging-2", "lab"]


def test_the_region_comes_from_the_catalog_when_the_server_gives_none():
    config = parse('[server]\nenvironment = "prod"\n' + CATALOG)
    assert config.server.region == "eu-west-1"


def test_an_identity_without_a_catalog_is_taken_as_given():
    config = parse('[server]\nenvironment = "dev-7"\nregion = "home"\n')
    assert (config.server.environment, config.server.region, config.environments) == ("dev-7", "home", ())


def test_the_catalog_path_is_relative_to_the_configuration_file(tmp_path, monkeypatch):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "envs.toml").write_text(CATALOG)
    (tmp_path / "etc" / "cronoq.toml").write_text('[server]\nenvironment = "lab"\n[environments]\npath = "envs.toml"\n')
    monkeypatch.chdir(tmp_path)   # (not the file's directory)
    config = load("etc/cronoq.toml")
    assert [e.name for e in config.environments] == ["prod", "staging-2", "lab"]
    assert config.server.environment == "lab" and config.server.region is None   # (lab has no region)


@pytest.mark.parametrize("body,expected", [
    ('[environments]\npath = "envs.toml"\n[environments.prod]\ngrpc = "a:1"',
     "environments: give path (a catalog file) or [environments.NAME] tables, not both (found prod)"),
    ('[environments]\n', "environments: give path (a catalog file) or [environments.NAME] tables"),
    ('[environments]\npath = "missing.toml"', "environments.path: cannot read"),
    ('[environments]\npath = "bad.toml"', "environments.path: "),
    ('[environments]\npath = 3', "environments.path: must be a string"),
    ('[server]\nenvironment = "qa"\n' + CATALOG, "server.environment: 'qa' is not in the catalog (its environments: "
                                                  "prod, staging-2, lab)"),
    ('[server]\nenvironment = "prod"\nregion = "us-east-1"\n' + CATALOG,
     "server.region: 'us-east-1' differs from the catalog's region of 'prod' ('eu-west-1')"),
    ('[server]\nenvironment = "Prod"\n', "server.environment: must match [a-z0-9][a-z0-9_-]{0,62}"),
    ('[server]\nenvironment = 1\n', "server.environment: must be a string"),
    ('[server]\nregion = ""\n', "server.region: must not be empty"),
    ('[environments.prod]\ngrpc = "a:1"\npassword = "hunter2"', "environments.prod.password: a catalog holds no credentials"),
])
def test_each_server_catalog_error_names_its_key(tmp_path, body, expected):
    (tmp_path / "bad.toml").write_text('[environments.x]\ntoken = "y"\ngrpc = "a:1"\n')
    path = tmp_path / "cronoq.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert any(expected in problem for problem in caught.value.errors), caught.value.errors
    if "bad.toml" in body:
        assert any("environments.x.token" in problem for problem in caught.value.errors)


def test_check_validates_the_catalog(tmp_path):
    (tmp_path / "envs.toml").write_text('[environments.prod]\nhttp = "https://h:1"\napi_token = "abc"\n')
    (tmp_path / "cronoq.toml").write_text('[environments]\npath = "envs.toml"\n')
    refused = run_cli("--config", str(tmp_path / "cronoq.toml"), "--check")
    assert refused.returncode != 0
    assert "environments.path:" in refused.stderr and "environments.prod.api_token" in refused.stderr
    (tmp_path / "envs.toml").write_text(CATALOG)
    accepted = run_cli("--config", str(tmp_path / "cronoq.toml"), "--check")
    assert accepted.returncode == 0, accepted.stderr


# ---------------------------------------------------------------- the running server


def _served_catalog(directory: Path, grpc_port: int = 7070) -> None:
    (directory / "envs.toml").write_text(f"""
[environments.prod]
region = "eu-west-1"
http = "https://cronoq.prod.example:7071"
grpc = "127.0.0.1:{grpc_port}"
description = "production"

[environments.lab]
region = "home"
grpc = "127.0.0.1:1"
""")


@pytest.fixture
def named(servers, tmp_path):
    _served_catalog(tmp_path)
    return servers(LISTEN + 'environment = "prod"\n' + AUTH + '[environments]\npath = "envs.toml"\n', name="named")


def _http(server, token: str | None = None) -> httpx.Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", headers=headers, timeout=30)


def test_the_snapshot_and_the_hello_carry_the_identity(named):
    with _http(named, METRICS) as http:
        snap = http.get("/v1/snapshot").json()
        assert (snap["environment"], snap["region"]) == ("prod", "eu-west-1")   # (the region from the catalog)
    with _http(named, ADMIN) as http, http.stream("GET", "/v1/events?snapshot_s=0") as stream:
        lines = stream.iter_lines()
        assert next(lines) == "event: hello"
        hello = json.loads(next(lines).removeprefix("data:"))
    assert (hello["environment"], hello["region"]) == ("prod", "eu-west-1")


def test_the_environments_route_answers_the_catalog_to_client_metrics_and_admin(named):
    expected = {"environment": "prod", "region": "eu-west-1", "environments": [
        {"name": "prod", "region": "eu-west-1", "http": "https://cronoq.prod.example:7071",
         "grpc": "127.0.0.1:7070", "description": "production", "current": True},
        {"name": "lab", "region": "home", "http": "", "grpc": "127.0.0.1:1", "description": "", "current": False}]}
    for token in (CLIENT, METRICS, ADMIN):
        with _http(named, token) as http:
            answer = http.get("/v1/environments")
            assert answer.status_code == 200 and answer.json() == expected
    with _http(named, WORKER) as http:
        refused = http.get("/v1/environments")
        assert refused.status_code == 403 and "client or the metrics role" in refused.json()["error"]
    with _http(named) as http:
        assert http.get("/v1/environments").status_code == 401


def test_an_unnamed_server_answers_an_empty_identity_and_catalog(servers):
    server = servers(LISTEN + AUTH, name="unnamed")
    with _http(server, ADMIN) as http:
        assert http.get("/v1/environments").json() == {"environment": "", "region": "", "environments": []}
        snap = http.get("/v1/snapshot").json()
        assert (snap["environment"], snap["region"]) == ("", "")


# ---------------------------------------------------------------- the command line


def _catalog_file(tmp_path: Path, grpc_port: int) -> Path:
    path = tmp_path / "cli-envs.toml"
    path.write_text(f"""
[environments.prod]
region = "eu-west-1"
grpc = "127.0.0.1:{grpc_port}"
description = "production"

[environments.web-only]
http = "https://web.example"
""")
    return path


def test_env_resolves_the_target_from_the_catalog(named, tmp_path):
    catalog = _catalog_file(tmp_path, named.grpc_port)
    # The server is found through the catalog (no --server, no $CRONOQ_SERVER), its token from $CRONOQ_TOKEN.
    result = cronoq("--env", "prod", "--environments", str(catalog), "snapshot", "-o", "json", token=METRICS)
    assert result.returncode == 0, err(result)
    assert json.loads(text(result))["environment"] == "prod"
    # $CRONOQ_ENVIRONMENTS names the catalog; $CRONOQ_TOKEN_PROD is prod's token, before $CRONOQ_TOKEN.
    result = cronoq("snapshot", "--env", "prod", token="not-a-token-of-this-server-0000",
                    env={"CRONOQ_ENVIRONMENTS": str(catalog), "CRONOQ_TOKEN_PROD": METRICS})
    assert result.returncode == 0, err(result)
    assert "environment prod   region eu-west-1" in text(result)
    # The default catalog: $XDG_CONFIG_HOME/cronoq/environments.toml.
    (tmp_path / "xdg" / "cronoq").mkdir(parents=True)
    (tmp_path / "xdg" / "cronoq" / "environments.toml").write_text(catalog.read_text())
    result = cronoq("--env", "prod", "snapshot", token=METRICS, env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert result.returncode == 0, err(result)


def test_an_unknown_environment_lists_the_known_ones(tmp_path, capsys):
    catalog = _catalog_file(tmp_path, 7070)
    assert main(["--env", "qa", "--environments", str(catalog), "tasks"]) == 2
    assert "--env qa: no such environment in" in capsys.readouterr().err
    assert main(["--env", "qa", "--environments", str(catalog), "tasks"]) == 2
    assert "(known: prod, web-only)" in capsys.readouterr().err


def test_env_with_an_explicit_server_is_refused_naming_both(tmp_path, capsys):
    catalog = _catalog_file(tmp_path, 7070)
    assert main(["--env", "prod", "--server", "127.0.0.1:7070", "--environments", str(catalog), "tasks"]) == 2
    assert "--env prod and --server 127.0.0.1:7070 both name the server" in capsys.readouterr().err


def test_env_without_a_grpc_target_or_catalog_is_refused(tmp_path, capsys, monkeypatch):
    catalog = _catalog_file(tmp_path, 7070)
    assert main(["--env", "web-only", "--environments", str(catalog), "tasks"]) == 2
    assert "--env web-only: the catalog gives no grpc target" in capsys.readouterr().err
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "nowhere"))
    monkeypatch.delenv("CRONOQ_ENVIRONMENTS", raising=False)
    assert main(["--env", "prod", "tasks"]) == 2
    assert "no catalog of environments" in capsys.readouterr().err
    (tmp_path / "bad.toml").write_text('[environments.prod]\ngrpc = "a:1"\ntoken = "t"\n')
    assert main(["--env", "prod", "--environments", str(tmp_path / "bad.toml"), "tasks"]) == 2
    assert "environments.prod.token: a catalog holds no credentials" in capsys.readouterr().err


def test_cronoq_environments_prints_the_catalog(tmp_path, capsys):
    catalog = _catalog_file(tmp_path, 7070)
    assert main(["environments", "--environments", str(catalog)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "REGION", "HTTP", "GRPC", "DESCRIPTION"]
    assert lines[1].split() == ["prod", "eu-west-1", "-", "127.0.0.1:7070", "production"]
    assert lines[2].split() == ["web-only", "-", "https://web.example", "-"]
    assert main(["-o", "json", "environments", "--environments", str(catalog)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["catalog"] == str(catalog)
    assert [e["name"] for e in answer["environments"]] == ["prod", "web-only"]
    assert answer["environments"][1] == {"name": "web-only", "region": "", "http": "https://web.example", "grpc": "",
                                         "description": ""}


def test_each_shard_answers_the_merged_snapshot_with_its_own_identity(servers, tmp_path):
    import socket

    from serverkit import shards_toml

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    ports = {"a": free_port(), "b": free_port()}
    layout = shards_toml({"a": (["default"], f"http://127.0.0.1:{ports['a']}"),
                          "b": (["gpu"], f"http://127.0.0.1:{ports['b']}")})
    started = {}
    for shard, region in (("a", "eu-west-1a"), ("b", "eu-west-1b")):
        config = (f'[server]\ngrpc_addr = "127.0.0.1:{ports[shard]}"\nhttp_addr = "127.0.0.1:0"\n'
                  f'shutdown_grace_s = 2\nenvironment = "prod"\nregion = "{region}"\n' + AUTH +
                  f'[store]\nkind = "sqlite"\npath = "{tmp_path}/shard-{{shard}}.db"\nfull_sync = false\n' + layout)
        started[shard] = servers(config, args=("--shard", shard), name=f"shard-{shard}")
    for shard, region in (("a", "eu-west-1a"), ("b", "eu-west-1b")):
        with _http(started[shard], METRICS) as http:
            snap = http.get("/v1/snapshot").json()
        assert [p["name"] for p in snap["pools"]] == ["default", "gpu"]   # (merged from both shards)
        assert (snap["environment"], snap["region"]) == ("prod", region)   # (this server's: its answer comes first)
