"""Benchmarks for decode-server: `python -m bench.run` (ours vs vLLM's own server vs the in-process engine, interleaved)."""
