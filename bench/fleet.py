"""The systems under test, all up at once: started one after the other, warmed up, stopped together.

Keeping ours, vLLM's own server and the floor up together means a repetition pays no engine
start. Idle systems cost little (vLLM's engine stops busy-polling ~1 s after its last request)
and count as "foreign" CPU in each record, like anyone else's work.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from collections.abc import Callable
from typing import Any

import httpx

from bench import systems
from bench.loadgen import arun, run_load
from bench.measure import available_gib, tree_rss_gib
from bench.scenarios import Scenario
from bench.workload import WARM_REP, Workload, chat_request

MIN_AVAILABLE_GIB = 3.0  # free memory required before each engine start (three engines share 24 GiB)


class Fleet:
    def __init__(self, tmp: Path, model_dir: Path, bind: str, wl: Workload, names: list[str], log: Callable[[str], None]):
        self.log = log
        self.members: dict[str, systems.Server | systems.InprocWorker] = {}
        logs, flags = tmp / "logs", systems.engine_flags()
        for name in names:
            if name == "ours":
                self.members[name] = systems.ours(model_dir, logs, bind, flags)
            elif name == "vllm":
                self.members[name] = systems.vllms_own(model_dir, logs, bind, flags)
            elif name == "inproc":
                wl_path = tmp / "workload.json"
                wl_path.write_text(wl.to_json())
                self.members[name] = systems.InprocWorker(model_dir, logs, bind, flags, wl_path, tmp / "inproc-work")
            else:
                raise ValueError(f"no system {name!r}")

    def start(self, meta: dict[str, Any]) -> None:
        """Start one at a time (start-up compiles on both cores), each only if memory allows."""
        meta.setdefault("rss_gib", {})
        for name, member in self.members.items():
            free = available_gib()
            if free < MIN_AVAILABLE_GIB:
                raise RuntimeError(f"only {free} GiB of memory available before starting {name} (need {MIN_AVAILABLE_GIB})")
            self.log(f"starting {name} ({free} GiB available)")
            member.start()
            meta["startup_s"][name] = member.startup_s
            meta["rss_gib"][name] = tree_rss_gib(member.pid)
            self.log(f"{name} up after {member.startup_s} s (pid {member.pid}, {meta['rss_gib'][name]} GiB resident)")
        meta["available_gib_all_up"] = available_gib()

    def warm(self, wl: Workload, blocks: dict[str, list[Scenario]]) -> None:
        """Two requests per distinct (system, level, batch), and two per distinct long prompt length
        (unique prompts of their own: the first long prefill); the floor warmed the rest itself."""
        for name, member in self.members.items():
            scs = blocks[name]
            warm = [
                Scenario(name, "tokens", wl.warm_length, 2, 2, rep=WARM_REP, prompt_len=p)
                for p in sorted({sc.prompt_len for sc in scs if sc.prompt_len})
            ]
            if isinstance(member, systems.InprocWorker):
                for sc in warm:
                    item = member.run({**asdict(sc), "name": f"warmup-{sc.id}", "time_limit_s": 120}, 300)
                    if item["summary"]["errors"]:
                        raise RuntimeError(f"warm-up of inproc/{sc.id} failed: {item['summary']['first_error']}")
                continue
            warm = [Scenario(name, lv, wl.warm_length, 2, 2, b) for lv, b in sorted({(sc.level, sc.batch) for sc in scs})] + warm
            for sc in warm:
                load = arun(run_load(member.url, wl.requests_of(sc), concurrency=2, requests=2, time_limit_s=120))
                errs = [r.error for r in load.results if r.error]
                if errs:
                    raise RuntimeError(f"warm-up of {name}/{sc.id} failed: {errs[0]}\n{member.log_tail()}")

    def stop(self) -> None:
        for member in reversed(list(self.members.values())):
            try:
                member.stop()
            except Exception as e:  # stop the others anyway
                self.log(f"stopping {member.name} failed: {e}")

    def alive(self, name: str) -> bool:
        proc = self.members[name].proc
        return proc is not None and proc.poll() is None


def render_matches(url: str, wl: Workload) -> bool | None:
    """Is our prompt (demo tokenizer's chat template) what vLLM's /v1/chat/completions/render makes?"""
    try:
        r = httpx.post(url + "/v1/chat/completions/render", json=chat_request(), timeout=60, trust_env=False)
        body = r.json()
        body = body[0] if isinstance(body, list) else body
        return body["token_ids"] == wl.prompt_ids
    except Exception:
        return None
