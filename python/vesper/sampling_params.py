"""SamplingParams with vLLM's fields and defaults.

The fields are checked by the engine's own rules (vesper._vesper.check_sampling_params) when
the object is made and again when it is used: TypeError for a wrong type and ValueError for a
bad value, each naming the field ("SamplingParams.top_p must be in (0, 1], got 0").
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, Optional, Union

from . import _vesper


class RequestOutputKind(enum.IntEnum):
    """What AsyncLLM.generate yields each time (vLLM's): everything so far, what is new since the
    last yield, or only the final output. LLM.generate always returns final outputs."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class StructuredOutputsParams:
    """Constrains the output (set exactly one): a JSON schema (a dict, its JSON text, or a
    pydantic model class), a regular expression, a list of choices, a GBNF grammar (llama.cpp's
    format, rule `root`), or any JSON value (json_object=True)."""

    json: Optional[Union[str, dict, Any]] = None
    regex: Optional[str] = None
    choice: Optional[list] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    # Accepted for vLLM compatibility; Vesper has one grammar backend and llama.cpp's bounded
    # whitespace rule, so these change nothing.
    backend: Optional[str] = None
    whitespace_pattern: Optional[str] = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    structural_tag: Optional[str] = None

    def __post_init__(self) -> None:
        # vLLM accepts a pydantic model class for json.
        schema_of = getattr(self.json, "model_json_schema", None)
        if callable(schema_of):
            self.json = schema_of()


class GuidedDecodingParams(StructuredOutputsParams):
    """vLLM's earlier name for StructuredOutputsParams (SamplingParams.guided_decoding)."""


@dataclass
class SamplingParams:
    """How to sample the output of one request (vLLM's SamplingParams)."""

    n: int = 1
    best_of: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, list]] = None
    stop_token_ids: Optional[list] = None
    bad_words: Optional[list] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: Optional[StructuredOutputsParams] = None
    guided_decoding: Optional[GuidedDecodingParams] = None
    logit_bias: Optional[dict] = None
    allowed_token_ids: Optional[list] = None
    # Prefix caching, per request: compute the whole prompt, or share cached blocks only with
    # requests of the same salt.
    skip_reading_prefix_cache: bool = False
    cache_salt: Optional[str] = None
    # KV sparsity (the engine's kv_window / kv_sparsity="quest"), per request: "auto" follows the
    # engine, "none" attends densely (the HTTP API's "kv_sparsity").
    kv_sparsity: str = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.output_kind, int) and not isinstance(self.output_kind, bool):
            try:
                self.output_kind = RequestOutputKind(self.output_kind)
            except ValueError:
                raise ValueError(
                    f"SamplingParams.output_kind must be a RequestOutputKind, got {self.output_kind!r}"
                ) from None
        else:
            raise TypeError(
                "SamplingParams.output_kind must be a RequestOutputKind, got "
                f"{type(self.output_kind).__name__}"
            )
        _vesper.check_sampling_params(self)

    def clone(self) -> "SamplingParams":
        return dataclasses.replace(self)
