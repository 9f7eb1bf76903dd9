"""The throughput floor: a bare Celery chain (no reactq code on the hot path).

Each task makes one chat call to the LLM server and enqueues the next task of its chain,
forever; bench/throughput.py starts N chains, counts completions at the stub, then stops the
workers. Same broker settings as reactq's app (acks_late, prefetch 1, pools sized for hundreds
of tasks in flight), and the request body is reactq's own step-0 prompt, so the LLM server does
the same work per call.

    celery -A bench.floor_app worker -Q bench.floor -P threads|gevent -c N

The call is the openai client's `chat.completions.create` (FLOOR_CLIENT=openai, the default: what a plain
Celery script calling a model writes, and the client reactq must use), streamed or not as reactq's call is
(FLOOR_STREAM=1 or 0, bench/throughput.py sets it from REACTQ_LLM_STREAM); FLOOR_CLIENT=httpx posts the body
with a bare httpx client and decodes the JSON, a stricter floor no openai user gets (always unstreamed).

Environment: FLOOR_REDIS_URL, FLOOR_LLM_BASE_URL, FLOOR_MAX_CONNECTIONS (default 1024), FLOOR_CLIENT,
FLOOR_STREAM.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

try:  # under `-P gevent` the select module lacks epoll, so trio (which httpcore probes for) fails to import
    from gevent import monkey

    if monkey.is_module_patched("select"):
        import sys

        sys.modules.setdefault("trio", None)  # makes `import trio` raise ImportError: httpcore then skips it
except ImportError:
    pass

import httpx
import httpx2
from celery import Celery

FLOOR_QUEUE = "bench.floor"
FLOOR_TASK = "bench.floor.step"

REDIS_URL = os.environ.get("FLOOR_REDIS_URL", "redis://127.0.0.1:6379/0")
LLM_BASE_URL = os.environ.get("FLOOR_LLM_BASE_URL", "http://127.0.0.1:8900/v1").rstrip("/")
MAX_CONNECTIONS = int(os.environ.get("FLOOR_MAX_CONNECTIONS", "1024"))
CLIENT = os.environ.get("FLOOR_CLIENT", "openai")
STREAM = os.environ.get("FLOOR_STREAM", "1") == "1"

app = Celery("bench_floor", broker=REDIS_URL)
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    task_default_queue=FLOOR_QUEUE,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    worker_send_task_events=False,
    broker_connection_retry_on_startup=True,
    broker_pool_limit=MAX_CONNECTIONS,
    redis_max_connections=MAX_CONNECTIONS,
    broker_transport_options={"visibility_timeout": 3600, "max_connections": MAX_CONNECTIONS,
                              "socket_keepalive": True},
)


def request_body(question: str) -> dict:
    """reactq's step-0 request for `question` (tools mode: system + user messages + tool schemas)."""
    from worker.config import Settings
    from worker.core.models import Mode
    from worker.core.prompts import build_messages
    from worker.prompt_templates import system_template
    from worker.tools import REGISTRY

    tools = REGISTRY.all()
    messages, _ = build_messages(Mode.TOOLS, question, [], tools, context_budget_tokens=6000,
                                 system_template=system_template(Settings(), Mode.TOOLS))
    return {"model": "reactq-stub", "messages": messages, "temperature": 0.0,
            "tools": [t.openai_schema() for t in tools]}


_BODY = request_body("What is 17 * 23 + 4?")
_BODY_BYTES = json.dumps(_BODY).encode()
_client: Any = None
_lock = threading.Lock()


def client() -> Any:
    """One client per process, shared by its threads (as reactq's workers share theirs)."""
    global _client
    with _lock:
        if _client is None:
            if CLIENT == "httpx":
                limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS)
                _client = httpx.Client(limits=limits, timeout=60.0)
            else:
                import openai

                http_client = openai.DefaultHttpxClient(
                    limits=httpx2.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS))
                _client = openai.OpenAI(base_url=LLM_BASE_URL, api_key="floor", max_retries=0, timeout=60.0,
                                        http_client=http_client)
        return _client


def chat() -> None:
    """One chat call, its answer read to the end."""
    if CLIENT == "httpx":
        response = client().post(f"{LLM_BASE_URL}/chat/completions", content=_BODY_BYTES,
                                 headers={"content-type": "application/json", "authorization": "Bearer floor"})
        response.raise_for_status()
        response.json()
    elif STREAM:
        chunks = client().chat.completions.create(**_BODY, stream=True, stream_options={"include_usage": True})
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        _ = client().chat.completions.create(**_BODY).choices[0].message


@app.task(name=FLOOR_TASK, acks_late=True, ignore_result=True)
def step(chain: int, index: int) -> None:
    chat()
    step.apply_async(args=[chain, index + 1], queue=FLOOR_QUEUE)
