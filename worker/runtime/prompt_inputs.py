"""What a run's turn is sent, built the same way for the step (runner._ask) and for `reactq trace --prompt`:
the pure builder (worker/core/prompts.py) fed with the run, its steps, the tools its tenant's plan
allows, the plan's agent name and instructions, the settings' limits and template. The date is the
run's (its UTC creation day, or REACTQ_PROMPT_DATE), so a rebuilt prompt equals the one sent as long as
the plan, the templates and the tools are unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core import prompts
from ..core.models import Mode, Run, Step
from ..prompt_templates import system_template
from .context import Runtime


def prompt_context(rt: Runtime, run: Run) -> prompts.PromptContext:
    s = rt.settings
    policy = rt.tenants.policy(run.spec.tenant)
    plan = policy.plan if policy is not None else None
    return prompts.PromptContext(
        agent_name=(plan.agent_name if plan is not None and plan.agent_name else s.agent_name),
        date=prompts.run_date(run.created_at, s.prompt_date.isoformat() if s.prompt_date else None),
        max_steps=run.max_steps, max_retries=s.max_invalid_outputs - 1, repeat_limit=s.repeat_fail_at - 1,
        plan_instructions=(plan.instructions if plan is not None else ""),
        run_instructions=run.spec.instructions or "", output_schema=run.spec.output_schema,
    )


def turn_messages(rt: Runtime, run: Run, steps: Sequence[Step],
                  tools: Sequence[Any]) -> tuple[list[prompts.Message], int]:
    """The messages of the turn that follows `steps`, and how many older steps were compacted."""
    s = rt.settings
    spec = s.models.get(run.model)
    budget = prompts.context_budget(s.context_budget_tokens, spec.context_tokens if spec is not None else None,
                                    s.llm_max_tokens, tools if run.mode == Mode.TOOLS else ())
    return prompts.build_messages(
        run.mode, run.spec.question, steps, tools, context_budget_tokens=budget,
        system_template=system_template(s, run.mode), prompt=prompt_context(rt, run),
        keep_recent_steps=s.keep_recent_steps, reflect_every=s.reflect_every,
    )
