"""Benchmarks for decode-server (issue #5): `python -m bench.run [--smoke|--quick|--full]`."""
