"""The vLLM 0.33 tier: runs only with 0.33's modules first on the path (tests/test_vllm033.py
starts it so). Anything else is a clear error, never a silent skip."""

import vllm

if not vllm.__version__.startswith("0.33."):
    raise RuntimeError(
        f"tests/vllm033 runs on vLLM 0.33's modules, but this is vLLM {vllm.__version__} from {vllm.__file__}; "
        "run it through tests/test_vllm033.py (it puts the cached 0.33 wheel's modules first on PYTHONPATH)"
    )
