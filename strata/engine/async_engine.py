"""`AsyncEngine`: an `LLMEngine` stepping in one background thread, streamed to asyncio callers.

The two sides talk only through plain messages, so the engine can later move to its own process
(DESIGN.md, "Process layout") by replacing the two queues with a socket:

- API side -> engine thread: `Submit` / `Abort` / `_Shutdown` on a thread-safe inbox.
- engine thread -> API side: after each step, one list of outputs (`TokenEvent`, `ErrorEvent` or
  `Rejected`), handed to `_route`, which demultiplexes them by request id onto each stream's
  `asyncio.Queue` through `loop.call_soon_threadsafe`.

The `LLMEngine` object is touched ONLY by the engine thread: its scheduler, block manager and model
state have no locks. The API side owns only the routing table (under `_lock`) and reads the
`Stats` snapshot the engine thread publishes. A request id stays "in use" until its finished event
comes back, even when its consumer has gone, so late events can never reach a newer stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from strata.engine.llm_engine import LLMEngine, TokenEvent
from strata.engine.request import Request
from strata.engine.sampler import SamplingParams
from strata.engine.think_budget import ThinkBudget

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submit:
    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    priority: int = 0
    think: ThinkBudget | None = None


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class _Shutdown:  # close(): abort everything, then the thread exits
    pass


@dataclass(frozen=True)
class Rejected:
    """`add_request` refused a Submit; `error` is the original exception (EngineBusy, ValueError...)."""

    request_id: str
    error: Exception


@dataclass(frozen=True)
class ErrorEvent(TokenEvent):
    """A request's final event when it failed (finish_reason "error"); `error` says why."""

    error: str = ""


class EngineDead(RuntimeError):
    """The engine loop died of an unexpected exception; the server must be restarted."""


@dataclass(frozen=True)
class Stats:
    """A snapshot published by the engine thread (safe to read from any thread)."""

    idle: bool = True  # the thread is blocked waiting for a message, with no work
    iterations: int = 0  # loop turns; stays put while idle (no busy spin)
    steps: int = 0
    num_waiting: int = 0
    num_running: int = 0
    num_free_blocks: int = 0
    num_preemptions: int = 0
    num_admissions: int = 0  # requests moved into running, counting re-admissions after preemption


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[TokenEvent | Rejected] = field(default_factory=asyncio.Queue)
    detached: bool = False  # the consumer left; drop its events until the finished one


_Output = TokenEvent | Rejected
_State = Literal["new", "running", "closed", "dead"]


