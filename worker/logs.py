"""Structured logs: one JSON object a line, with the run id and step of the record when there is one.

Inside a Celery task the run id and step are bound for the whole task (task_prerun to task_postrun),
so every line logged while a step runs carries them, whichever logger wrote it (ours, Celery's,
a library's), as long as it is logged from the task's thread.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from .names import SANDBOX_TASK, STEP_TASK

STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}

_bound: ContextVar[dict[str, Any] | None] = ContextVar("reactq_log_context", default=None)


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Add `fields` (e.g. run_id, step) to every line logged in this thread/context meanwhile."""
    token = _bound.set({**(_bound.get() or {}), **fields})
    try:
        yield
    finally:
        _bound.reset(token)


def task_fields(task_name: str, args: Any) -> dict[str, Any]:
    """The run id and step a reactq task works on, from its arguments (empty for other tasks)."""
    try:
        if task_name == STEP_TASK:
            return {"run_id": args[0], "step": args[1]}
        if task_name == SANDBOX_TASK:
            run_id, step = args[0]["continue_args"][:2]
            return {"run_id": run_id, "step": step}
    except (IndexError, KeyError, TypeError, ValueError):
        pass
    return {}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        data.update(_bound.get() or {})
        data.update({k: v for k, v in record.__dict__.items() if k not in STANDARD and not k.startswith("_")})
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str, ensure_ascii=False)


def bind_task(task_name: str, args: Any) -> None:
    """Bind the run id and step of the task this thread starts (until `unbind_task`); worker.tasks calls
    it from Celery's task_prerun signal."""
    _bound.set(task_fields(task_name, args) or None)


def unbind_task() -> None:
    _bound.set(None)


def setup(level: str = "INFO") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "openai", "urllib3", "docker"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
