"""The scripted engine's "model": the next token a request's replay script forces, and logprobs
of exactly the shape vLLM's sampler reports (values from seeded random logits, as from dummy weights).

The token rule is the replay logits processor's own: its per-request state (script, EOS, the live
output list) comes from `ReplayLogitsProcessor._new_state`, so a script is parsed, truncated at the
vocabulary and ended by the same EOS as on a real engine (the model's EOS under `ignore_eos`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import torch
from vllm.v1.outputs import LogprobsLists, LogprobsTensors
from vllm.v1.request import Request
from vllm.v1.sample.sampler import Sampler

from decode_server.tools.replay import ReplayLogitsProcessor


class ScriptedModel:
    def __init__(self, vllm_config, default_script: Sequence[int] = ()):
        self._replay = ReplayLogitsProcessor(vllm_config, torch.device("cpu"), is_pin_memory=False)
        self.vocab_size = vllm_config.model_config.get_vocab_size()
        # What a request without `replay_token_ids` follows (a real engine's dummy weights would
        # pick random tokens): by default none, so it ends on EOS at once.
        self.default_script = list(default_script)
        self._sampler = Sampler()

    def replay_state(self, request: Request) -> tuple[list[int], int, Sequence[int]]:
        """(script, eos, live output ids), as the replay processor keeps them for this request."""
        sp = request.sampling_params
        state = self._replay._new_state(sp, request.prompt_token_ids, request.output_token_ids)
        if state is None:
            eos = sp.eos_token_id if sp.eos_token_id is not None else self._replay.default_eos
            state = (self.default_script, eos, request.output_token_ids)
        return state

    @staticmethod
    def next_token(state: tuple[list[int], int, Sequence[int]]) -> int:
        # ReplayLogitsProcessor.apply: position i is forced to script[i], EOS once it is used up.
        script, eos, output = state
        position = len(output)
        return script[position] if position < len(script) else eos

    # ------------------------------------------------------------ logprobs

    def _logprobs(self, histories: list[Sequence[int]]) -> torch.Tensor:
        """Raw logprobs over the vocabulary after each history, seeded by it (deterministic)."""
        rows = []
        for history in histories:
            seed = zlib.crc32(np.asarray(history, dtype=np.int64).tobytes())
            rows.append(torch.randn(self.vocab_size, generator=torch.Generator().manual_seed(seed)))
        return Sampler.compute_logprobs(torch.stack(rows))

    def sample_logprobs(self, request: Request, new_token_ids: list[int]) -> LogprobsLists | None:
        """What the sampler returns for these new tokens: [sampled, top-k...] (or the requested
        `logprob_token_ids`) per position, with the sampled token's rank."""
        sp = request.sampling_params
        if sp.num_logprobs is None or not new_token_ids:
            return None
        all_ids = list(request.all_token_ids)
        first = len(all_ids) - len(new_token_ids)
        logprobs = self._logprobs([all_ids[:first + i] for i in range(len(new_token_ids))])
        sampled = torch.tensor(new_token_ids, dtype=torch.int64)
        # The sampler's rank count is torch.compile'd; eager here (no compiler in a test run).
        with torch.compiler.set_stance("force_eager"):
            if sp.logprob_token_ids:
                ids = {row: list(sp.logprob_token_ids) for row in range(len(new_token_ids))}
                tensors = self._sampler.gather_specific_token_logprobs(logprobs, ids, sampled)
            else:
                k = self.vocab_size if sp.logprobs == -1 else sp.logprobs
                tensors = Sampler.gather_logprobs(logprobs, k, token_ids=sampled)
        return tensors.tolists()

    def prompt_logprobs(self, request: Request) -> LogprobsTensors | None:
        """Prompt logprobs as the model runner sends them on the last prefill step: one row per
        prompt token after the first, [that token, top-k...]."""
        k = request.sampling_params.prompt_logprobs
        prompt = request.prompt_token_ids
        if k is None or prompt is None:
            return None
        k = self.vocab_size if k == -1 else k
        if len(prompt) < 2:  # no row to score: the runner still sends its (empty) tensors
            return LogprobsTensors.empty_cpu(0, k + 1)
        logprobs = self._logprobs([prompt[:i] for i in range(1, len(prompt))])
        targets = torch.tensor(prompt[1:], dtype=torch.int64)
        with torch.compiler.set_stance("force_eager"):
            return Sampler.gather_logprobs(logprobs, k, token_ids=targets)