def _put_all(items: list[tuple[asyncio.Queue[_Output], _Output]]) -> None:
    for q, item in items:
        q.put_nowait(item)


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self._engine = engine  # engine thread only, once started
        self._inbox: queue.SimpleQueue[Submit | Abort | _Shutdown] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _streams and _state
        self._streams: dict[str, _Stream] = {}
        self._state: _State = "new"
        self._thread = threading.Thread(target=self._run, name="strata-engine", daemon=True)
        self._requests: dict[str, Request] = {}  # engine thread only: live requests, for error messages
        self._stats = Stats(num_free_blocks=engine.blocks.num_free_blocks)

    # ---- API side -------------------------------------------------------------------------------

    def start(self) -> AsyncEngine:
        with self._lock:
            if self._state != "new":
                raise RuntimeError(f"the engine is {self._state}; start() runs once")
            self._state = "running"
        self._thread.start()
        return self

    def close(self) -> None:
        """Abort every request, stop and join the engine thread; idempotent. Streams end with "abort"."""
        with self._lock:
            started = self._state != "new"
            if self._state != "dead":
                self._state = "closed"
        if started:
            self._inbox.put(_Shutdown())
            self._thread.join()
        # Anything the thread never answered (it died, or never ran) still gets its end.
        self._end_all(lambda rid: TokenEvent(rid, None, "", True, "abort"))

    def __enter__(self) -> AsyncEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> AsyncEngine:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)  # join off the event loop: a step may be in flight

    @property
    def is_running(self) -> bool:
        return self._state == "running" and self._thread.is_alive()

    def num_live(self) -> int:
        """Requests submitted whose finished event has not come back yet (including abandoned ones)."""
        with self._lock:
            return len(self._streams)

    def stats(self) -> Stats:
        return self._stats

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        priority: int = 0,
        think: ThinkBudget | None = None,
    ) -> AsyncIterator[TokenEvent]:
        """Stream one request's events, ending after its finished event.

        Submission errors (EngineBusy, ValueError) raise from the first `__anext__` as they were.
        Leaving early (break, `aclose()`, cancellation) aborts the request so its KV blocks are freed;
        wrap the stream in `contextlib.aclosing` so that happens at once rather than at GC time.
        """
        request_id = request_id if request_id is not None else f"req-{uuid.uuid4().hex}"
        stream = _Stream(asyncio.get_running_loop())
        with self._lock:  # check, register and submit atomically, so close() cannot slip between
            if self._state != "running":
                raise (EngineDead if self._state == "dead" else RuntimeError)(
                    f"the engine is {self._state}; it takes no requests"
                )
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._streams[request_id] = stream
            self._inbox.put(Submit(request_id, tuple(prompt_ids), params, priority, think))
        try:
            while True:
                item = await stream.events.get()
                if isinstance(item, Rejected):
                    raise item.error
                yield item
                if item.finished:
                    return
        finally:
            with self._lock:
                if self._streams.get(request_id) is stream:  # still live in the engine: abort it
                    stream.detached = True
                    self._inbox.put(Abort(request_id))

    def _route(self, outputs: list[_Output]) -> None:
        """Deliver outputs to their streams (runs on the engine thread; touches no engine state)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[_Output], _Output]]] = {}
        with self._lock:
            for item in outputs:
                stream = self._streams.get(item.request_id)
                if stream is None:
                    continue
                if isinstance(item, Rejected) or item.finished:
                    del self._streams[item.request_id]
                if not stream.detached:
                    by_loop.setdefault(stream.loop, []).append((stream.events, item))
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody is left to read these
                loop.call_soon_threadsafe(_put_all, items)

    def _end_all(self, make: Callable[[str], _Output]) -> None:
        """End every stream still registered with the output `make` gives for its id."""
        with self._lock:
            ids = list(self._streams)
        self._route([make(rid) for rid in ids])

    # ---- engine thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # never die silently: fail every stream, refuse new work
            logger.exception("the engine loop crashed; failing every live request")
            message = f"the engine loop crashed: {type(e).__name__}: {e}"
            with self._lock:
                self._state = "dead"
            self._end_all(lambda rid: ErrorEvent(rid, None, "", True, "error", error=message))

    def _serve(self) -> None:
        engine, iterations, steps = self._engine, 0, 0
        while True:
            iterations += 1
            idle = not engine.has_unfinished()
            self._stats = self._snapshot(idle, iterations, steps)
            # Block only when there is nothing to step: an idle engine sleeps, it never spins.
            messages = [self._inbox.get()] if idle else []
            with contextlib.suppress(queue.Empty):
                while True:
                    messages.append(self._inbox.get_nowait())
            for message in messages:
                if isinstance(message, _Shutdown):
                    for request_id in list(self._requests):
                        engine.abort(request_id)
                    self._emit(engine.step() if engine.has_unfinished() else [])  # reaps the aborts
                    self._stats = self._snapshot(True, iterations, steps)
                    return
                self._handle(message)
            if engine.has_unfinished():
                self._emit(engine.step())
                steps += 1

    def _handle(self, message: Submit | Abort) -> None:
        if isinstance(message, Abort):
            self._engine.abort(message.request_id)
            return
        try:
            request = self._engine.add_request(
                list(message.prompt_ids), message.params, message.request_id, message.priority, message.think
            )
        except Exception as e:  # the caller's problem, not the loop's: hand it back as it was
            self._route([Rejected(message.request_id, e)])
            return
        self._requests[message.request_id] = request

    def _emit(self, events: list[TokenEvent]) -> None:
        outputs: list[_Output] = []
        for event in events:
            if event.finished:
                request = self._requests.pop(event.request_id, None)
                if event.finish_reason == "error":
                    error = (request.error if request else None) or "the request failed"
                    logger.warning("request %s failed: %s", event.request_id, error)
                    event = ErrorEvent(event.request_id, None, "", True, "error", error=error)
            outputs.append(event)
        self._route(outputs)

    def _snapshot(self, idle: bool, iterations: int, steps: int) -> Stats:
        s, free = self._engine.scheduler, self._engine.blocks.num_free_blocks
        running, waiting = len(s.running), s.num_waiting
        return Stats(idle, iterations, steps, waiting, running, free, s.num_preemptions, s.num_admissions)
