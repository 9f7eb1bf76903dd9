"""`reactq batch`: read JSONL, submit what is missing from the output file, write results as runs finish."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .admission import AdmissionRefused
from .config import Settings
from .core.models import Run, RunSpec
from .errors import InvalidRequest
from .store import RunStore
from .submit import known_tiers, new_batch_id, submit, tenant_policy, validate_spec
from .tenants import Policy, Tenants


class BatchLine(BaseModel, extra="forbid"):
    id: str | None = None
    question: str
    tenant: str | None = None
    tier: str | None = None
    max_steps: int | None = None
    model: str | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    deadline_s: float | None = None
    expected: str | None = None  # allowed for evaluation sets such as the demo's; not used by the engine


@dataclass
class LineError:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class ParsedInput:
    specs: list[RunSpec] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)


def parse_input(lines: Iterator[str], settings: Settings, tenant: str | None, tier: str | None,
                tenants: Tenants | None = None) -> ParsedInput:
    """Every good line becomes a spec; every bad one an error naming its line number. With `tenants`,
    each line's tenant must exist and its plan allow the line's tier (default: the plan's default tier)."""
    out = ParsedInput()
    tiers = known_tiers(settings)
    policies: dict[str, Policy] = {}
    seen: set[str] = set()
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            line = BatchLine.model_validate_json(text)
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(p) for p in problem["loc"])
            out.errors.append(LineError(number, f"{where + ': ' if where else ''}{problem['msg']}"))
            continue
        client_id = line.id or f"line-{number}"
        if client_id in seen:
            out.errors.append(LineError(number, f"duplicate id {client_id!r}"))
            continue
        owner = line.tenant or tenant or "default"
        try:
            policy = None
            if tenants is not None:
                policy = policies.get(owner) or policies.setdefault(owner, tenant_policy(tenants, owner))
            spec = RunSpec(question=line.question, tenant=owner,
                           tier=line.tier or tier or (policy.plan.default_tier if policy else None) or "standard",
                           max_steps=line.max_steps, model=line.model, max_tokens=line.max_tokens,
                           max_cost_usd=line.max_cost_usd, deadline_s=line.deadline_s, client_id=client_id)
            validate_spec(spec, settings, tiers, policy=policy)
        except InvalidRequest as exc:
            out.errors.append(LineError(number, str(exc)))
            continue
        seen.add(client_id)
        out.specs.append(spec)
    return out


def finished_ids(out_path: Path) -> set[str]:
    """Ids already written to the output file (a re-run skips them)."""
    done: set[str] = set()
    if out_path.exists():
        for text in out_path.read_text(encoding="utf-8").splitlines():
            try:
                done.add(json.loads(text)["id"])
            except (ValueError, KeyError, TypeError):
                continue
    return done


@dataclass
class Progress:
    total: int
    done: int = 0
    failed: int = 0
    running: int = 0
    steps: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    lost: list[str] = field(default_factory=list)  # run records that vanished from Redis


LOST_AFTER_S = 10.0
SUBMIT_CHUNK = 500


class BatchRunner:
    """Submits a batch and follows it to the end, writing each result line as its run finishes."""

    def __init__(self, store: RunStore, settings: Settings, send_step: Callable[..., None],
                 on_wait: Callable[[AdmissionRefused], None] | None = None) -> None:
        self.store = store
        self.settings = settings
        self.send_step = send_step
        self.on_wait = on_wait  # told before waiting out an admission refusal (runs in flight, per minute)

    def start(self, specs: list[RunSpec], out_path: Path) -> tuple[str, dict[str, str]]:
        """Submit the specs whose ids are missing from the output file, adopting runs a previous
        invocation for the same output file already submitted. Returns (batch id, client id -> run id)."""
        digest = hashlib.sha256(str(out_path.resolve()).encode()).hexdigest()[:24]
        done = finished_ids(out_path)
        wanted = [s for s in specs if s.client_id not in done]
        old = self.store.batch_for_file(digest)
        adopted: dict[str, str] = {}
        if old:
            for spec, run in zip(wanted, self.store.load_runs([old.get(s.client_id or "", "") for s in wanted]),
                                 strict=True):
                if run is not None and run.spec.question == spec.question:
                    adopted[spec.client_id or ""] = run.id
        batch_id = new_batch_id()
        owners = sorted({s.tenant for s in wanted})
        self.store.create_batch(batch_id, {"size": str(len(wanted)), "out": str(out_path),
                                           "tenant": owners[0] if len(owners) == 1 else ""})
        mapping = dict(adopted)
        self.store.remember_batch_for_file(digest, batch_id, mapping)
        fresh = [s for s in wanted if s.client_id not in adopted]
        for chunk in _chunks(fresh, self._chunk_size(fresh)):
            runs = self._submit_admitted(chunk, batch_id)
            submitted = {run.spec.client_id or "": run.id for run in runs}
            mapping.update(submitted)
            self.store.record_batch_ids(batch_id, submitted)
        return batch_id, mapping

    def _chunk_size(self, specs: list[RunSpec]) -> int:
        """Submit in parts no plan involved refuses for their size alone."""
        size = SUBMIT_CHUNK
        tenants = Tenants(self.store.r, self.settings)
        for name in {s.tenant for s in specs}:
            if (policy := tenants.policy(name)) is not None:
                size = min(size, policy.plan.limits.runs_in_flight, policy.plan.limits.submissions_per_minute)
        return size

    def _submit_admitted(self, chunk: list[RunSpec], batch_id: str) -> list[Run]:
        """Submit, waiting out admission refusals (the tenant's runs in flight, submissions per minute)."""
        while True:
            try:
                return submit(self.store, chunk, self.settings, self.send_step, batch_id=batch_id)
            except AdmissionRefused as exc:
                if self.on_wait is not None:
                    self.on_wait(exc)
                time.sleep(exc.retry_after_s)

    def follow(
        self, run_ids: list[str], on_finished: Callable[[Run], None], on_tick: Callable[[Progress], None],
        poll_s: float = 0.25, timeout_s: float | None = None,
    ) -> Progress:
        progress = Progress(total=len(run_ids))
        pending = set(run_ids)
        missing_since: dict[str, float] = {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            running = 0
            for chunk in _chunks(sorted(pending), 500):
                for run_id, run in zip(chunk, self.store.load_runs(chunk), strict=True):
                    if run is None:  # only a Redis that lost data (or a record past its TTL) does this
                        if time.monotonic() - missing_since.setdefault(run_id, time.monotonic()) > LOST_AFTER_S:
                            pending.discard(run_id)
                            progress.lost.append(run_id)
                        continue
                    if run.status.finished:
                        pending.discard(run_id)
                        progress.done += 1
                        progress.failed += run.status.value != "succeeded"
                        progress.steps += run.current_step
                        progress.tokens += run.usage.prompt_tokens + run.usage.completion_tokens
                        progress.cost_usd += run.cost_usd
                        on_finished(run)
                    elif run.status.value == "running":
                        running += 1
            progress.running = running
            on_tick(progress)
            if pending:
                if deadline is not None and time.monotonic() > deadline:
                    break
                time.sleep(poll_s if len(pending) < 2000 else 1.0)
        return progress


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
