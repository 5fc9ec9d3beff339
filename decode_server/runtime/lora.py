"""The served models: the base model's names and its LoRA adapters, kept by vLLM's own registry.

`OpenAIServingModels` is what `vllm serve` uses: static `--lora-modules`, runtime load/unload
(`VLLM_ALLOW_RUNTIME_LORA_UPDATING`), resolver plugins, the adapter ids. This module resolves a
request's `model` to a `LoRARequest` (None: the base model) as vLLM's generate does, and turns
vLLM's error responses into this server's errors.
"""

from __future__ import annotations

from typing import Any

import pydantic
from vllm.entrypoints.openai.models.protocol import BaseModelPath, LoRAModulePath
from vllm.entrypoints.openai.models.serving import OpenAIServingModels
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from vllm.lora.request import LoRARequest

from decode_server.errors import Rejected, ServerError


def _error(response: ErrorResponse, reason: str) -> ServerError:
    info = response.error
    return ServerError(info.message, status=info.code, param=info.param, reason=reason, error_type=info.type)


def unknown_model(model: str) -> Rejected:
    return Rejected(f"The model `{model}` does not exist.", status=404, param="model", reason="unknown_model")


class Models:
    """The base model (under each served name) and the adapters loaded so far."""

    def __init__(
        self,
        llm: Any,
        served_model_names: tuple[str, ...],
        lora_modules: tuple[LoRAModulePath, ...] = (),
        runtime_updating: bool = False,
    ):
        base = [BaseModelPath(name=name, model_path=llm.model_config.model) for name in served_model_names]
        self.registry = OpenAIServingModels(llm, base, lora_modules=list(lora_modules) or None)
        self.runtime_updating = runtime_updating

    async def start(self) -> None:
        """Load the `--lora-modules` into the engine; a module that fails to load fails the start."""
        await self.registry.init_static_loras()

    async def resolve(self, model: str | None) -> LoRARequest | None:
        """The adapter a request's `model` names; None for the base model ("" or absent too)."""
        registry = self.registry
        if not model or registry.is_base_model(model):
            return None
        lora = registry.lora_requests.get(model)
        if lora is not None:
            return lora
        if self.runtime_updating:
            # As vLLM's _check_model: a resolver plugin may find it; its 400 is kept, else 404.
            found = await registry.resolve_lora(model)
            if isinstance(found, LoRARequest):
                return found
            if found.error.code == 400:
                raise _error(found, "lora_load_failed")
        raise unknown_model(model)

    def model_name(self, lora: LoRARequest | None) -> str:
        return self.registry.model_name(lora)

    async def adapter_cards(self) -> list[dict[str, Any]]:
        """vLLM's model cards of the adapters (`root` the adapter path, `parent` the base model)."""
        cards = (await self.registry.show_available_models()).data
        return [card.model_dump() for card in cards if card.parent is not None]

    async def load(self, body: bytes) -> str:
        request = _parse(LoadLoRAAdapterRequest, body)
        answer = await self.registry.load_lora_adapter(request)
        if isinstance(answer, ErrorResponse):
            raise _error(answer, "lora_load_failed")
        return answer

    async def unload(self, body: bytes) -> str:
        request = _parse(UnloadLoRAAdapterRequest, body)
        answer = await self.registry.unload_lora_adapter(request)
        if isinstance(answer, ErrorResponse):
            raise _error(answer, "lora_unload_failed")
        return answer


def _parse(model: type[pydantic.BaseModel], body: bytes) -> Any:
    try:
        return model.model_validate_json(body)
    except pydantic.ValidationError as e:
        first = e.errors()[0] if e.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise Rejected(f"invalid request: {first.get('msg', 'validation error')}", param=param) from e
