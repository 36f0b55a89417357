"""vesper.AsyncLLM: many coroutines share one engine; streams, aborts and cancellation leave no
blocks behind."""

import asyncio

import pytest

from conftest import ENGINE_ARGS, STORIES
from vesper import AsyncEngineArgs, AsyncLLM, LLM, RequestOutputKind, SamplingParams


@pytest.fixture(scope="module")
def engine():
    e = AsyncLLM.from_engine_args(AsyncEngineArgs(STORIES, **ENGINE_ARGS))
    yield e
    e.shutdown()


async def wait_idle(engine):
    """Until the engine's last step reports no request and no referenced block (its statistics
    are a snapshot taken after each step)."""
    for _ in range(500):
        s = engine.stats()
        if s["num_requests"] == 0 and s["kv_blocks_used"] == 0:
            return s
        await asyncio.sleep(0.01)
    raise AssertionError(f"blocks still held: {engine.stats()}")


def test_fifty_coroutines_stream_and_match_the_offline_engine(engine, llm):
    prompts = ["Once upon a time", "The little dog", "Lily and Ben went to the park"]
    params = SamplingParams(temperature=0, max_tokens=24)
    offline = {p: o.outputs[0].token_ids
               for p, o in zip(prompts, llm.generate(prompts, params, use_tqdm=False))}

    async def one(i):
        prompt = prompts[i % len(prompts)]
        seen = []
        async for out in engine.generate(prompt, params, f"req-{i}"):
            seen.append(out)
        assert all(not o.finished for o in seen[:-1]) and seen[-1].finished
        texts = [o.outputs[0].text for o in seen]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative
        return prompt, seen[-1]

    async def main():
        results = await asyncio.gather(*(one(i) for i in range(50)))
        for prompt, final in results:
            assert final.outputs[0].token_ids == offline[prompt]
            assert final.prompt == prompt
        await wait_idle(engine)

    asyncio.run(main())


def test_aborts_and_cancellations_free_their_blocks(engine):
    long = SamplingParams(temperature=1.0, max_tokens=120, ignore_eos=True)
    started = 0

    async def consume(request_id, stop_after=None):
        nonlocal started
        n, last = 0, None
        async for last in engine.generate("Once upon a time", long, request_id):
            n += 1
            started += n == 1
            if stop_after is not None and n == stop_after:
                break  # leaving the loop aborts the request
        return last

    async def main():
        # 40 requests for 16 sequence slots: some run, the rest wait, when the aborts come.
        tasks = {f"a{i}": asyncio.create_task(consume(f"a{i}")) for i in range(35)}
        breakers = [asyncio.create_task(consume(f"b{i}", stop_after=2)) for i in range(5)]
        while started < 10:  # the first wave is streaming; none is near its 120 tokens
            await asyncio.sleep(0.001)
        for i in range(0, 35, 2):
            engine.abort(f"a{i}")  # running or waiting: their iterators end
        for i in range(1, 35, 4):
            tasks[f"a{i}"].cancel()
        done = await asyncio.gather(*tasks.values(), *breakers, return_exceptions=True)
        cancelled = [d for d in done if isinstance(d, asyncio.CancelledError)]
        assert len(cancelled) == len(range(1, 35, 4))
        assert not [d for d in done if isinstance(d, Exception)]
        for i, last in enumerate(done[:35]):
            if i % 2 == 0:  # aborted: ended early, without a final output
                assert last is None or not last.finished
            elif i % 4 != 1:  # left alone: ran to the end
                assert last.finished and len(last.outputs[0].token_ids) == 120
        await wait_idle(engine)
        # The engine goes on.
        final = None
        async for final in engine.generate("The little dog", SamplingParams(
                temperature=0, max_tokens=5, output_kind=RequestOutputKind.FINAL_ONLY), "after"):
            pass
        assert final.finished and len(final.outputs[0].token_ids) == 5

    asyncio.run(main())


def test_delta_outputs_and_refusals(engine):
    async def main():
        deltas = [o async for o in engine.generate(
            "Once upon a time", SamplingParams(temperature=0, max_tokens=16,
                                               output_kind=RequestOutputKind.DELTA), "d")]
        assert sum(len(o.outputs[0].token_ids) for o in deltas) == 16
        with pytest.raises(ValueError, match="SamplingParams"):
            async for _ in engine.generate("x", SamplingParams(stop_token_ids=[100000]), "bad"):
                pass
        with pytest.raises(TypeError, match="request_id"):
            async for _ in engine.generate("x", SamplingParams(), 7):
                pass

    asyncio.run(main())
