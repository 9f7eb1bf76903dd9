"""The warm pool's rule for a tenant whose containers are all out: wait for one of them, or take another.

Taking another costs a container build (the pool replaces a warm one it hands out), so a caller waits when
the first of its tenant's containers to come free is expected within a build, and only then.
"""

from __future__ import annotations

import pytest

from tools_sandbox.backends.pool import waits_for_own


@pytest.mark.parametrize(("hold_s", "held", "build_s"), [
    (0.005, 0, 0.3),   # a quiet machine: executions of a few ms
    (0.25, 2, 0.45),   # a saturated one: holds and builds both grow; the first of 2 is out ~0.08 s more
    (0.25, 0, 0.45),   # the others of the tenant are still getting theirs
    (0.9, 3, 0.3),     # ~0.22 s for the first of 3
])
def test_a_tenant_waits_for_its_own_when_one_comes_free_within_a_build(hold_s: float, held: int,
                                                                        build_s: float) -> None:
    assert waits_for_own(hold_s, held, build_s)


@pytest.mark.parametrize(("hold_s", "held", "build_s"), [
    (5.0, 1, 0.3),     # long programs: each concurrent execution gets its own container
    (0.6, 0, 0.45),
    (1.2, 3, 0.3),     # the first of 3 is out ~0.3 s more: as long as a build
    (30.0, 15, 0.5),
])
def test_a_tenant_takes_another_container_when_its_own_are_out_for_longer_than_a_build(
        hold_s: float, held: int, build_s: float) -> None:
    assert not waits_for_own(hold_s, held, build_s)
