"""Store reads and writes only tests make: setting up what a worker that died would have left, and
looking at keys the runtime itself never asks about."""

from __future__ import annotations

from worker.core.models import LLMReply
from worker.store import keys
from worker.store.llm_slots import LLMSlots
from worker.store.runs import RunStore


def save_reply(store: RunStore, run_id: str, step: int, reply: LLMReply) -> None:
    """Store step `step`'s LLM reply as a delivery that then died would have (unless one is stored)."""
    store.r.set(keys.reply(run_id, step), reply.model_dump_json(), nx=True, ex=store.ttl)


def lease_held(store: RunStore, run_id: str) -> bool:
    """Whether anyone holds the run's step lease."""
    return bool(store.r.exists(keys.lease(run_id)))


def slots_held(slots: LLMSlots, model: str) -> int:
    """How many of the model's in-flight slots are held (the cap itself only ever tries to take one)."""
    return int(slots.r.zcard(keys.llm_in_flight(model)))
