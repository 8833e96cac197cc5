"""run_llm_task and the llm_batch prompt through cronoq-mcp (a process, over
stdio) against a real cronoq-server, cronoq-llm's worker and the local
OpenAI fake; the existing tools read and cancel llm tasks."""

from __future__ import annotations

import asyncio

import pytest

from cronoq.client import Client
from mcpkit import stdio_session, structured
from openai_fake import Reply
from test_llm_worker import config, fake, llm_worker, server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.asyncio


async def test_run_llm_task_returns_the_text_usage_and_cost(server, fake):  # noqa: F811
    async with llm_worker(server, fake), stdio_session(server.target, None) as session:
        answer = structured(await session.call_tool("run_llm_task", {
            "prompt": "hi", "system": "be brief", "max_tokens": 20, "priority": "high",
            "rpm_resource": "llm-rpm", "wait_timeout": 60}))
        assert answer["status"] == "succeeded" and answer["text"] == "hello from the fake"
        assert answer["usage"]["completion_tokens"] == 4 and answer["cost"] > 0
        info = structured(await session.call_tool("get_task", {"task": answer["id"]}))
        assert info["kind"] == "llm.chat" and info["priority"] == "high"
        emb = structured(await session.call_tool("run_llm_task", {"prompt": "vector me", "kind": "llm.embed"}))
        assert emb["embeddings"] == [[9.0, 0.5, 0.0]]
        prompt = await session.get_prompt("llm_batch", {"prompts": "one\ntwo\nthree", "model": "gpt-test"})
        text = prompt.messages[0].content.text
        assert "3 prompts" in text and '"model": "gpt-test"' in text and 'priority "low"' in text
    sent = [r.body for r in fake.requests if r.path == "/v1/chat/completions"]
    assert sent[0]["messages"][0] == {"role": "system", "content": "be brief"} and sent[0]["max_tokens"] == 20


async def test_cancel_task_aborts_a_streaming_llm_task(server, fake):  # noqa: F811
    fake.default = Reply(chunks=10_000, chunk_delay=0.01)
    async with llm_worker(server, fake), stdio_session(server.target, None) as session, \
            Client(server.target) as client:
        sub = await client.submit({"prompt": "forever", "stream": True}, pool="llm", kind="llm.chat")
        await asyncio.to_thread(fake.wait_requests, 1)
        assert structured(await session.call_tool("cancel_task", {"task": sub.id}))["cancelled"] is True
        await asyncio.to_thread(fake.wait_disconnects, 1)
        result = structured(await session.call_tool("wait_task", {"task": sub.id, "timeout": 30}))
    assert result["status"] == "cancelled"
