"""The configuration file: every rule of the validation summary (docs/server.md),
checked through ``cronoq-server --check`` as an operator runs it, the rules
that only startup can check, the defaults without a file, and the CLI."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from serverkit import ROOT, run_cli, server_env

GOOD_TOKEN = "t" * 32


def check(tmp_path: pathlib.Path, text: str, *, env: dict[str, str] | None = None,
          args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    path = tmp_path / "cronoq.toml"
    path.write_text(text)
    path.chmod(0o600)
    return run_cli("--config", str(path), "--check", *args, env=env)


EXAMPLE_ENV = {f"CRONOQ_{role}_TOKEN": f"{role.lower()}-" + "e" * 32 for role in ("CLIENT", "WORKER", "METRICS", "ADMIN")}


# (rule, configuration, text the error must contain: the key and what is wrong)
INVALID = [
    ("unknown top-level key", 'colour = "blue"\n', "colour: unknown key"),
    ("unknown server key", '[server]\ngrpc_adr = "127.0.0.1:7070"\n', "server.grpc_adr: unknown key"),
    ("unknown pool key", '[[pools]]\nname = "a"\npriorty = 1\n', "pools[0].priorty: unknown key"),
    ("unknown limits key", "[limits]\nmax_mesage_bytes = 10\n", "limits.max_mesage_bytes: unknown key"),
    ("unknown token key", f'[[auth.tokens]]\ntoken = "{GOOD_TOKEN}"\nrole = "client"\npool = ["x"]\n',
     "auth.tokens[0].pool: unknown key"),
    ("unknown store key", '[store]\nkind = "sqlite"\npath = "x.db"\nurl = "postgresql://h/db"\n',
     "store.url: applies to kind = \"postgres\" only"),
    ("duplicate pool names", '[[pools]]\nname = "a"\n[[pools]]\nname = "a"\n', "duplicate pool name 'a'"),
    ("duplicate resource names",
     '[[resources]]\nname = "r"\nkind = "semaphore"\npermits = 1\n'
     '[[resources]]\nname = "r"\nkind = "semaphore"\npermits = 2\n', "duplicate resource name 'r'"),
    ("empty pool name", '[[pools]]\nname = ""\n', "pools[0].name: must not be empty"),
    ("NUL in a pool name", '[[pools]]\nname = "a\\u0000b"\n', "pools[0].name: must not contain NUL"),
    ("overlong pool name", f'[[pools]]\nname = "{"p" * 256}"\n', "pools[0].name: is longer than 255 bytes"),
    ("invalid resource name", '[[resources]]\nname = ""\nkind = "semaphore"\npermits = 1\n',
     "resources[0].name: must not be empty"),
    ("pool without a name", "[[pools]]\nmax = 3\n", "pools[0].name: is required"),
    ("negative duration", "[server]\nshutdown_grace_s = -1\n", "server.shutdown_grace_s: must be at least 0"),
    ("infinite duration", '[[pools]]\nname = "a"\nlease_ttl_s = inf\n', "pools[0].lease_ttl_s: must be finite"),
    ("NaN duration", "[limits]\nregister_timeout_s = nan\n", "limits.register_timeout_s: must be finite"),
    ("duration over a year", "[limits]\nmax_wait_s = 40000000\n", "limits.max_wait_s: must be at least 0 and at most"),
    ("duration as text", '[server]\nshutdown_grace_s = "10"\n', "server.shutdown_grace_s: must be a number of seconds"),
    ("fraction above 1", '[[pools]]\nname = "a"\nreservable_fraction = 1.5\n',
     "pools[0].reservable_fraction: must be at least 0 and at most 1"),
    ("multiplier below 1", '[[pools]]\nname = "a"\nretry = { multiplier = 0.5 }\n',
     "pools[0].retry.multiplier: must be at least 1"),
    ("zero rate", '[[resources]]\nname = "r"\nkind = "token_bucket"\nrate = 0\nburst = 1\n',
     "resources[0].rate: must be at least"),
    ("negative tenant weight", '[[pools]]\nname = "a"\ntenant_weights = { acme = -2 }\n',
     "pools[0].tenant_weights.acme: must be above 0"),
    ("pool min above max", '[[pools]]\nname = "a"\nmin = 5\nmax = 2\n', "pools[0].min: (5) must not exceed max (2)"),
    ("integer out of range", "[limits]\nmax_tasks_per_batch = 0\n", "limits.max_tasks_per_batch: must be between 1"),
    ("token and token_env both", f'[[auth.tokens]]\ntoken = "{GOOD_TOKEN}"\ntoken_env = "X"\nrole = "client"\n',
     "auth.tokens[0]: needs exactly one of token and token_env"),
    ("neither token nor token_env", '[[auth.tokens]]\nrole = "client"\n',
     "auth.tokens[0]: needs exactly one of token and token_env"),
    ("duplicate literal tokens",
     f'[[auth.tokens]]\ntoken = "{GOOD_TOKEN}"\nrole = "client"\n[[auth.tokens]]\ntoken = "{GOOD_TOKEN}"\nrole = "worker"\n',
     "auth.tokens[1].token: duplicates the token of auth.tokens[0]"),
    ("unknown pool in an allow-list", f'[[auth.tokens]]\ntoken = "{GOOD_TOKEN}"\nrole = "client"\npools = ["llm"]\n',
     "auth.tokens[0].pools: names unknown pool 'llm'"),
    ("unknown role", f'[[auth.tokens]]\ntoken = "{GOOD_TOKEN}"\nrole = "root"\n',
     "auth.tokens[0].role: must be one of client, worker, metrics, admin"),
    ("certs without client_ca", '[[auth.certs]]\ndns_name = "w.internal"\nrole = "worker"\n',
     "auth.certs: need server.tls.client_ca"),
    ("gRPC-Web origin with a path", '[server.grpc_web]\nallowed_origins = ["https://a.example/app"]\n',
     "server.grpc_web.allowed_origins[0]: must be an origin"),
    ("unknown gRPC-Web key", '[server.grpc_web]\norigins = ["https://a.example"]\n',
     "server.grpc_web.origins: unknown key"),
    ("store.url and store.url_env", '[store]\nkind = "postgres"\nurl = "postgresql://h/db"\nurl_env = "DB"\n',
     "store: give store.url or store.url_env, not both"),
    ("shard without an endpoint", '[server]\nshard = "cpu"\n[[shards]]\nname = "cpu"\nnumber = 1\npools = ["default"]\n',
     "shards[0].endpoint: is required"),
    ("invalid listen address", '[server]\ngrpc_addr = "example.com:7070"\n',
     "server.grpc_addr: host must be an IP address or localhost"),
    ("sqlite without a path", '[store]\nkind = "sqlite"\n', "store.path: is required"),
    ("invalid cron in a schedule", '[[recurring]]\nname = "n"\ncron = "every day"\n',
     "recurring[0].cron"),
    ("schedule in an unknown pool", '[[recurring]]\nname = "n"\ncron = "* * * * *"\npool = "nope"\n',
     "recurring[0].pool: names unknown pool 'nope'"),
    ("trace without a path", "[trace]\nsample_interval_s = 1\n", "trace.path: is required"),
    ("zero trace flush interval", '[trace]\npath = "t.jsonl"\nflush_interval_s = 0\n',
     "trace.flush_interval_s: must be above 0"),
    ("unknown trace key", '[trace]\npath = "t.jsonl"\nfile = "u.jsonl"\n', "trace.file: unknown key"),
    ("not TOML", "[server\n", "not valid TOML"),
]


@pytest.mark.parametrize("rule,text,expected", INVALID, ids=[case[0] for case in INVALID])
def test_check_rejects_each_rule_naming_the_key(tmp_path, rule, text, expected):
    result = check(tmp_path, text)
    assert result.returncode == 2, (rule, result.stdout, result.stderr)
    assert expected in result.stderr, (rule, result.stderr)
    assert "configuration is valid" not in result.stdout


def test_check_reports_every_problem_at_once(tmp_path):
    result = check(tmp_path, '[server]\nshutdown_grace_s = -1\nbogus = 1\n[[pools]]\nname = ""\n')
    assert result.returncode == 2
    for expected in ("server.shutdown_grace_s", "server.bogus: unknown key", "pools[0].name"):
        assert expected in result.stderr


def test_check_accepts_a_full_configuration_and_the_example(tmp_path):
    result = run_cli("--config", str(ROOT / "deploy" / "cronoq.example.toml"), "--check", env=EXAMPLE_ENV)
    assert (result.returncode, result.stdout.strip()) == (0, "configuration is valid"), result.stderr
    full = f"""
