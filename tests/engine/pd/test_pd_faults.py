"""P/D faults with real NIXL on loopback (issue 15, item 1): every fault ends within a bound, and
afterwards neither instance holds an engine request or a KV block.

The P/D set tests/engine/pd/test_pd.py and test_pd_behind_llm_d.py use too (tests/support/pd_pair.py, one start-up for the package): one prefill
instance (`--tokens-only`, kv_producer) and two decode instances (kv_consumer): one with vLLM's
default `kv_load_failure_policy: fail` and a short remote-prefill deadline
(`DECODE_SERVER_REMOTE_PREFILL_TIMEOUT_S`, our default 8 s), one with `recompute`, all with a short
NIXL lease (`kv_connector_extra_config.kv_lease_duration`, vLLM's default 30 s). Real engines with
seeded weights; the tests run in file order and the last two kill an instance each (the
`recompute` decode instance, then the prefill one; a later module starts them again).

"Holds nothing" is read from /metrics: `vllm:num_requests_running` and `..._waiting` 0,
`decode_server_live_request_states` 0, and `vllm:kv_cache_usage_perc` 0 (on the prefill side
the blocks kept for a remote decode are the only thing that holds it above 0 once idle).
Measured times are printed (`-s`) as `MEASURED ...` lines.
"""

from __future__ import annotations

import concurrent.futures
import random
import signal
import time
from typing import Any

import httpx
import pytest

from tests.support import servers
from tests.support.pd_pair import FAIL_DEADLINE_S, LEASE_S, PDSet, kv_usage, metrics, salt
from tests.support.processes import signal_all
from tests.support import GENERATE

pytestmark = [pytest.mark.real_engine, pytest.mark.reliability, pytest.mark.timeout(600)]

# A decode leg that cannot get its KV is answered by our deadline (FAIL_DEADLINE_S), or sooner by
# vLLM's own 5 s handshake timeout. What a client sees adds the time a loaded two-core box takes to
# reach the deadline's timer and to send the answer (CI: a 502 from the 5 s handshake arrived after
# 10.25 s). The bound tells "ended by a deadline" from "hung"; the times themselves are MEASURED.
ANSWER_SLACK_S = 5.0
BOUND_S = FAIL_DEADLINE_S + ANSWER_SLACK_S
FAULT_TIMEOUT = pytest.mark.timeout(120)


# ----------------------------------------------------------------- helpers


def _signal(server: servers.Server, sig: int) -> None:
    """To the API server and its engine core (and the core's workers): the engine has a session
    of its own, so the server's process group is not enough."""
    signal_all(server, sig)


def _prompt(n: int = 200) -> list[int]:
    rnd = random.Random(time.monotonic_ns())
    return [rnd.randrange(1000, 100_000) for _ in range(n)]


def _prefill(pd_set: PDSet, prompt: list[int], prefill: servers.Server | None = None) -> dict[str, Any]:
    body = {
        "token_ids": prompt,
        "cache_salt": salt(),
        "sampling_params": {"max_tokens": 1, "min_tokens": 1},
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
    }
    r = httpx.post((prefill or pd_set.prefill).url + GENERATE, json=body, timeout=60)
    assert r.status_code == 200, r.text
    kv = r.json()["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["remote_block_ids"]
    return kv


def _decode_body(prompt: list[int], kv: dict[str, Any] | None, **fields: Any) -> dict[str, Any]:
    body = {"token_ids": prompt, "cache_salt": salt(), "sampling_params": {"max_tokens": 4, "temperature": 0}, **fields}
    if kv is not None:
        body["kv_transfer_params"] = kv
    return body


def _decode(url: str, prompt: list[int], kv: dict[str, Any] | None, **fields: Any) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = httpx.post(url + GENERATE, json=_decode_body(prompt, kv, **fields), timeout=60)
    return r, time.monotonic() - t0


def _holds(url: str) -> dict[str, float]:
    m = metrics(url)
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting", "decode_server_live_request_states",
             "vllm:kv_cache_usage_perc")
    return {n: m[n] for n in names}


def _until_idle(url: str, within_s: float, blocks: bool = True) -> float:
    """Seconds until the instance holds no engine request (and, with `blocks`, no KV block);
    fails after `within_s`."""
    t0 = time.monotonic()
    while True:
        held = _holds(url)
        if not blocks:
            del held["vllm:kv_cache_usage_perc"]
        if not any(held.values()):
            return time.monotonic() - t0
        assert time.monotonic() - t0 < within_s, f"{url} still holds {held} after {within_s} s"
        time.sleep(0.1)


def _error(r: httpx.Response) -> dict[str, Any]:
    assert r.headers["content-type"].startswith("application/json"), r.headers
    return r.json()["error"]


_EXPECTED = {502: "remote prefill failed: the KV blocks could not be loaded", 504: "remote prefill timed out"}


def _measured(what: str, seconds: float) -> None:
    print(f"MEASURED {what}: {seconds:.2f} s")


# ----------------------------------------------------------------- the faults


