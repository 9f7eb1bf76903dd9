"""Reading a batch (or evaluation) file as a stream: one validated line at a time, with memory flat in
the file's size. Duplicate ids are found by a first pass that keeps 8 bytes per line.

A batch is one tenant's, as a batch of the API is: whoever holds that tenant's key may cancel or delete
the whole batch. A file whose lines name several tenants (a line without `tenant` is the command's
`--tenant`, else `default`) is refused before anything is submitted, naming the tenants and their lines.
It is not split into one batch per tenant: one `--out` file, one batch id to cancel or follow, and the
adoption of an interrupted invocation's runs all stay one-to-one, and a mixed file is more likely a
mistake than a wish."""

from __future__ import annotations

import hashlib
import json
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, StrictBool, ValidationError

from ..config import Settings
from ..core.models import Finite, Instructions, RunSpec
from ..errors import InvalidRequest
from ..evals.categories import Category
from ..evals.scoring import MatchMode, check_expected
from ..tenancy.plans import known_tiers
from ..tenancy.tenants import Policy, Tenants
from .submit import tenant_policy, validate_spec

__all__ = ["BatchLine", "IdSet", "LineError", "ParsedLine", "digest", "finished_ids", "iter_input"]

SHOWN = 5  # tenants, and line numbers per tenant, named when a file mixes tenants


class BatchLine(BaseModel, extra="forbid"):
    id: str | None = None
    question: str
    tenant: str | None = None
    tier: str | None = None
    max_steps: int | None = None
    model: str | None = None
    max_tokens: int | None = None
    max_cost_usd: Finite | None = None  # NaN and Infinity (1e400) are refused: they would mean no budget
    deadline_s: Finite | None = None
    expected: str | list[str] | dict[str, Any] | None = None  # evaluation sets (`reactq eval`); not used by the engine
    match: MatchMode | None = None  # how `expected` is compared (default: contains)
    category: Category | None = None  # evaluation sets: the figures of `reactq eval` per category
    webhook_url: str | None = None
    instructions: Instructions | None = None  # added to the run's system prompt
    output_schema: dict[str, Any] | None = None  # a JSON Schema the final answer must fit (checked by validate_spec)
    python_session: StrictBool | None = None  # python keeps its globals across the run's calls (default: the plan's)


@dataclass(frozen=True)
class LineError:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


Expected = tuple[str | list[str] | dict[str, Any], MatchMode]


@dataclass(frozen=True)
class ParsedLine:
    spec: RunSpec  # spec.client_id is the line's id (or line-N)
    expected: Expected | None = None
    category: str | None = None


