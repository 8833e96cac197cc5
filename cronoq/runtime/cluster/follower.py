"""The follower's side of a cluster: calls sent to the leader through the
store's inbox and their answers, and the handles of tasks watched until the
store says they ended."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any, Iterable

from ... import realtime
from ...core.errors import SchedulerError
from ...store.base import LeaderUnavailable, StoreUnavailable
from ...store.cluster import Incoming, Outgoing, Wants
from ..handle import TaskHandle
from .hub import Hub
from .wire import decode_error, encode_error, pack

__all__ = ["FollowerSide"]


class _Call:
    """A call waiting for the leader's answer."""

    __slots__ = ("future", "seq", "kind", "body", "payload")

    def __init__(self, future: asyncio.Future[Any], kind: str, body: str, payload: bytes | None) -> None:
        self.future = future
        self.seq: int | None = None
        self.kind = kind
        self.body = body
        self.payload = payload


class FollowerSide:
    def __init__(self, cluster: Hub, request_timeout: float) -> None:
        self.cluster = cluster
        self.request_timeout = request_timeout
        self._tokens = itertools.count(1)
        self.calls: dict[int, _Call] = {}          # token -> call not answered yet
        self.by_seq: dict[int, int] = {}           # inbox seq -> token
        self.to_send: list[int] = []               # tokens not written yet
        self.withdraw: list[int] = []              # seqs to take back
        self.forget: list[int] = []                # answered seqs whose rows go
        self.watching: dict[int, list[TaskHandle]] = {}
        self.watch_new = False

    async def request(self, kind: str, body: dict[str, Any], payloads: Iterable[bytes] = ()) -> Any:
        """Send a call to the leader and wait for its answer (raising the
        error it answered with). Gives up after ``request_timeout``: the call
        is taken back if no leader took it (``LeaderUnavailable``)."""
        cluster = self.cluster
        if cluster.stopping:
            raise SchedulerError("the scheduler is shut down")
        loop = cluster.loop
        assert loop is not None
        data = list(payloads)
        call = _Call(loop.create_future(), kind, json.dumps(body, separators=(",", ":")),
                     pack(data) if data else None)
        token = next(self._tokens)
        self.calls[token] = call
        self.to_send.append(token)
        cluster.wake()
        try:
            answer = await realtime.wait_for(asyncio.shield(call.future), self.request_timeout)
        except asyncio.TimeoutError:
            answer = await self._take_back(token, call)
        if "error" in answer:
            raise decode_error(answer["error"])
        return answer.get("ok")

    async def _take_back(self, token: int, call: _Call) -> dict[str, Any]:
        if call.seq is None and token in self.to_send:
            self.to_send.remove(token)
            self.calls.pop(token, None)
        elif call.seq is not None:
            # Deleted if still unanswered (then LeaderUnavailable), else its answer is read.
            self.withdraw.append(call.seq)
            self.cluster.wake()
            try:
                return dict(await realtime.wait_for(asyncio.shield(call.future), max(10.0, self.cluster.poll * 10)))
            except asyncio.TimeoutError:
                pass
        raise LeaderUnavailable(f"no process that leads the store answered within {self.request_timeout:g} s "
                                f"(leadership is moving, or none leads): the call was not carried out; "
                                f"call again")

    def watch(self, handle: TaskHandle) -> None:
        """Resolve ``handle`` when the store says its task ended."""
        self.watching.setdefault(handle.id, []).append(handle)
        self.watch_new = True
        self.cluster.wake()

    def watched_handles(self) -> int:
        return sum(len(handles) for handles in self.watching.values())

    def answer_here(self, seq: int, answer: dict[str, Any]) -> bool:
        """This process, now leading, carried out its own call ``seq`` (made
        while it followed): answer it here. False if it is not one of ours."""
        token = self.by_seq.get(seq)
        call = self.calls.get(token) if token is not None else None
        if call is None:
            return False
        self.by_seq.pop(seq, None)
        self.calls.pop(token, None)   # type: ignore[arg-type]
        if not call.future.done():
            call.future.set_result(answer)
        self.forget.append(seq)
        return True

    def stop(self) -> None:
        """Leaving: every waiting call and watched handle fails."""
        error = SchedulerError("the scheduler shut down")
        for call in self.calls.values():
            if not call.future.done():
                call.future.set_exception(error)
        self.calls.clear()
        for handles in self.watching.values():
            for handle in handles:
                handle.set_failure("shutdown", "the scheduler shut down before the task finished")
        self.watching.clear()

    # ------------------------------------------------------------ one cycle

    def collect_writes(self, out: Outgoing) -> None:
        for token in self.to_send:
            call = self.calls.get(token)
            if call is not None:
                out.requests.append((token, call.kind, call.body, call.payload))
        self.to_send = []
        out.forget, self.forget = self.forget, []

    def collect_wants(self, want: Wants) -> None:
        want.force = want.force or self.watch_new or bool(self.withdraw)   # withdrawals: see withdrawn()
        self.watch_new = False
        want.answers = [call.seq for call in self.calls.values() if call.seq is not None]
        want.tasks = list(self.watching)

    def requeue(self, out: Outgoing) -> None:
        self.to_send[:0] = [token for token, *_ in out.requests]
        self.forget[:0] = out.forget

    def unsent(self, out: Outgoing, exc: BaseException) -> None:
        """The calls of ``out`` could not even be written: they fail now
        (nothing of them was carried out)."""
        failed = encode_error(StoreUnavailable(
            f"the store is unavailable, the call was not sent to the leader: {exc}"))
        for token, *_ in out.requests:
            call = self.calls.pop(token, None)
            if call is not None and not call.future.done():
                call.future.set_result({"error": failed})
        out.requests = []

    def withdrawn(self, seqs: list[int]) -> None:
        """Calls taken back before any leader carried them out."""
        for seq in seqs:
            token = self.by_seq.pop(seq, None)
            call = self.calls.pop(token, None) if token is not None else None
            if call is not None and not call.future.done():
                call.future.set_result({"error": encode_error(LeaderUnavailable(
                    f"no process that leads the store answered within {self.request_timeout:g} s (leadership "
                    f"is moving, or none leads): the call was taken back, nothing of it was carried out; "
                    f"call again"))})

    def apply(self, got: Incoming) -> None:
        for token, seq in got.seqs.items():
            call = self.calls.get(token)
            if call is not None:
                call.seq = seq
                self.by_seq[seq] = token
        for seq, text in got.answers.items():
            answered = self.by_seq.pop(seq, None)
            self.forget.append(seq)
            call = self.calls.pop(answered, None) if answered is not None else None
            if call is not None and not call.future.done():
                try:
                    call.future.set_result(json.loads(text))
                except ValueError:
                    call.future.set_result({"error": {"type": "SchedulerError",
                                                      "args": ["the leader's answer could not be read"]}})
        for task_id, status, attempt, message, output in got.finished:
            handles = self.watching.pop(task_id, None)
            if handles:
                self._resolve(handles, status, message, output)

    def _resolve(self, handles: list[TaskHandle], status: str, message: str | None, output: bytes | None) -> None:
        if status == "succeeded":
            if output is None:
                for handle in handles:
                    handle.set_failure(status, "the task succeeded but its output is no longer available (the "
                                               "store has none: it could not be encoded, or was pruned)")
                return
            try:
                value = self.cluster.codec.decode(output)
            except Exception as exc:
                for handle in handles:
                    handle.set_failure(status, f"the task succeeded but its output could not be decoded: {exc}")
                return
            for handle in handles:
                handle.set_result(value)
        else:
            for handle in handles:
                handle.set_failure(status, message)

    def busy(self) -> bool:
        return bool(self.calls or self.watching or self.forget or self.withdraw)

    def waits_for_answers(self) -> bool:
        return bool(self.calls or self.withdraw)

