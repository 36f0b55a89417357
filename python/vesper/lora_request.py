"""LoRARequest: the adapter a request runs with (vLLM's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class LoRARequest:
    """An adapter by name, id and path: a llama.cpp GGUF LoRA or a PEFT directory (LoRA or
    VeRA). The engine needs enable_lora=True; an adapter is read the first time a request names
    it and kept under its name (lora_int_id is vLLM's identity; Vesper keys by name)."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: Optional[str] = None

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str):
            raise TypeError(f"LoRARequest.lora_name must be a str, got {type(self.lora_name).__name__}")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int):
            raise TypeError(
                f"LoRARequest.lora_int_id must be an int, got {type(self.lora_int_id).__name__}"
            )
        if self.lora_int_id < 1:
            raise ValueError(f"LoRARequest.lora_int_id must be >= 1, got {self.lora_int_id}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError("LoRARequest.lora_path must be a non-empty str")

    # vLLM's short names.
    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    def _pair(self) -> tuple:
        return (self.lora_name, self.lora_path)