def digest(text: str) -> int:
    """64 bits of an id: collisions are negligible for any file that fits on a disk."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class IdSet:
    """A read-only set of ids in 8 bytes each (a sorted array of digests)."""

    def __init__(self, ids: Iterable[str]) -> None:
        values = array("Q", (digest(i) for i in ids))
        self._sorted = array("Q", sorted(values))

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, str):
            return False
        value = digest(item)
        i = bisect_left(self._sorted, value)
        return i < len(self._sorted) and self._sorted[i] == value

    def __len__(self) -> int:
        return len(self._sorted)


def _object(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _line_id(number: int, value: dict | None) -> str | None:
    if value is None:
        return None
    given = value.get("id")
    return given if isinstance(given, str) and given else f"line-{number}"


@dataclass
class _Tenants:
    """The tenants a file's lines name: the first `SHOWN` with up to `SHOWN` of their line numbers."""

    lines: dict[str, list[int]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    more: int = 0  # lines of the tenants past the first SHOWN

    def add(self, tenant: str, number: int) -> None:
        if tenant in self.lines:
            self.counts[tenant] += 1
            if len(self.lines[tenant]) < SHOWN:
                self.lines[tenant].append(number)
        elif len(self.lines) < SHOWN:
            self.lines[tenant], self.counts[tenant] = [number], 1
        else:
            self.more += 1  # lines of further tenants (enough is known: the file is refused)

    def refusal(self, default: str) -> str | None:
        if len(self.lines) < 2:
            return None
        named = []
        for tenant, numbers in self.lines.items():
            rest = self.counts[tenant] - len(numbers)
            where = ", ".join(map(str, numbers)) + (f" and {rest} more" if rest else "")
            named.append(f"{tenant!r} (line{'s' if self.counts[tenant] > 1 else ''} {where})")
        more = f", and {self.more} line(s) of further tenants" if self.more else ""
        return (f"the batch's lines name several tenants: {'; '.join(named)}{more}. A batch is one tenant's "
                f"(its key may cancel or delete all of it): give each tenant its own file (lines without "
                f"`tenant` are --tenant's, here {default!r})")


def _first_pass(path: Path, default_tenant: str) -> tuple[set[int], _Tenants]:
    """Digests of ids that occur on more than one line, and the tenants the lines name."""
    values = array("Q")
    tenants = _Tenants()
    with path.open(encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if text.strip() and (value := _object(text)) is not None:
                values.append(digest(_line_id(number, value) or ""))
                named = value.get("tenant")
                if named is None or isinstance(named, str):
                    tenants.add(named or default_tenant, number)
    ordered = sorted(values)
    return {a for a, b in zip(ordered, ordered[1:], strict=False) if a == b}, tenants


def finished_ids(out_path: Path) -> IdSet:
    """Ids already written to the output file (a re-run skips them)."""

    def ids() -> Iterator[str]:
        if not out_path.exists():
            return
        with out_path.open(encoding="utf-8") as f:
            for text in f:
                try:
                    yield str(json.loads(text)["id"])
                except (ValueError, KeyError, TypeError):
                    continue

    return IdSet(ids())


def iter_input(path: Path, settings: Settings, tenant: str | None, tier: str | None,
               tenants: Tenants | None = None) -> Iterator[ParsedLine | LineError]:
    """Every good line as a spec; every bad one as an error naming its line number. An id used again
    is an error on every line after its first. With `tenants`, each line's tenant must exist and its plan
    allow the line's tier (default: the plan's default tier). The first pass runs now: a file whose lines
    name several tenants raises InvalidRequest here, before a line is read for submission."""
    duplicated, named = _first_pass(path, tenant or "default")
    if (refused := named.refusal(tenant or "default")) is not None:
        raise InvalidRequest(refused)
    context = _Context(settings, known_tiers(settings), tenant, tier, tenants)
    return _lines(path, context, duplicated)


def _lines(path: Path, context: _Context, duplicated: set[int]) -> Iterator[ParsedLine | LineError]:
    seen_duplicates: set[int] = set()
    with path.open(encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if text.strip():
                yield _parse(number, text, context, duplicated, seen_duplicates)


@dataclass
class _Context:
    """What every line is checked against: settings, the command's defaults, the tenants' policies."""

    settings: Settings
    tiers: list[str]
    tenant: str | None
    tier: str | None
    tenants: Tenants | None
    policies: dict[str, Policy] = field(default_factory=dict)

    def policy(self, name: str) -> Policy | None:
        """The policy of the tenant the line names (its `tenant` is the id the run is stored under)."""
        if self.tenants is None:
            return None
        if name not in self.policies:
            self.policies[name] = tenant_policy(self.tenants, self.tenants.resolve(name))
        return self.policies[name]


def _parse(number: int, text: str, c: _Context, duplicated: set[int], seen_duplicates: set[int]
           ) -> ParsedLine | LineError:
    client_id = _line_id(number, _object(text))
    if client_id is not None and (value := digest(client_id)) in duplicated:
        if value in seen_duplicates:
            return LineError(number, f"duplicate id {client_id!r}")
        seen_duplicates.add(value)
    try:
        line = BatchLine.model_validate_json(text)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        return LineError(number, f"{where + ': ' if where else ''}{problem['msg']}")
    owner = line.tenant or c.tenant or "default"
    try:
        policy = c.policy(owner)
        spec = RunSpec(question=line.question, tenant=owner if policy is None else policy.tenant,
                       tier=line.tier or c.tier or (policy.plan.default_tier if policy else None) or "standard",
                       max_steps=line.max_steps, model=line.model, max_tokens=line.max_tokens,
                       max_cost_usd=line.max_cost_usd, deadline_s=line.deadline_s,
                       client_id=line.id or f"line-{number}", webhook_url=line.webhook_url,
                       instructions=line.instructions, output_schema=line.output_schema,
                       python_session=line.python_session)
        validate_spec(spec, c.settings, c.tiers, policy=policy)
    except InvalidRequest as exc:
        return LineError(number, str(exc))
    if line.expected is None:
        if line.match is not None:
            return LineError(number, "`match` without `expected`")
        return ParsedLine(spec, None, line.category)
    mode = line.match or (MatchMode.FIELDS if isinstance(line.expected, dict) else MatchMode.CONTAINS)
    if isinstance(line.expected, dict) and line.output_schema is None:
        return LineError(number, "an object `expected` needs an `output_schema` (it is compared with the output)")
    if (unscorable := check_expected(line.expected, mode)) is not None:
        return LineError(number, unscorable)
    return ParsedLine(spec, (line.expected, mode), line.category)
