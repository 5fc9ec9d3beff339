"""One access line per generate request, and the `--log-format json` formatter."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

access = logging.getLogger("decode_server.access")


def log_request(
    *,
    request_id: str | None,
    output_mode: str,
    status: int,
    prompt_tokens: int,
    output_tokens: int,
    ttft_s: float | None,
    duration_s: float,
) -> None:
    fields = {
        "request_id": request_id,
        "output_mode": output_mode,
        "status": status,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "ttft_ms": None if ttft_s is None else round(ttft_s * 1000, 1),
        "duration_ms": round(duration_s * 1000, 1),
    }
    access.info(
        "request_id=%s output_mode=%s status=%d prompt_tokens=%d output_tokens=%d ttft_ms=%s duration_ms=%.1f",
        request_id, output_mode, status, prompt_tokens, output_tokens, fields["ttft_ms"], fields["duration_ms"],
        extra={"fields": fields},
    )


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            # vLLM names its processes (EngineCore, a worker) on their records; ours are the process's.
            "process": getattr(record, "vllm_process_name", record.processName),
            "pid": record.process,
        }
        fields = getattr(record, "fields", None)
        if fields:
            out.update(fields)
        else:
            out["message"] = record.getMessage()
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # vLLM configures its own loggers with their own handlers; leave those alone.
    logging.getLogger("decode_server").propagate = True
