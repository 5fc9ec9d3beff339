"""bench.first_token's hooks, active in a process whose environment names FIRST_TOKEN_TRACE: the
time of each request's first put into its output collector (vLLM's own class, so ours and vLLM's
server are timed alike) and of every collection of the oldest generation (`gc.callbacks`), written
to FIRST_TOKEN_TRACE.<pid>.json within a second of changing. Times are `time.perf_counter()`, the
clock the load generator stamps with (CLOCK_MONOTONIC, one per machine)."""

import os

if os.environ.get("FIRST_TOKEN_TRACE"):
    import gc
    import json
    import sys
    import threading
    import time

    _trace = {"argv": [], "first_put": {}, "full_gc": []}
    _gc_started: list[float] = []

    def _on_gc(phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            _gc_started[:] = [time.perf_counter()]
        elif _gc_started:
            _trace["full_gc"].append((_gc_started[0], time.perf_counter() - _gc_started[0]))

    gc.callbacks.append(_on_gc)

    def _hook_vllm() -> None:
        # Imported here, not at start-up of every Python process this environment reaches.
        from vllm.v1.engine import output_processor

        put = output_processor.RequestOutputCollector.put

        def noted_put(self, output):
            _trace["first_put"].setdefault(self.request_id, time.perf_counter())
            put(self, output)

        output_processor.RequestOutputCollector.put = noted_put

    def _write() -> None:
        path = f"{os.environ['FIRST_TOKEN_TRACE']}.{os.getpid()}.json"
        hooked, written = False, None
        while True:
            time.sleep(1)
            if not hooked and "vllm.v1.engine.output_processor" in sys.modules:
                _hook_vllm()  # long before the app serves: the engine starts after the import
                hooked = True
            _trace["argv"] = sys.argv[:2]  # `python -m` has set it by now (at start-up it reads "-m")
            size = (len(_trace["first_put"]), len(_trace["full_gc"]))
            if size == written:
                continue
            try:
                with open(path + ".tmp", "w") as f:
                    json.dump(_trace, f)
                os.replace(path + ".tmp", path)
                written = size
            except (OSError, RuntimeError):  # a dict changed size while dumped: next second
                pass

    threading.Thread(target=_write, daemon=True).start()
