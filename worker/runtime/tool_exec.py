"""Inline tool calls with a deadline: no call can hold a step (or a step worker) past its tool's `timeout_s`.

A step worker is one process running many steps on threads, so a tool call must never run on the step's
own thread unbounded:
- `isolation="thread"` (the default; I/O-bound tools): the call runs on a thread of its own and the step
  waits for it until the deadline. A call past it is abandoned: its thread runs on (Python cannot stop a
  thread) and is counted as stuck. Past REACTQ_TOOL_STUCK_THREADS_PER_TENANT stuck threads for one
  (tool, tenant), or REACTQ_TOOL_STUCK_THREADS_MAX in the process, further calls are refused at once
  ("busy") until some end, so a hung tool costs a bounded number of idle threads, never a step.
- `isolation="process"` (CPU-bound tools): the call runs in one of REACTQ_TOOL_PROCESSES processes beside
  the worker (forkserver children, so never a fork of the threaded worker). A call past its deadline has
  its process SIGKILLed; the next call starts a fresh one. A call waits for a free process within its own
  deadline; one tenant holds at most REACTQ_TOOL_PROCESSES_PER_TENANT of them at once (further calls are
  refused, "busy"), so others keep a process. The processes run at REACTQ_TOOL_PROCESS_NICE (10), so a
  spinning call yields the CPU to the worker's own threads, with an address-space cap of
  REACTQ_TOOL_PROCESS_MEMORY_MB (1024), and each caps its CPU time per call (RLIMIT_CPU), so one whose
  worker was SIGKILLed mid-call dies on its own.
Either way the step gets a `Called` result: ok, error (a ToolError's message, or the class name of an
unexpected exception) or timeout, and the run goes on with its next step.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import queue
import resource
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from pydantic import BaseModel

from .. import metrics
from ..config import Settings
from ..errors import ToolError
from ..tools import Tool

log = logging.getLogger("reactq.tools")


@dataclass(frozen=True)
class Called:
    """What one call came to: `outcome` ok | error | timeout; `error_type` labels a failure's metric."""

    content: str
    outcome: str = "ok"
    error_type: str | None = None


def timed_out(name: str, timeout_s: float) -> Called:
    return Called(f"Error: {name} took longer than {timeout_s:g} s and was stopped.", "timeout", "timeout")


def _guarded(func: Callable[[Any], str], name: str, args: BaseModel) -> Called:
    """Run the tool's function; a failure becomes a short message (a crash's text goes to the log only)."""
    try:
        return Called(func(args))
    except ToolError as exc:  # one that ends its call at its own deadline (an MCP tool's) is a timeout
        return Called(f"Error: {exc}", "timeout" if exc.error_type == "timeout" else "error", exc.error_type)
    except Exception as exc:  # a bug in a tool: the model hears a short reason, the log has it all
        log.exception("tool %s crashed", name)
        return Called(f"Error: {name} failed ({exc.__class__.__name__})", "error", "exception")


class ToolExecutor:
    def __init__(self, *, timeout_s: float = 30.0, processes: int = 2, processes_per_tenant: int = 1,
                 stuck_max: int = 64, stuck_per_tenant: int = 4, nice: int = 10, memory_mb: int = 1024,
                 preload: tuple[str, ...] = ("worker.tools",)) -> None:
        self.timeout_s = timeout_s
        self._threads = _Threads(stuck_max, stuck_per_tenant)
        self._processes = _Processes(processes, processes_per_tenant, preload, (nice, memory_mb))

    @classmethod
    def from_settings(cls, s: Settings) -> ToolExecutor:
        return cls(timeout_s=s.tool_timeout_s, processes=s.tool_processes,
                   processes_per_tenant=s.tool_processes_per_tenant, stuck_max=s.tool_stuck_threads_max,
                   stuck_per_tenant=s.tool_stuck_threads_per_tenant, nice=s.tool_process_nice,
                   memory_mb=s.tool_process_memory_mb, preload=("worker.tools", *s.tool_modules))

    def call(self, tool: Tool, args: BaseModel, tenant: str) -> Called:
        if tool.func is None:
            return Called(f"Error: {tool.name} cannot run inline", "error", "not_inline")
        timeout_s = tool.timeout_s or self.timeout_s
        if tool.isolation == "process":
            return self._processes.call(tool, args, timeout_s, tenant)
        return self._threads.call(tool, args, timeout_s, tenant)

    def stuck_threads(self) -> int:
        return self._threads.total

    def process_calls(self, tenant: str) -> int:
        """The tenant's calls waiting for or holding a tool process."""
        return self._processes.calls(tenant)

    def close(self) -> None:
        self._processes.close()