def test_both_decode_instances_decode_from_the_prefill_kv(pd_set):
    """The set-up works (and each decode instance has done its NIXL handshake with the prefill one)."""
    p2p = 'vllm:prompt_tokens_cached_by_source_total{source="p2p"}'
    for d in (pd_set.fail, pd_set.recompute):
        # A pair's first leg does the NIXL handshake and the first transfer; on a loaded machine it
        # has once run past the test deadline (a clear 504): the second leg must then succeed.
        for attempt in range(2):
            prompt = _prompt()
            before = metrics(d.url)[p2p]
            r, _ = _decode(d.url, prompt, _prefill(pd_set, prompt))
            if r.status_code != 504:
                break
            print(f"MEASURED first leg {pd_set.prefill.name} -> {d.name}: 504 at the deadline; trying once more")
        assert r.status_code == 200, r.text
        local, _ = _decode(d.url, prompt, None)
        assert r.json()["choices"][0]["token_ids"] == local.json()["choices"][0]["token_ids"]
        assert metrics(d.url)[p2p] - before == len(prompt)
    for s in pd_set.everyone:
        _until_idle(s.url, 10)


@FAULT_TIMEOUT
def test_an_unreachable_side_channel_fails_fast_or_recomputes_and_the_lease_frees_the_prefill(pd_set):
    """Fault 2: `kv_transfer_params` name a prefill engine the decode instance has not met at a port
    nobody listens on. vLLM's handshake gives up after its 5 s ZMQ timeout: `fail` answers 502
    naming the prefill instance (or 504, should our deadline come first on a loaded box),
    `recompute` computes the prompt locally (the same tokens).
    The prefill instance frees the blocks when its lease runs out. (Both decode legs at once: each
    waits out its own handshake timeout.)"""
    prompt = _prompt()
    kv = _prefill(pd_set, prompt)
    wrong = {**kv, "remote_engine_id": f"nobody-{time.monotonic_ns()}", "remote_port": servers.free_port()}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        failed = pool.submit(_decode, pd_set.fail.url, prompt, wrong)
        recomputed = pool.submit(
            _decode, pd_set.recompute.url, prompt, {**wrong, "remote_engine_id": f"nobody-{time.monotonic_ns()}"}
        )
        (r, took), (recomputed_r, recomputed_took) = failed.result(), recomputed.result()
    _measured(f"unreachable side channel, fail policy, time to error ({r.status_code})", took)
    # vLLM's handshake timeout (502) comes first unless the box is so loaded that ours does (504).
    assert r.status_code in _EXPECTED, r.text
    error = _error(r)
    assert error["message"].startswith(_EXPECTED[r.status_code])
    assert str(wrong["remote_port"]) in error["message"] and error["param"] == "kv_transfer_params"
    assert took < BOUND_S, took
    _measured("unreachable side channel, recompute policy, time to the answer", recomputed_took)
    assert recomputed_r.status_code == 200, recomputed_r.text
    local, _ = _decode(pd_set.recompute.url, prompt, None)
    assert recomputed_r.json()["choices"][0]["token_ids"] == local.json()["choices"][0]["token_ids"]
    assert recomputed_took < BOUND_S, recomputed_took
    for d in (pd_set.fail, pd_set.recompute):
        _until_idle(d.url, 5)
    _until_idle(pd_set.prefill.url, LEASE_S + 15)  # its lease ran out meanwhile (see the killed-decode test)


@FAULT_TIMEOUT
def test_a_stalled_prefill_instance_ends_the_decode_leg_at_our_deadline(pd_set):
    """Fault 4: the prefill instance is stopped (SIGSTOP) after answering: the pull never completes
    and vLLM does not bound it. At DECODE_SERVER_REMOTE_PREFILL_TIMEOUT_S the decode server
    aborts the engine request and answers 504 before any body, batch and stream (both legs at
    once); once the prefill instance runs again it frees the blocks."""
    legs = {stream: (prompt, _prefill(pd_set, prompt)) for stream, prompt in ((False, _prompt()), (True, _prompt()))}
    _signal(pd_set.prefill, signal.SIGSTOP)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = {stream: pool.submit(_decode, pd_set.fail.url, p, kv, stream=stream) for stream, (p, kv) in legs.items()}
            answers = {stream: f.result() for stream, f in futures.items()}
        for stream, (r, took) in answers.items():
            _measured(f"stalled prefill (stream={stream}), time to error", took)
            assert r.status_code == 504, r.text
            error = _error(r)
            assert error["message"].startswith(f"remote prefill timed out: no first token {FAIL_DEADLINE_S:g} s after")
            assert legs[stream][1]["remote_engine_id"] in error["message"]
            assert FAIL_DEADLINE_S - 0.5 < took < BOUND_S, took
        # The engine requests are gone at once; their destination blocks stay until the pull ends
        # (vLLM frees nothing a transfer in flight may still write).
        _until_idle(pd_set.fail.url, 5, blocks=False)
    finally:
        _signal(pd_set.prefill, signal.SIGCONT)
    for s in (pd_set.fail, pd_set.prefill):
        _measured(f"stalled prefill, {s.name} holds no block after SIGCONT", _until_idle(s.url, LEASE_S + 15))


