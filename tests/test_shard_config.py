"""The [[shards]] rules of the configuration (docs/server.md, "Sharding")."""

from __future__ import annotations

import pytest

from cronoq.core.engine import Core
from cronoq.core.types import CoreConfig, PoolConfig, TaskSpec, first_id, shard_of
from cronoq.server.config import ConfigError, parse

POOLS = '[[pools]]\nname = "default"\n[[pools]]\nname = "llm"\n'
SHARDS = """
[[shards]]
name = "cpu"
number = 1
pools = ["default"]
endpoint = "https://cpu.internal:7070"
[[shards]]
name = "gpu"
number = 2
pools = ["llm"]
endpoint = "https://gpu.internal:7070"
"""


def errors(text: str, shard: str | None = "cpu") -> str:
    with pytest.raises(ConfigError) as caught:
        parse(text, shard=shard)
    return str(caught.value)


def test_a_valid_sharded_file_gives_each_server_its_shard():
    text = POOLS + SHARDS + """
[store]
kind = "postgres"
url = "postgresql://h/db"
[[resources]]
name = "api_gpu"
kind = "token_bucket"
rate = 4
burst = 4
shard = "gpu"
[[recurring]]
name = "nightly"
cron = "0 3 * * *"
pool = "llm"
"""
    config = parse(text, shard="gpu")
    mine = config.for_shard()
    assert config.shard is not None and config.shard.number == 2
    assert [p.name for p in mine.pools] == ["llm"] and [p.name for p in mine.all_pools] == ["default", "llm"]
    assert [r.name for r in mine.resources] == ["api_gpu"] and [r.name for r in mine.recurring] == ["nightly"]
    assert mine.store.schema == "cronoq_gpu"   # the default schema per shard
    assert mine.default_pool == "default"      # a task without a pool goes to shard cpu
    cpu = parse(text, shard="cpu").for_shard()
    assert cpu.resources == () and cpu.recurring == () and cpu.store.schema == "cronoq_cpu"


def test_a_sqlite_path_and_a_schema_take_the_shard_name():
    sqlite = parse(POOLS + SHARDS + '[store]\nkind = "sqlite"\npath = "state-{shard}.db"\n', shard="gpu")
    assert sqlite.for_shard().store.path == "state-gpu.db"
    pg = parse(POOLS + SHARDS + '[store]\nkind = "postgres"\nurl = "postgresql://h/db"\nschema = "q_{shard}"\n',
               shard="cpu")
    assert pg.for_shard().store.schema == "q_cpu"


@pytest.mark.parametrize("text,shard,expected", [
    (POOLS + SHARDS, None, "server.shard: is required with [[shards]] (or --shard): one of cpu, gpu"),
    (POOLS + SHARDS, "tpu", "server.shard: unknown shard 'tpu' (the shards: cpu, gpu)"),
    (POOLS, "cpu", "server.shard: names shard 'cpu', but there are no [[shards]]"),
    (POOLS + SHARDS.replace("number = 2", "number = 1"), "cpu", "shards[1].number: duplicate shard number 1"),
    (POOLS + SHARDS.replace('name = "gpu"', 'name = "cpu"'), "cpu", "shards[1].name: duplicate shard name 'cpu'"),
    (POOLS + SHARDS.replace("gpu.internal", "cpu.internal"), "cpu", "shards[1].endpoint: duplicate shard endpoint"),
    (POOLS + SHARDS.replace('["llm"]', '["llm", "default"]'), "cpu",
     "shards[1].pools: pool 'default' is already in shard 'cpu'"),
    (POOLS + SHARDS.replace('["llm"]', '["nope"]'), "cpu", "shards[1].pools: names unknown pool 'nope'"),
    (POOLS + '[[pools]]\nname = "x"\n' + SHARDS, "cpu", "shards: pools 'x' are in no shard"),
    (POOLS + SHARDS.replace("number = 2", "number = 256"), "cpu", "shards[1].number: must be between 1 and 255"),
    (POOLS + SHARDS.replace("https://gpu.internal:7070", "gpu.internal:7070"), "cpu",
     "shards[1].endpoint: must start with http:// or https://"),
    (POOLS + SHARDS + '[store]\nkind = "sqlite"\npath = "state.db"\n', "cpu", "store.path: must contain {shard}"),
    (POOLS + SHARDS + '[store]\nkind = "postgres"\nurl = "postgresql://h/db"\nschema = "one"\n', "cpu",
     "store.schema: must contain {shard}"),
    (POOLS + SHARDS + '[[resources]]\nname = "r"\nkind = "semaphore"\npermits = 1\n', "cpu",
     "resources: 'r' needs shard = one of cpu, gpu"),
    (POOLS + SHARDS + '[[resources]]\nname = "r"\nkind = "semaphore"\npermits = 1\nshard = "tpu"\n', "cpu",
     "resources: 'r' names unknown shard 'tpu'"),
    (POOLS + '[[resources]]\nname = "r"\nkind = "semaphore"\npermits = 1\nshard = "cpu"\n', None,
     "resources: 'r' names shard 'cpu', but there are no [[shards]]"),
    (POOLS + SHARDS + '[[resources]]\nname = "r"\nkind = "semaphore"\npermits = 1\nshard = "cpu"\n'
     '[[recurring]]\nname = "n"\ncron = "* * * * *"\npool = "llm"\nresources = { r = 1 }\n', "cpu",
     "recurring: 'n' uses resource 'r' of shard 'cpu', but its pool is in shard 'gpu'"),
    (POOLS + SHARDS + '[server.peer_tls]\ncert = "c.pem"\n', "cpu", "server.peer_tls: give both cert and key"),
])
def test_each_sharding_rule_is_refused_naming_the_key(text, shard, expected):
    assert expected in errors(text, shard)


def test_ids_carry_the_shard_number_in_their_top_bits():
    config = CoreConfig(shard=7, epoch=3)
    core = Core(config, [PoolConfig("default")], now=0)
    task_id, _ = core.submit(0, TaskSpec({}))
    assert shard_of(task_id) == 7 and task_id == first_id(7, 3)
    assert shard_of(Core(CoreConfig(epoch=3), [PoolConfig("default")], now=0).submit(0, TaskSpec({}))[0]) == 0
    # The epoch keeps 12 bits under the shard: a wrapped epoch never reaches into the shard's bits.
    assert shard_of(first_id(7, 4096 + 5)) == 7
    with pytest.raises(ValueError, match="shard must be a number from 0 to 255"):
        CoreConfig(shard=256)


def test_peer_channels_try_a_shard_again_within_seconds_however_long_it_was_down():
    # gRPC's default reconnect backoff grows to 120 s: a shard back after a long
    # outage would be named unavailable for up to two minutes more.
    from cronoq.server.shards import PEER_RECONNECT_MAX_S, Peers

    options = dict(Peers(parse(POOLS + SHARDS, shard="cpu"))._options)
    assert options["grpc.max_reconnect_backoff_ms"] == PEER_RECONNECT_MAX_S * 1000 <= 5000
    assert options["grpc.initial_reconnect_backoff_ms"] <= options["grpc.max_reconnect_backoff_ms"]
