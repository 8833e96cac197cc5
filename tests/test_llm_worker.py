"""cronoq.llm's worker against a real cronoq-server and a local fake of the
OpenAI API (tests/openai_fake.py): the three kinds, streaming with progress,
the provider's failures mapped to retryable or permanent outcomes, the
provider's Retry-After honoured, cancel closing the stream, usage and cost
counted, and the server's token bucket pacing the requests. Nothing
reaches the network."""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

import httpx
import pytest

from cronoq.client import Client
from cronoq.llm import LLMConfig, LLMWorker, Price, resources_for
from openai_fake import FakeOpenAI, Reply
from serverkit import LISTEN, sqlite_store

pytestmark = pytest.mark.asyncio


def config(path) -> str:
    return LISTEN + sqlite_store(path) + """
[[pools]]
name = "llm"
retry = { max_attempts = 3, initial_backoff_s = 0.05, jitter = false }

[[resources]]
name = "llm-rpm"
kind = "token_bucket"
rate = 2.0
burst = 2
"""


@pytest.fixture(scope="module")
def server(module_servers, tmp_path_factory):
    return module_servers(config(tmp_path_factory.mktemp("llm") / "server.db"), name="llm")


@pytest.fixture
def fake():
    with FakeOpenAI() as running:
        yield running


@contextlib.asynccontextmanager
async def llm_worker(server, fake, **options) -> AsyncIterator[LLMWorker]:
    settings = dict(target=server.target, pool="llm", slots=4, base_url=fake.base_url, model="gpt-test",
                    prices={"gpt-test": Price(prompt_per_1k=1.0, completion_per_1k=2.0)},
                    metrics_addr="127.0.0.1:0", progress_every=4)
    settings.update(options)
    worker = LLMWorker(LLMConfig(**settings), initial_backoff=0.05)   # type: ignore[arg-type]
    running = asyncio.create_task(worker.run(handle_signals=False))
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)


async def test_chat_returns_the_text_usage_and_cost_and_counts_them(server, fake):
    async with llm_worker(server, fake, system="be brief", temperature=0.2) as worker, Client(server.target) as client:
        sub = await client.submit({"prompt": "hi there", "max_tokens": 50}, pool="llm", kind="llm.chat",
                                  wait=True, wait_timeout=30)
        assert sub.result is not None and sub.result.ok, sub.result
        out = sub.result.json()
        assert out["text"] == "hello from the fake" and out["model"] == "gpt-test"
        assert out["finish_reason"] == "stop"
        usage = out["usage"]
        assert usage["completion_tokens"] == 4 and usage["prompt_tokens"] > 0
        assert out["cost"] == pytest.approx((usage["prompt_tokens"] * 1.0 + 4 * 2.0) / 1000)
        sent = fake.requests[-1]
        assert sent.path == "/v1/chat/completions"
        assert sent.body["messages"][0] == {"role": "system", "content": "be brief"}
        assert sent.body["temperature"] == 0.2 and sent.body["max_tokens"] == 50
        async with httpx.AsyncClient(trust_env=False) as http:
            text = (await http.get(f"http://127.0.0.1:{worker.metrics_port}/metrics")).text
    assert 'cronoq_llm_completion_tokens_total{model="gpt-test",pool="llm"} 4' in text
    assert 'cronoq_llm_requests_total{model="gpt-test",pool="llm",outcome="ok"} 1' in text
    assert f'cronoq_llm_prompt_tokens_total{{model="gpt-test",pool="llm"}} {usage["prompt_tokens"]}' in text


async def test_complete_and_embed(server, fake):
    async with llm_worker(server, fake), Client(server.target) as client:
        done = await client.submit({"prompt": "once upon"}, pool="llm", kind="llm.complete", wait=True,
                                   wait_timeout=30)
        assert done.result is not None and done.result.json()["text"] == "hello from the fake"
        assert fake.requests[-1].path == "/v1/completions"
        emb = await client.submit({"input": ["a", "bbb"], "model": "emb-test"}, pool="llm", kind="llm.embed",
                                  wait=True, wait_timeout=30)
        assert emb.result is not None and emb.result.ok
        out = emb.result.json()
    assert out["embeddings"] == [[1.0, 0.5, 0.0], [3.0, 0.5, 1.0]]
    assert out["model"] == "emb-test" and out["usage"]["prompt_tokens"] > 0
    assert fake.requests[-1].path == "/v1/embeddings"


async def test_streaming_reports_progress_and_counts_the_usage_chunk(server, fake):
    fake.default = Reply(chunks=20)
    async with llm_worker(server, fake) as worker, Client(server.target) as client:
        events = []

        async def watch():   # what `cronoq watch` shows: a status event per progress checkpoint
            async for event in client.watch(pools=["llm"]):
                events.append(event)
                if event.status == "succeeded":
                    return

        watching = asyncio.create_task(watch())
        await asyncio.sleep(0.2)   # the watch is open before the task is submitted
        sub = await client.submit({"prompt": "tell a story", "stream": True}, pool="llm", kind="llm.chat",
                                  wait=True, wait_timeout=30)
        assert sub.result is not None and sub.result.ok, sub.result
        out = sub.result.json()
        info = await client.get(sub.id)
        await asyncio.wait_for(watching, 30)
    assert [e.stage for e in events if e.id == sub.id and e.stage] == ["progress"] * 5
    assert out["text"] == " ".join(f"t{i}" for i in range(20))
    assert out["usage"]["completion_tokens"] == 20
    progress = [c for c in info.checkpoints if c.stage == "progress"]
    assert progress and progress[-1].data["tokens"] == 20   # every 4 chunks, the last at 20
    assert fake.requests[-1].body["stream"] is True
    assert worker.usage.completion_tokens["gpt-test", "llm"] == 20


