"""cronoq.llm's pure parts: Retry-After parsing, the status mapping, the
token estimate and the worker's token debt (on a clock the test moves)."""

from __future__ import annotations

import email.utils
import json
import time

import pytest

from cronoq.core.errors import Permanent, Retryable
from cronoq.llm import LLMConfig, estimate_tokens, resources_for
from cronoq.llm.provider import outcome, retry_after
from cronoq.llm.transport import Response
from cronoq.llm.usage import TokenDebt


def answer(status: int, **headers: str) -> Response:
    return Response(status, {k.lower(): v for k, v in headers.items()},
                    json.dumps({"error": {"message": "slow down"}}).encode())


def test_retry_after_in_seconds_milliseconds_or_a_date():
    assert retry_after(answer(429, **{"retry-after": "7"})) == 7.0
    assert retry_after(answer(429, **{"retry-after-ms": "250"})) == 0.25
    later = email.utils.formatdate(time.time() + 120, usegmt=True)
    assert 100 < (retry_after(answer(503, **{"retry-after": later})) or 0) <= 120
    assert retry_after(answer(429)) is None and retry_after(answer(429, **{"retry-after": "soon"})) is None


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503])
def test_retryable_statuses(status):
    exc = outcome(answer(status, **{"retry-after": "3"}))
    assert isinstance(exc, Retryable) and exc.retry_after == 3.0 and "slow down" in str(exc)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_permanent_statuses_carry_the_providers_message(status):
    exc = outcome(answer(status))
    assert isinstance(exc, Permanent) and f"HTTP {status}" in str(exc) and "slow down" in str(exc)


def test_estimates_and_resources():
    assert estimate_tokens({"prompt": "x" * 40, "max_tokens": 100}) == 110
    assert estimate_tokens({"messages": [{"role": "user", "content": "abcd" * 5}], "system": "abcd"}) == 6
    assert resources_for({"prompt": "abcd"}, max_tokens=10) == {"llm-rpm": 1, "llm-tpm": 11}
    assert resources_for({"prompt": "abcd"}, rpm=None, tpm="tpm") == {"tpm": 1}


def test_token_debt_charges_only_the_excess_and_repays_at_the_rate():
    now = [0.0]
    debt = TokenDebt(600, clock=lambda: now[0])   # 10 tokens a second
    debt.charge(reserved=100, used=50)            # below the estimate: nothing owed, nothing given back
    assert debt.delay() == 0
    debt.charge(reserved=100, used=150)           # 50 over: 5 s at 10 a second
    assert debt.delay() == pytest.approx(5.0)
    now[0] = 2.0
    assert debt.delay() == pytest.approx(3.0)
    now[0] = 10.0
    assert debt.delay() == 0
    assert TokenDebt(0).delay() == 0


def test_the_worker_file(tmp_path):
    path = tmp_path / "llm.toml"
    path.write_text('[worker]\npool = "gen"\nslots = 3\n[defaults]\nmodel = "m1"\nallowed_models = ["m1"]\n'
                    '[prices."m1"]\nprompt_per_1k = 1.0\ncompletion_per_1k = 2.0\n')
    config = LLMConfig.load(path)
    assert (config.pool, config.slots, config.model, config.allowed_models) == ("gen", 3, "m1", ("m1",))
    assert config.price("m1").cost(1000, 500) == 2.0 and config.price("other").cost(10, 10) == 0
    path.write_text('[worker]\nslotz = 3\n')
    with pytest.raises(ValueError, match="slotz"):
        LLMConfig.load(path)
    with pytest.raises(ValueError, match="fallback_kind"):
        LLMConfig(fallback_kind="llm.draw")


def test_the_llm_worker_freezes_its_start_up_objects_before_it_serves(tmp_path):
    # As cronoq-server: a full collection then scans only what serving made (asyncio.run
    # stands in for serving here).
    import subprocess
    import sys

    from serverkit import ROOT, server_env

    config = tmp_path / "llm.toml"
    config.write_text('[worker]\ntarget = "127.0.0.1:1"\npool = "llm"\nslots = 2\n'
                      '[provider]\nbase_url = "http://127.0.0.1:1/v1"\n[defaults]\nmodel = "m"\n')
    probe = ("import gc, sys\n"
             "from cronoq.llm import cli\n"
             "def serve(coro):\n"
             "    coro.close()\n"
             "    print('frozen', gc.get_freeze_count())\n"
             "cli.asyncio.run = serve\n"
             f"sys.exit(cli.main(['--config', {str(config)!r}]))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=server_env(),
                            cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) > 1000, result.stdout
