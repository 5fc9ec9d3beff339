"""The scripted engine: vLLM's AsyncLLM over an in-process engine core that follows replay scripts.

    setup = engine_setup(AsyncEngineArgs(...))      # VllmConfig + renderer, once per process
    llm = ScriptedAsyncLLM(setup)                   # a real AsyncLLM (EngineClient)
    llm.core.hold("req-1") / .fail(...) / .die()    # see core.py

A request's tokens are `sampling_params.extra_args["replay_token_ids"]`, then EOS: the script the
replay logits processor forces on a real engine, so one request body drives both test tiers.
"""

from tests.support.scripted_engine.core import Gate, ScriptedCore
from tests.support.scripted_engine.engine import EngineSetup, ScriptedAsyncLLM, engine_setup
from tests.support.scripted_engine.model import ScriptedModel

__all__ = ["EngineSetup", "Gate", "ScriptedAsyncLLM", "ScriptedCore", "ScriptedModel", "engine_setup"]