[server]
grpc_addr = "[::1]:0"
http_addr = "localhost:0"
shutdown_grace_s = 5
[[auth.tokens]]
token_env = "SOME_TOKEN"
role = "worker"
pools = ["llm"]
labels = ["gpu=a100"]
[[auth.tokens]]
token = "{GOOD_TOKEN}"
role = "client"
tenant = "acme"
[store]
kind = "postgres"
url_env = "DATABASE_URL"
schema = "cronoq"
[limits]
max_message_bytes = 1048576
max_wait_s = 60
[[pools]]
name = "default"
[[pools]]
name = "llm"
min = 1
max = 200
lease_ttl_s = 120
max_pending = {{ low = 1000 }}
overflow = "reject"
retry = {{ max_attempts = 5, initial_backoff_s = 2, max_backoff_s = 120 }}
tenant_weights = {{ acme = 2.0, other = 0.5 }}
[[resources]]
name = "openai"
kind = "token_bucket"
rate = 50
burst = 100
[outputs]
cache_entries = 100
info_entries = 1000
[trace]
path = "/var/lib/cronoq/trace-{{epoch}}.jsonl"
flush_interval_s = 1
sample_interval_s = 5
max_buffer = 100000
[[recurring]]
name = "nightly"
cron = "0 0 3 * * *"
tz = "Europe/Berlin"
pool = "llm"
payload = {{ report = "daily" }}
overlap = "queue"
resources = {{ openai = 1 }}
"""
    result = check(tmp_path, full, env={"SOME_TOKEN": "s" * 32, "DATABASE_URL": "postgresql://db/cronoq"})
    assert (result.returncode, result.stdout.strip()) == (0, "configuration is valid"), result.stderr


def test_the_config_path_can_come_from_cronoq_config(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("nonsense = 1\n")
    result = run_cli("--check", env={"CRONOQ_CONFIG": str(bad)})
    assert result.returncode == 2 and "nonsense: unknown key" in result.stderr
    result = run_cli("--check", env={"CRONOQ_CONFIG": str(tmp_path / "missing.toml")})
    assert result.returncode == 2 and "cannot read" in result.stderr and "missing.toml" in result.stderr


def test_without_a_file_the_defaults_are_valid():
    result = run_cli("--check")
    assert (result.returncode, result.stdout.strip()) == (0, "configuration is valid")


def test_print_proto_prints_the_api_definition():
    from cronoq._proto import proto_text

    result = run_cli("--print-proto")
    assert result.returncode == 0
    assert result.stdout == proto_text()
    assert "package cronoq.v1;" in result.stdout and "service Workers" in result.stdout


# ---------------------------------------------------------------- --check and startup agree


def start_and_fail(tmp_path: pathlib.Path, text: str, *, env: dict[str, str] | None = None,
                   args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    path = tmp_path / "cronoq.toml"
    path.write_text(text)
    path.chmod(0o600)
    return run_cli("--config", str(path), *args, env=env)


LOCAL = '[server]\ngrpc_addr = "127.0.0.1:0"\nhttp_addr = "127.0.0.1:0"\n'
WIDE = "0.0.0.0"   # every interface: refused without credentials (no test listens on it)


def _tls(tmp_path: pathlib.Path, *, matching: bool) -> str:
    from certkit import CA

    ca = CA()
    cert, key = ca.write(tmp_path, "server", ca.issue(["localhost"], ips=["127.0.0.1"], server=True))
    if not matching:
        _, key = ca.write(tmp_path, "other", ca.issue(["other"], server=True))
    return f'[server.tls]\ncert = "{cert}"\nkey = "{key}"\n'


# (rule, configuration (or a function of tmp_path giving it), environment,
#  what the error says). Each is refused by --check and by startup alike.
ENVIRONMENT_RULES = [
    ("unset token_env", LOCAL + '[[auth.tokens]]\ntoken_env = "CRONOQ_TEST_UNSET_TOKEN"\nrole = "client"\n', {},
     "auth.tokens[0].token_env: the environment variable CRONOQ_TEST_UNSET_TOKEN is not set"),
    ("a 5-character token", LOCAL + '[[auth.tokens]]\ntoken = "abcde"\nrole = "client"\n', {},
     "auth.tokens[0]: the token has 5 characters; at least 16 are needed"),
    ("a short token from the environment",
     LOCAL + '[[auth.tokens]]\ntoken_env = "CRONOQ_TEST_TOKEN"\nrole = "client"\n', {"CRONOQ_TEST_TOKEN": "x" * 15},
     "auth.tokens[0] (from CRONOQ_TEST_TOKEN): the token has 15 characters; at least 16 are needed"),
    ("duplicate tokens", LOCAL + f'[[auth.tokens]]\ntoken = "{GOOD_TOKEN}"\nrole = "client"\n'
                                 '[[auth.tokens]]\ntoken_env = "CRONOQ_TEST_TOKEN"\nrole = "admin"\n',
     {"CRONOQ_TEST_TOKEN": GOOD_TOKEN},
     "auth.tokens[1] (from CRONOQ_TEST_TOKEN): the token is the same as that of auth.tokens[0]"),
    ("gRPC off loopback, refused without credentials", f'[server]\ngrpc_addr = "{WIDE}:0"\nhttp_addr = "127.0.0.1:0"\n',
     {}, f"server.grpc_addr: {WIDE} is not a loopback address and no credentials are configured"),
    ("HTTP off loopback, refused without credentials", f'[server]\ngrpc_addr = "127.0.0.1:0"\nhttp_addr = "{WIDE}:0"\n',
     {}, f"server.http_addr: {WIDE} is not a loopback address"),
    ("metrics off loopback, refused without credentials", LOCAL + f'metrics_addr = "{WIDE}:0"\n', {},
     f"server.metrics_addr: {WIDE} is not a loopback address"),
    ("unset PostgreSQL url_env", LOCAL + '[store]\nkind = "postgres"\nurl_env = "CRONOQ_TEST_UNSET_URL"\n', {},
     "store.url_env: the environment variable CRONOQ_TEST_UNSET_URL is not set"),
    ("a missing TLS file", LOCAL + '[server.tls]\ncert = "/nonexistent/cert.pem"\nkey = "/nonexistent/key.pem"\n', {},
     "server.tls.cert: no such file: /nonexistent/cert.pem"),
    ("a TLS key of another certificate", lambda tmp: LOCAL + _tls(tmp, matching=False), {},
     "server.tls: cannot load the certificate"),
    ("a SQLite file in a missing directory",
     lambda tmp: LOCAL + f'[store]\nkind = "sqlite"\npath = "{tmp / "missing" / "cronoq.db"}"\n', {},
     "store.path: the directory"),
]


@pytest.mark.parametrize("rule, config, env, expected", ENVIRONMENT_RULES, ids=[r[0] for r in ENVIRONMENT_RULES])
def test_check_and_startup_refuse_the_same_configurations(tmp_path, rule, config, env, expected):
    text = config(tmp_path) if callable(config) else config
    checked = check(tmp_path, text, env=env)
    started = start_and_fail(tmp_path, text, env=env)
    assert (checked.returncode, started.returncode) == (2, 2), (checked.stderr, started.stderr)
    assert expected in checked.stderr and expected in started.stderr, (checked.stderr, started.stderr)
    assert "configuration is valid" not in checked.stdout
    for secret in env.values():
        assert secret not in checked.stderr + started.stderr   # tokens never appear in output


def test_check_and_startup_accept_the_same_configurations_and_warn_alike(tmp_path, servers):
    text = LOCAL + '[[auth.tokens]]\ntoken_env = "CRONOQ_TEST_TOKEN"\nrole = "client"\n' + _tls(tmp_path, matching=True)
    env = {"CRONOQ_TEST_TOKEN": "y" * 20}
    checked = check(tmp_path, text, env=env)
    assert (checked.returncode, checked.stdout.strip()) == (0, "configuration is valid"), checked.stderr
    assert "only 20 characters; use at least 32" in checked.stderr and "y" * 20 not in checked.stderr
    server = servers(text, env=env)
    assert "only 20 characters; use at least 32" in server.log and "y" * 20 not in server.log


def test_a_file_holding_tokens_that_others_may_read_is_warned_about(tmp_path, servers):
    text = LOCAL + f'[[auth.tokens]]\ntoken = "{GOOD_TOKEN}"\nrole = "client"\n'
    path = tmp_path / "cronoq.toml"
    path.write_text(text)
    path.chmod(0o644)
    checked = run_cli("--config", str(path), "--check")
    assert checked.returncode == 0
    assert f"{path} holds tokens and may be read by other users (mode 644)" in checked.stderr
    path.chmod(0o600)
    assert "may be read by other users" not in run_cli("--config", str(path), "--check").stderr
    # Tokens from the environment: the file holds none, so its mode does not matter.
    path.write_text(LOCAL + '[[auth.tokens]]\ntoken_env = "CRONOQ_TEST_TOKEN"\nrole = "client"\n')
    path.chmod(0o644)
    quiet = run_cli("--config", str(path), "--check", env={"CRONOQ_TEST_TOKEN": GOOD_TOKEN})
    assert quiet.returncode == 0 and "may be read" not in quiet.stderr


def test_non_loopback_listeners_are_allowed_with_the_flag_or_with_credentials(servers):
    # Checked as startup checks it, without listening off loopback in a test.
    from cronoq.server.config import parse
    from cronoq.server.environment import check_environment

    text = '[server]\ngrpc_addr = "0.0.0.0:0"\nhttp_addr = "127.0.0.1:0"\n'   # (refused without the flag)
    assert check_environment(parse(text), insecure_no_auth=True, environ={}) == {}
    with_token = text + f'[[auth.tokens]]\ntoken = "{GOOD_TOKEN}"\nrole = "admin"\n'
    assert list(check_environment(parse(with_token), environ={}).values()) == [GOOD_TOKEN]
    # A server started with the flag (on loopback) says at WARNING that authentication is off.
    server = servers(LOCAL, args=("--insecure-no-auth",))
    assert "WARNING cronoq.server: authentication is off" in server.log


def test_authentication_off_is_a_warning_on_loopback_too(servers):
    server = servers(LOCAL)
    assert "WARNING cronoq.server: authentication is off: every caller is an admin (listening on loopback only)" \
        in server.log


def test_a_port_in_use_is_a_clear_failure(tmp_path):
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = start_and_fail(tmp_path, f'[server]\ngrpc_addr = "127.0.0.1:{port}"\nhttp_addr = "127.0.0.1:0"\n')
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_the_console_script_is_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'cronoq-server = "cronoq.server.__main__:main"' in text
    result = subprocess.run([sys.executable, "-c", "from cronoq.server.__main__ import main; raise SystemExit(main(['--check']))"],
                            capture_output=True, text=True, env=server_env(), cwd=ROOT, timeout=60)
    assert result.returncode == 0 and "configuration is valid" in result.stdout
    assert os.path.exists(ROOT / "cronoq" / "_proto" / "cronoq.proto")


def test_the_server_freezes_its_start_up_objects_before_it_serves():
    # A full collection then scans only what serving made (it stalled dispatch for
    # 40-50 ms when it scanned the modules too); asyncio.run stands in for serving here.
    probe = ("import gc, sys\n"
             "from cronoq.server import __main__ as m\n"
             "def serve(coro):\n"
             "    coro.close()\n"
             "    print('frozen', gc.get_freeze_count())\n"
             "    return 0\n"
             "m.asyncio.run = serve\n"
             "sys.exit(m.main([]))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=server_env(),
                            cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) > 1000, result.stdout