class _Threads:
    """Calls on threads of their own, reused: a thread whose call has answered (in time or not) waits for
    the next one; at most IDLE_THREADS wait, the others end."""

    IDLE_THREADS = 64

    def __init__(self, stuck_max: int, stuck_per_tenant: int) -> None:
        self.stuck_max, self.stuck_per_tenant = stuck_max, stuck_per_tenant
        self._lock = threading.Lock()
        self._stuck: Counter[tuple[str, str]] = Counter()
        self.total = 0
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = 0  # threads waiting on _jobs, each counted until a job is put for it

    def call(self, tool: Tool, args: BaseModel, timeout_s: float, tenant: str) -> Called:
        key = (tool.name, tenant)
        with self._lock:
            stuck = self._stuck[key]
            if stuck >= self.stuck_per_tenant:
                return Called(f"Error: {tool.name} is not answering ({stuck} earlier call(s) still running "
                              "past their deadline); try again later.", "error", "busy")
            if self.total >= self.stuck_max:
                return Called(f"Error: {tool.name} cannot run now (this worker has {self.total} calls still "
                              "running past their deadline); try again later.", "error", "busy")
        assert tool.func is not None
        func = tool.func
        box: list[Called] = []
        done = threading.Event()
        abandoned = False

        def job() -> None:
            try:
                box.append(_guarded(func, tool.name, args))
            finally:
                with self._lock:
                    done.set()
                    if abandoned:
                        self._unstick(key)

        self._start(job)
        if done.wait(timeout_s):
            return box[0]
        with self._lock:
            if done.is_set():  # it answered just as the wait ended
                return box[0]
            abandoned = True
            self._stuck[key] += 1
            self.total += 1
            metrics.TOOL_STUCK_THREADS.set(self.total)
        log.warning("tool %s passed its %g s deadline; its thread is abandoned", tool.name, timeout_s,
                    extra={"tool": tool.name, "tenant": tenant})
        return timed_out(tool.name, timeout_s)

    def _start(self, job: Callable[[], None]) -> None:
        with self._lock:
            reuse = self._idle > 0
            if reuse:
                self._idle -= 1
        self._jobs.put(job)
        if not reuse:
            threading.Thread(target=self._serve, name="reactq-tool", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._jobs.get()()
            with self._lock:
                if self._idle >= self.IDLE_THREADS:
                    return
                self._idle += 1

    def _unstick(self, key: tuple[str, str]) -> None:
        self._stuck[key] -= 1
        if not self._stuck[key]:
            del self._stuck[key]
        self.total -= 1
        metrics.TOOL_STUCK_THREADS.set(self.total)


class _Child:
    """One process serving calls over a pipe, one at a time."""

    def __init__(self, ctx: Any, limits: tuple[int, int]) -> None:
        self.conn, theirs = multiprocessing.Pipe()
        self.process = ctx.Process(target=_serve, args=(theirs, *limits), name="reactq-tool-process", daemon=True)
        self.process.start()
        theirs.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


class _Processes:
    def __init__(self, size: int, per_tenant: int, preload: tuple[str, ...], limits: tuple[int, int]) -> None:
        self.limits = limits  # the processes' nice and address-space cap (MB, 0: none)
        self._ctx: Any = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(list(preload))
        self._free = threading.BoundedSemaphore(size)
        self.per_tenant = per_tenant
        self._lock = threading.Lock()
        self._idle: list[_Child] = []
        self._calls: Counter[str] = Counter()  # tenant -> its calls waiting for or holding a process

    def call(self, tool: Tool, args: BaseModel, timeout_s: float, tenant: str) -> Called:
        with self._lock:
            if self._calls[tenant] >= self.per_tenant:
                return Called(f"Error: {tool.name} is busy with {self._calls[tenant]} earlier call(s) of yours; "
                              "try again when they have answered.", "error", "busy")
            self._calls[tenant] += 1
        try:
            return self._call(tool, args, timeout_s)
        finally:
            with self._lock:
                self._calls[tenant] -= 1
                if not self._calls[tenant]:
                    del self._calls[tenant]

    def calls(self, tenant: str) -> int:
        with self._lock:
            return self._calls[tenant]

    def _call(self, tool: Tool, args: BaseModel, timeout_s: float) -> Called:
        deadline = time.monotonic() + timeout_s
        if not self._free.acquire(timeout=timeout_s):  # every process busy for the whole deadline
            return timed_out(tool.name, timeout_s)
        child: _Child | None = None
        try:
            with self._lock:
                child = self._idle.pop() if self._idle else None
            if child is None:
                child = _Child(self._ctx, self.limits)
            child.conn.send((tool.func, tool.name, args, timeout_s))
            if not child.conn.poll(max(0.0, deadline - time.monotonic())):
                child.kill()
                child = None
                log.warning("tool %s passed its %g s deadline; its process was killed", tool.name, timeout_s,
                            extra={"tool": tool.name})
                return timed_out(tool.name, timeout_s)
            result: Called = child.conn.recv()
        except (EOFError, OSError):  # the child died mid-call (killed, out of memory, CPU limit)
            if child is not None:
                child.kill()
                child = None
            return Called(f"Error: {tool.name} failed (its process exited)", "error", "crashed")
        except Exception as exc:  # the call could not be sent (a function or arguments that do not pickle)
            log.exception("tool %s cannot run in a process", tool.name)
            if child is not None:
                child.kill()
                child = None
            return Called(f"Error: {tool.name} failed ({exc.__class__.__name__})", "error", "exception")
        finally:
            if child is not None:
                with self._lock:
                    self._idle.append(child)
            self._free.release()
        return result

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for child in idle:
            child.kill()


def _serve(conn: Connection, nice: int, memory_mb: int) -> None:
    """A tool process: run calls until the worker closes the pipe. Before each call, the CPU time this
    process may use is capped at what it has used plus the call's deadline (and a second): past it the
    kernel ends the process even if no worker is left to kill it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(nice)
    if memory_mb:  # an allocation past it is a MemoryError in the tool (its call fails, the process lives)
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, hard))
    while True:
        try:
            func, name, args, timeout_s = conn.recv()
        except (EOFError, OSError):
            return
        used = resource.getrusage(resource.RUSAGE_SELF)
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        soft = math.ceil(used.ru_utime + used.ru_stime + timeout_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
        conn.send(_guarded(func, name, args))


_lock = threading.Lock()
_shared: dict[tuple[Any, ...], ToolExecutor] = {}


def shared_executor(s: Settings) -> ToolExecutor:
    """The process's executor for these settings (one in a worker: stuck-thread counts and the process
    pool are per process, whatever the number of runtimes in it)."""
    key = (s.tool_timeout_s, s.tool_processes, s.tool_processes_per_tenant, s.tool_stuck_threads_max,
           s.tool_stuck_threads_per_tenant, s.tool_process_nice, s.tool_process_memory_mb, tuple(s.tool_modules))
    with _lock:
        if key not in _shared:
            _shared[key] = ToolExecutor.from_settings(s)
        return _shared[key]
