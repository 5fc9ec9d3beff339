"""`--log-format json` with lines that bypass logging (decode_server/process/stdio_json.py): a bare
print, a raw write to fd 2 as libtorch's C++ warnings make, a spawned child printing before any
logging exists (as vLLM's engine core does while it imports), and multiprocessing's resource
tracker at exit. Every line on both streams is one JSON object and nothing is lost. The real
engine's log is read back whole by tests/engine/prod/test_operations.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import logging, multiprocessing, os, sys
from multiprocessing import shared_memory
from decode_server.process.vllm_logs import use_json_logs

def child():
    print("child print before logging", flush=True)

if __name__ == "__main__":
    use_json_logs(["serve", "x", "--log-format", "json"])
    print("a bare print")
    os.write(2, b"[W1202 utils.cpp:68] Warning: a C++ warning\n" + "ünïcode and a \"quote\"".encode() + b"\n")
    logging.getLogger("decode_server.try").warning("a logged warning")
    p = multiprocessing.get_context("spawn").Process(target=child)
    p.start(); p.join()
    leaked = shared_memory.SharedMemory(create=True, size=16)  # the tracker reports it at exit
    sys.stdout.write("no newline at the end")  # flushed by the exit hook, wrapped at the end
"""


def _records(text: str) -> list[dict]:
    records = []
    for line in text.splitlines():
        record = json.loads(line)  # fails the test on the first line that is not JSON
        assert isinstance(record, dict), line
        assert {"ts", "level", "logger", "process", "pid"} <= set(record), record
        records.append(record)
    return records


def test_every_line_on_both_streams_is_one_json_object_and_none_is_lost(tmp_path):
    script = tmp_path / "writes.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    out, err = _records(done.stdout), _records(done.stderr)
    bare = {(r["logger"], r["message"]) for r in out + err if r["process"] == "unattributed"}
    assert ("stdout", "a bare print") in bare
    assert ("stdout", "child print before logging") in bare
    assert ("stderr", "[W1202 utils.cpp:68] Warning: a C++ warning") in bare
    assert ("stderr", 'ünïcode and a "quote"') in bare
    assert ("stdout", "no newline at the end") in bare
    assert any(logger == "stderr" and "resource_tracker" in message and "leaked shared_memory" in message
               for logger, message in bare), bare
    logged = [r for r in err if r["logger"] == "decode_server.try"]
    assert [(r["message"], r["process"], r["level"]) for r in logged] == [("a logged warning", "MainProcess", "warning")]
    assert all(r["pid"] is None and r["level"] == {"stdout": "info", "stderr": "warning"}[r["logger"]]
               for r in out + err if r["process"] == "unattributed")
