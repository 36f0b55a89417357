"""Vesper for Python: vLLM's offline and asyncio APIs on Vesper's engine (GGUF models, CPU).

    from vesper import LLM, SamplingParams

    llm = LLM("stories260K.gguf", max_model_len=128)
    outputs = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=32))
    print(outputs[0].outputs[0].text)
"""

from . import _vesper
from .async_llm import AsyncEngineArgs, AsyncLLM
from .llm import LLM
from .lora_request import LoRARequest
from .outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from .sampling_params import (
    GuidedDecodingParams,
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
)

# The engine arguments LLM() and AsyncLLM() take: the engine flags of `vesper generate`, with
# underscores for dashes.
ENGINE_ARGS = tuple(_vesper.engine_arg_names())

__version__ = "0.1.0"

__all__ = [
    "AsyncEngineArgs",
    "AsyncLLM",
    "CompletionOutput",
    "ENGINE_ARGS",
    "GuidedDecodingParams",
    "LLM",
    "LoRARequest",
    "Logprob",
    "RequestMetrics",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "StructuredOutputsParams",
]
