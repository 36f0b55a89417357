"""AsyncLLM: vLLM's asyncio engine. Many coroutines share one engine, which runs on its own
thread; each generate() is an async iterator of that request's outputs.

How outputs reach the event loop: the engine thread puts them in a C++ queue and signals an
eventfd; the loop watches the fd (loop.add_reader) and, on its own thread, drains the queue and
hands each output to its request's asyncio.Queue. No Python runs on the engine thread.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from . import _vesper
from .llm import _engine_setup, _prompt_text
from .lora_request import LoRARequest
from .outputs import RequestOutput, _Accumulator
from .sampling_params import RequestOutputKind, SamplingParams

_ABORTED = object()


@dataclass
class AsyncEngineArgs:
    """vLLM's AsyncEngineArgs: the model and the engine arguments (as LLM takes them)."""

    model: str
    engine_args: dict = field(default_factory=dict)

    def __init__(self, model: str, **engine_args: Any) -> None:
        self.model = model
        self.engine_args = engine_args


class AsyncLLM:
    """`AsyncLLM(model, **engine_args)` or `AsyncLLM.from_engine_args(AsyncEngineArgs(...))`.

    Use it from one event loop. `shutdown()` (or the end of an `async with` block) stops the
    engine: requests still running are aborted.
    """

    def __init__(self, model: str, **engine_args: Any) -> None:
        self._seeds, args = _engine_setup(model, engine_args)
        self.model = model
        self._engine = _vesper.AsyncLlmEngine(model, args)
        self._streams: dict = {}  # request_id -> asyncio.Queue of raw outputs
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._adapters: dict = {}  # lora name -> asyncio.Future of its load

    @classmethod
    def from_engine_args(cls, engine_args: AsyncEngineArgs) -> "AsyncLLM":
        return cls(engine_args.model, **engine_args.engine_args)

    async def __aenter__(self) -> "AsyncLLM":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.shutdown()

    def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._engine.fd)
        self._loop = loop
        loop.add_reader(self._engine.fd, self._on_outputs)

    def _on_outputs(self) -> None:
        for request_id, item in self._engine.drain():
            queue = self._streams.get(request_id)
            if queue is not None:  # else: aborted, its iterator gone
                queue.put_nowait(item)

    async def _ensure_adapter(self, lora_request: Optional[LoRARequest]) -> Optional[tuple]:
        if lora_request is None:
            return None
        if not isinstance(lora_request, LoRARequest):
            raise TypeError(
                f"lora_request must be a LoRARequest or None, got {type(lora_request).__name__}")
        name, path = lora_request._pair()
        load = self._adapters.get(name)
        if load is None:
            # Read on an executor thread, so that a slow file never holds up the event loop.
            load = asyncio.ensure_future(
                asyncio.get_running_loop().run_in_executor(None, self._engine.add_lora, name, path))
            self._adapters[name] = load
        try:
            await asyncio.shield(load)
        except BaseException:
            if load.done():
                self._adapters.pop(name, None)  # a failed read may be retried
            raise
        return (name, path)

    def generate(
        self,
        prompt: Any,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        lora_request: Optional[LoRARequest] = None,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """An async iterator of the request's outputs as they come (sampling_params.output_kind:
        everything so far, the new part, or only the final output). Breaking out of the loop, or
        cancelling the coroutine, aborts the request; abort(request_id) ends the iteration."""
        return self._stream(
            request_id, sampling_params, lora_request, _prompt_text(prompt),
            lambda lora, params: self._engine.add_request(request_id, prompt, params, lora,
                                                          priority))

    def chat(
        self,
        messages: list,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        lora_request: Optional[LoRARequest] = None,
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        tools: Optional[list] = None,
        chat_template_kwargs: Optional[dict] = None,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """generate() for a conversation rendered with the chat template (see LLM.chat)."""
        rendered = self._engine.render_chat(messages, tools, add_generation_prompt, chat_template,
                                            chat_template_kwargs)
        return self._stream(
            request_id, sampling_params, lora_request, rendered,
            lambda lora, params: self._engine.add_chat_request(request_id, rendered, params,
                                                               lora, priority))

    async def _stream(self, request_id: str, params: SamplingParams,
                      lora_request: Optional[LoRARequest], prompt_text: Optional[str],
                      submit: Any) -> AsyncIterator[RequestOutput]:
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if request_id in self._streams:
            raise ValueError(f"request_id {request_id!r} is already running")
        params = self._seeds.complete(params)
        self._watch()
        lora = await self._ensure_adapter(lora_request)
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = queue
        try:
            submit(lora, params)
        except BaseException:
            del self._streams[request_id]
            raise
        acc = _Accumulator(request_id, prompt_text, params.logprobs is not None, lora_request)
        kind = params.output_kind
        finished = False
        try:
            while True:
                item = await queue.get()
                if item is _ABORTED:
                    finished = True
                    return
                if isinstance(item, str):  # the engine refused the request
                    finished = True
                    raise ValueError(item)
                out = acc.add(item, delta=kind == RequestOutputKind.DELTA)
                finished = out.finished
                if kind != RequestOutputKind.FINAL_ONLY or finished:
                    yield out
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:  # cancelled, or the caller stopped iterating
                self._engine.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Removes the request wherever it is; its iterator ends without further outputs."""
        self._engine.abort(request_id)
        queue = self._streams.pop(request_id, None)
        if queue is not None:
            queue.put_nowait(_ABORTED)

    def stats(self) -> dict:
        """The engine's counters as of its last step (see LLM.stats)."""
        return self._engine.stats()

    def shutdown(self, timeout: float = 0.0) -> None:
        """Stops the engine; requests still running after `timeout` seconds are aborted."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._engine.fd)
            self._loop = None
        self._engine.shutdown(timeout)
        for queue in self._streams.values():
            queue.put_nowait(_ABORTED)
        self._streams.clear()
