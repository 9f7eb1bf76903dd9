"""The webhook worker beside a step worker.

A step worker does not take `reactq.webhooks` into its own thread pool: a receiver that answers slowly
would hold a step thread for up to an attempt's deadline, and enough of them would stall every tenant's
runs. Instead a step worker (`reactq worker` or `celery -A worker.celery_app worker`: Celery's worker_init
signal, worker/tasks/worker_setup.py) serving `reactq.steps` starts `reactq worker --queues webhooks` as a
child process with `webhook_concurrency` threads (REACTQ_WEBHOOK_CONCURRENCY, 0: none, for deployments that run
webhook workers of their own). Step work never waits on it: its own Celery consumer, thread pool, Redis
connections and memory. The child is restarted if it exits on its own, stopped with SIGTERM (a warm
shutdown: attempts in flight end within their deadline) when the step worker stops, and stops itself
when its parent is gone (it watches its parent's pid: a SIGKILLed step worker leaves no orphan behind).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

log = logging.getLogger(__name__)

RESTART_AFTER_S = 2.0  # a child that exited on its own is started again after this
STOP_WAIT_S = 30.0  # a stopped child has this long to end its attempts in flight, then is killed
PARENT_POLL_S = 1.0


class WebhookPool:
    def __init__(self, concurrency: int, loglevel: str) -> None:
        self.argv = [sys.executable, "-m", "worker.cli", "worker", "--queues", "webhooks", "--concurrency",
                     str(concurrency), "--metrics-port", "0", "--loglevel", loglevel, "--parent-pid", str(os.getpid())]
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> WebhookPool:
        with self._lock:
            self.proc = subprocess.Popen(self.argv)
        threading.Thread(target=self._keep, name="reactq-webhook-pool", daemon=True).start()
        return self

    def _keep(self) -> None:
        while not self._stopping.is_set():
            assert self.proc is not None
            code = self.proc.wait()
            if self._stopping.wait(RESTART_AFTER_S):
                return
            log.warning("the webhook worker exited (code %s); starting it again", code)
            with self._lock:
                if self._stopping.is_set():
                    return
                self.proc = subprocess.Popen(self.argv)

    def stop(self) -> None:
        with self._lock:
            self._stopping.set()
            proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def exit_with_parent(parent_pid: int) -> None:
    """In the child: a warm shutdown of this process (SIGTERM to itself) once `parent_pid` is no longer its
    parent (the step worker died without stopping it)."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        log.warning("the step worker that started this webhook worker is gone; stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="reactq-parent-watch", daemon=True).start()