def _leave_while_the_pull_is_outstanding(pd_set: PDSet, tries: int = 3) -> None:
    """A decode leg whose client leaves (1.5 s) while the prefill instance is stopped. NIXL's reads
    are one-sided: a pull over a connection already open can finish without the stopped process,
    and then there is no outstanding pull to leave; that try is answered in full, and a new
    prompt tries again. Any other answer fails. Leaves the prefill instance stopped."""
    answers = []
    for _ in range(tries):
        prompt = _prompt()
        kv = _prefill(pd_set, prompt)
        _signal(pd_set.prefill, signal.SIGSTOP)
        try:
            r = httpx.post(pd_set.fail.url + GENERATE, json=_decode_body(prompt, kv, stream=True), timeout=1.5)
        except httpx.ReadTimeout:
            return
        answers.append((r.status_code, r.text[-300:]))
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), answers
        _signal(pd_set.prefill, signal.SIGCONT)
    raise AssertionError(f"every pull finished without the stopped prefill instance: {answers}")


@FAULT_TIMEOUT
def test_a_client_gone_while_its_kv_is_in_flight_leaves_nothing_held(pd_set):
    """Fault 3: the decode leg's client disconnects while its KV pull is outstanding (the prefill
    instance stopped, so it stays outstanding): the decode server aborts the engine request at
    once; the prefill instance frees the blocks once it runs again."""
    name = 'decode_server_aborts_total{cause="client_disconnect"}'
    before = metrics(pd_set.fail.url).get(name, 0.0)
    try:
        _leave_while_the_pull_is_outstanding(pd_set)
        t_gone = time.monotonic()
        took = _until_idle(pd_set.fail.url, 5, blocks=False)
        _measured("client gone with its KV in flight, decode engine request gone after", took)
        assert metrics(pd_set.fail.url).get(name, 0.0) == before + 1
        assert time.monotonic() - t_gone < FAIL_DEADLINE_S - 1.5, "the abort came from the disconnect, not the deadline"
    finally:
        _signal(pd_set.prefill, signal.SIGCONT)
    for s in (pd_set.fail, pd_set.prefill):
        _measured(f"client gone, {s.name} holds no block after SIGCONT", _until_idle(s.url, LEASE_S + 15))


@FAULT_TIMEOUT
def test_a_killed_decode_instance_leaves_the_prefill_blocks_to_the_lease(pd_set):
    """Fault 5: the decode instance the prefill instance holds blocks for is killed (SIGKILL):
    nobody will pull or release them, and the prefill instance frees them when the lease
    (`kv_lease_duration`, here 5 s) runs out, counted in `vllm:nixl_num_kv_expired_reqs`."""
    prompt = _prompt()
    expired = "vllm:nixl_num_kv_expired_reqs_total"
    before = metrics(pd_set.prefill.url).get(expired, 0.0)
    _prefill(pd_set, prompt)  # for the recompute instance, which never pulls it
    t_prefilled = time.monotonic()
    assert kv_usage(pd_set.prefill.url) > 0
    _signal(pd_set.recompute, signal.SIGKILL)
    pd_set.recompute.proc.wait(10)
    _until_idle(pd_set.prefill.url, LEASE_S + 15)
    freed_after = time.monotonic() - t_prefilled
    _measured("decode killed, prefill blocks freed after the prefill answered (lease)", freed_after)
    assert freed_after > LEASE_S - 1, "freed before the lease ran out"
    assert metrics(pd_set.prefill.url).get(expired, 0.0) >= before + 1


@FAULT_TIMEOUT
def test_a_prefill_instance_killed_before_the_pull_fails_within_the_bound(pd_set):
    """Fault 1: a prefill instance answers, then is killed (SIGKILL) before the decode engine pulls
    the KV: `fail` answers 502 naming it when the connection is refused, or our deadline's 504 when
    the transfer to the dead peer hangs; within the bound either way, no engine request left.

    Last in the module, and `fail` only: in one full-suite run the `recompute` instance's UCX (TCP)
    transfer to the killed peer hung instead of failing, so vLLM never recomputed (our deadline
    still ended the leg with its 504), and the hung NIXL worker stalled both engines for ~100 s.
    Recompute itself is proven by the unreachable-side-channel test."""
    prompt = _prompt()
    kv = _prefill(pd_set, prompt)
    _signal(pd_set.prefill, signal.SIGKILL)
    pd_set.prefill.proc.wait(10)
    r, took = _decode(pd_set.fail.url, prompt, kv)
    _measured(f"prefill killed, fail policy, time to error ({r.status_code})", took)
    assert r.status_code in _EXPECTED, r.text
    message = _error(r)["message"]
    assert message.startswith(_EXPECTED[r.status_code]) and kv["remote_engine_id"] in message
    assert took < BOUND_S, took
    # 502: the connection was refused. 504: the UCX transfer to the dead peer hung (seen after the
    # lease test); the leg still ended at our deadline, but the decode instance keeps the
    # destination blocks until NIXL gives the transfer up (as in the stalled case), so only its
    # engine requests are checked then.
    _until_idle(pd_set.fail.url, 5, blocks=r.status_code == 502)
