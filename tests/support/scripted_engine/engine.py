"""vLLM's own AsyncLLM over the scripted engine core: real RequestOutputs, no engine process.

`ScriptedAsyncLLM(setup)` is an `AsyncLLM` (vLLM's EngineClient) built on the real `VllmConfig` and
renderer (tokenizer) of an engine configuration; only its `engine_core` is the `ScriptedCore`. So
the InputProcessor validates and renders requests, and the OutputProcessor turns the scripted
`EngineCoreOutput`s into `RequestOutput`s exactly as it does behind `vllm serve`.

`engine_setup(engine_args)` builds the config once per engine configuration and the renderer once
per model configuration: the renderer's tokenizer pool is the slow part (seconds), an AsyncLLM is not.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from typing import Any
from unittest import mock

from vllm.config import VllmConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.renderers import renderer_from_config
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine import async_llm
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.core_client import EngineCoreClient

from tests.support.scripted_engine.core import ScriptedCore


@dataclass(frozen=True)
class EngineSetup:
    engine_args: AsyncEngineArgs
    vllm_config: VllmConfig
    renderer: Any  # vLLM's BaseRenderer; lives for the session, shared by every AsyncLLM built on it


_setups: list[EngineSetup] = []
_renderers: list[Any] = []  # most recently used last
# A renderer holds its tokenizer and a pool of deep copies (~200 MB for the demo vocabulary), and
# the parser matrix builds servers on some thirty model directories: an unbounded cache kept every
# one (6 GB in one process, beside the suite's real engines). The matrix visits one model at a time.
KEPT_RENDERERS = 3


def _renderer(vllm_config: VllmConfig) -> Any:
    """One renderer per model configuration: its tokenizer pool (deep copies of the vocabulary)
    takes seconds. A text model's renderer reads nothing of the engine config but `model_config`,
    so configurations that differ elsewhere (parsers, max_num_seqs, LoRA) share it."""
    model_config = vllm_config.model_config
    if not model_config.supports_multimodal_inputs:
        for renderer in _renderers:
            if renderer.model_config == model_config:
                _renderers.remove(renderer)
                _renderers.append(renderer)
                return renderer
    renderer = renderer_from_config(vllm_config)
    _renderers.append(renderer)
    if len(_renderers) > KEPT_RENDERERS:
        _forget(_renderers.pop(0))
    return renderer


# vLLM's per-process memos that hold a tokenizer (or a bound method of one) by model directory
# or by tokenizer; pure memos, rebuilt on the next call. (module, attribute); absent ones skipped.
_TOKENIZER_MEMOS = (
    ("vllm.tokenizers.registry", "cached_get_tokenizer"),
    ("vllm.transformers_utils.processor", "cached_get_processor"),
    ("vllm.utils.func_utils", "_supports_kw"),
    ("vllm.renderers.hf", "_detect_content_format"),
    ("vllm.renderers.hf", "_cached_resolve_chat_template_kwargs"),
    ("vllm.renderers.hf", "_get_hf_base_chat_template_params"),
)


def _forget(renderer: Any) -> None:
    """Drop the cache's hold on `renderer`, and vLLM's memos' on its tokenizers. An AsyncLLM still
    built on it keeps it (vLLM closes its resources when it is collected)."""
    _setups[:] = [setup for setup in _setups if setup.renderer is not renderer]
    for module, name in _TOKENIZER_MEMOS:
        memo = getattr(sys.modules.get(module), name, None)
        if hasattr(memo, "cache_clear"):
            memo.cache_clear()


def _make_room_for(engine_args: AsyncEngineArgs) -> None:
    """A full cache forgets its least recently used renderer before a new model's config is built,
    not after: building it loads the new tokenizer into vLLM's memos, which forgetting clears (each
    family's tokenizer was loaded twice, once more by its second server)."""
    tokenizer = str(engine_args.tokenizer or engine_args.model)
    if len(_renderers) >= KEPT_RENDERERS and not any(str(r.model_config.tokenizer) == tokenizer for r in _renderers):
        _forget(_renderers.pop(0))


def engine_setup(engine_args: AsyncEngineArgs) -> EngineSetup:
    """The config and renderer for these engine args, built once per process."""
    for setup in _setups:
        if setup.engine_args == engine_args:
            return setup
    _make_room_for(engine_args)
    # create_engine_config fills in fields of the args it is given: the key is the args as passed.
    as_passed = copy.deepcopy(engine_args)
    vllm_config = engine_args.create_engine_config(UsageContext.OPENAI_API_SERVER)
    setup = EngineSetup(as_passed, vllm_config, _renderer(vllm_config))
    _setups.append(setup)
    return setup


class ScriptedAsyncLLM(AsyncLLM):
    """vLLM's AsyncLLM whose engine core is a `ScriptedCore` (`.engine_core`, also `.core`)."""

    def __init__(self, setup: EngineSetup, *, log_stats: bool | None = None, core: ScriptedCore | None = None):
        log_stats = not setup.engine_args.disable_log_stats if log_stats is None else log_stats
        core = core or ScriptedCore(setup.vllm_config, log_stats)
        # The two seams AsyncLLM builds itself: the session's renderer, and the core client.
        with (
            mock.patch.object(async_llm, "renderer_from_config", lambda config: setup.renderer),
            mock.patch.object(EngineCoreClient, "make_async_mp_client", lambda *args, **kwargs: core),
        ):
            super().__init__(
                setup.vllm_config,
                executor_class=None,  # type: ignore[arg-type]  # only the core client would use it
                log_stats=log_stats,
                usage_context=UsageContext.OPENAI_API_SERVER,
                log_requests=setup.engine_args.enable_log_requests,
            )
        self.core = core
        core.attach(self.output_processor)

    def shutdown(self, timeout: float | None = None) -> None:
        self.renderer = None  # the session's, not this engine's to close
        super().shutdown(timeout)