async def test_a_429_waits_the_retry_after_it_names(server, fake):
    fake.script = [Reply(status=429, headers={"Retry-After": "1"})]
    async with llm_worker(server, fake) as worker, Client(server.target) as client:
        sub = await client.submit({"prompt": "x"}, pool="llm", kind="llm.chat", wait=True, wait_timeout=30)
        assert sub.result is not None and sub.result.ok, sub.result
        info = await client.get(sub.id)
    first, second = info.attempts[0], info.attempts[1]
    assert "HTTP 429" in (first.message or "") and "scripted 429" in (first.message or "")
    assert first.ended is not None and second.started is not None
    assert second.started - first.ended >= 1.0   # the server's times: the retry waited the Retry-After
    assert worker.usage.requests["gpt-test", "llm", "retryable"] == 1


async def test_failures_retryable_or_permanent(server, fake):
    fake.script = [Reply(status=500), Reply(body=b"{not json"), Reply(status=400)]
    async with llm_worker(server, fake, slots=1), Client(server.target) as client:
        bad = await client.submit({"prompt": "x"}, pool="llm", kind="llm.chat", wait=True, wait_timeout=30)
        assert bad.result is not None and not bad.result.ok
        info = await client.get(bad.id)
        assert info.status == "failed" and [a.attempt for a in info.attempts] == [1, 2, 3]
        assert "HTTP 500" in (info.attempts[0].message or "")
        assert "not JSON" in (info.attempts[1].message or "")
        assert "HTTP 400" in (info.attempts[2].message or "") and "scripted 400" in (info.message or "")
        fake.script = [Reply(status=401)]
        denied = await client.submit({"prompt": "x"}, pool="llm", kind="llm.chat", wait=True, wait_timeout=30)
        info = await client.get(denied.id)
    assert info.status == "failed" and len(info.attempts) == 1   # permanent: no retry


async def test_unknown_kinds_and_models_fail_permanently_or_fall_back(server, fake):
    async with llm_worker(server, fake, allowed_models=("gpt-test",)), Client(server.target) as client:
        odd = await client.submit({"prompt": "x"}, pool="llm", kind="llm.draw", wait=True, wait_timeout=30)
        info = await client.get(odd.id)
        assert info.status == "failed" and len(info.attempts) == 1
        assert "llm.chat, llm.complete, llm.embed" in (info.message or "")
        other = await client.submit({"prompt": "x", "model": "gpt-huge"}, pool="llm", kind="llm.chat", wait=True,
                                    wait_timeout=30)
        info = await client.get(other.id)
        assert info.status == "failed" and "not allowed" in (info.message or "")
    async with llm_worker(server, fake, fallback_kind="llm.chat"), Client(server.target) as client:
        odd = await client.submit({"prompt": "x"}, pool="llm", kind="summarise", wait=True, wait_timeout=30)
        assert odd.result is not None and odd.result.json()["text"] == "hello from the fake"


async def test_cancel_closes_the_stream(server, fake):
    fake.default = Reply(chunks=10_000, chunk_delay=0.01)
    async with llm_worker(server, fake), Client(server.target) as client:
        sub = await client.submit({"prompt": "go on forever", "stream": True}, pool="llm", kind="llm.chat")
        await asyncio.to_thread(fake.wait_requests, 1)
        assert await client.cancel(sub.id)
        await asyncio.to_thread(fake.wait_disconnects, 1)
        result = await client.wait(sub.id, timeout=30)
    assert result.status == "cancelled"


async def test_the_request_bucket_paces_dispatches(server, fake):
    # llm-rpm: 2 a second, burst 2. Submit 8: by the server's start times,
    # no more than 2 + 2 t may have started t seconds after the first.
    async with llm_worker(server, fake, slots=8), Client(server.target) as client:
        subs = await client.submit_batch([
            {"payload": {"prompt": f"p{i}"}, "pool": "llm", "kind": "llm.chat",
             "resources": resources_for({"prompt": f"p{i}"}, tpm=None), "priority": "low"} for i in range(8)])
        results = [await client.wait(s.id, timeout=60) for s in subs]
        assert all(r.ok for r in results)
        starts = sorted([(await client.get(s.id)).started or 0.0 for s in subs])
    first = starts[0]
    for n, started in enumerate(starts, start=1):
        assert n <= 2 + 2.0 * (started - first) + 1e-3, (n, started - first, starts)
    assert starts[-1] - first >= 2.9   # 6 beyond the burst at 2 a second
