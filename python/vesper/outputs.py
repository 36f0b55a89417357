"""RequestOutput and CompletionOutput, shaped as vLLM's, built from the engine's output dicts
(src/python/outputs.h)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union


@dataclass
class Logprob:
    """One token's log-probability (under the model's raw distribution, as vLLM reports by
    default), its rank among the top tokens (1 = most likely; None when the sampled token is not
    among the requested top-k), and its text."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


# Per generated token: {token id: Logprob} holding the sampled token and the top-k.
SampleLogprobs = list


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list
    cumulative_logprob: Optional[float]
    logprobs: Optional[SampleLogprobs]
    finish_reason: Optional[str] = None
    # The stop string or stop token id that ended the output (None: EOS or the length limit);
    # a str also when a structured output's grammar gave up (its reason).
    stop_reason: Union[int, str, None] = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Times are time.time() seconds; None until reached."""

    arrival_time: Optional[float] = None
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    last_token_time: Optional[float] = None
    finished_time: Optional[float] = None
    num_preemptions: int = 0

    @property
    def time_in_queue(self) -> Optional[float]:
        if self.arrival_time is None or self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: Optional[list]
    prompt_logprobs: Optional[list]
    outputs: list
    finished: bool
    metrics: Optional[RequestMetrics] = None
    lora_request: Any = None
    num_cached_tokens: int = 0


def _logprobs(entries: list) -> list:
    """The engine's (token, logprob, text, [(top, logprob, text)]) tuples as vLLM's dicts."""
    out = []
    for token, logprob, text, top in entries:
        d = {}
        rank = None
        for k, (t, lp, piece) in enumerate(top):
            d[t] = Logprob(lp, k + 1, piece)
            if t == token:
                rank = k + 1
        if token not in d:
            d[token] = Logprob(logprob, rank, text)
        # The sampled token first, as vLLM orders it.
        out.append({token: d.pop(token), **d})
    return out


def _metrics(m: dict) -> RequestMetrics:
    return RequestMetrics(**m)


class _Accumulator:
    """One request's outputs as they stream in (deltas), for AsyncLLM: what it has so far, and
    the RequestOutput to yield for each kind."""

    def __init__(self, request_id: str, prompt: Optional[str], want_logprobs: bool,
                 lora_request: Any) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.want_logprobs = want_logprobs
        self.lora_request = lora_request
        self.samples: dict = {}  # index -> [text, token_ids, logprobs, cumulative]

    def add(self, raw: dict, delta: bool) -> RequestOutput:
        outputs = []
        for o in raw["outputs"]:
            s = self.samples.setdefault(o["index"], ["", [], [], 0.0])
            new_logprobs = _logprobs(o["delta_logprobs"]) if self.want_logprobs else []
            if o["finished"]:
                s[0], s[1] = o["text"], list(o["token_ids"])
                s[2] = _logprobs(o["logprobs"]) if self.want_logprobs else []
                s[3] = sum(e[1] for e in o["logprobs"])
            else:
                s[0] += o["delta_text"]
                s[1].extend(o["delta_token_ids"])
                s[2].extend(new_logprobs)
                s[3] += sum(e[1] for e in o["delta_logprobs"])
            if delta:
                text, ids, lps = o["delta_text"], list(o["delta_token_ids"]), new_logprobs
            else:
                text, ids, lps = s[0], list(s[1]), list(s[2])
            outputs.append(CompletionOutput(
                index=o["index"], text=text, token_ids=ids,
                cumulative_logprob=s[3] if self.want_logprobs else None,
                logprobs=lps if self.want_logprobs else None,
                finish_reason=o.get("finish_reason"), stop_reason=o.get("stop_reason")))
        return RequestOutput(
            request_id=self.request_id, prompt=self.prompt,
            prompt_token_ids=raw["prompt_token_ids"], prompt_logprobs=None, outputs=outputs,
            finished=raw["finished"], metrics=_metrics(raw["metrics"]),
            lora_request=self.lora_request, num_cached_tokens=raw["num_cached_tokens"])


def _final_output(raw: dict, request_id: str, prompt: Optional[str], want_logprobs: bool,
                  lora_request: Any) -> RequestOutput:
    """A finished request's output (LLM.generate)."""
    outputs = []
    for o in raw["outputs"]:
        outputs.append(CompletionOutput(
            index=o["index"], text=o["text"], token_ids=list(o["token_ids"]),
            cumulative_logprob=sum(e[1] for e in o["logprobs"]) if want_logprobs else None,
            logprobs=_logprobs(o["logprobs"]) if want_logprobs else None,
            finish_reason=o["finish_reason"], stop_reason=o["stop_reason"]))
    return RequestOutput(
        request_id=request_id, prompt=prompt, prompt_token_ids=raw["prompt_token_ids"],
        prompt_logprobs=None, outputs=outputs, finished=True, metrics=_metrics(raw["metrics"]),
        lora_request=lora_request, num_cached_tokens=raw["num_cached_tokens"])
