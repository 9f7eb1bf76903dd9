"""Write deploy/constraints.txt, reactq's lock: `name==version` for every package of the dependency closure of
reactq and its `test` extra, as installed in this Python (run it where the suite passed). scripts/test.sh and
the images install with `-c` that file, so they get the versions the suite ran with; tests/test_packaging.py
checks each pin satisfies pyproject.toml. scripts/refresh-lock.sh runs this in a fresh environment after the
suite passed there.

Usage: python3 scripts/freeze_constraints.py [--out deploy/constraints.txt]
"""

from __future__ import annotations

import argparse
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
# Like `pip freeze`: the installer's own tools stay unpinned (a pin would reach pip's build environment too).
UNPINNED = {"pip", "setuptools", "wheel"}
HEADER = ("# The versions reactq's test suite passed with: the dependency closure of reactq[test], frozen by\n"
          "# scripts/freeze_constraints.py. Refresh with scripts/refresh-lock.sh (it writes this file only if the\n"
          "# suite passes with the newest versions pyproject.toml admits).\n")


def closure(requirements: list[str]) -> dict[str, str]:
    """Installed name -> version for these requirements and, recursively, theirs (markers and extras honoured)."""
    pinned: dict[str, str] = {}
    todo = [(Requirement(r), "") for r in requirements]
    seen: set[tuple[str, str]] = set()
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        for wanted in ["", *sorted(req.extras)]:
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            dist = metadata.distribution(req.name)
            pinned[name] = dist.version
            todo += [(Requirement(r), wanted) for r in dist.requires or []]
    return pinned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "deploy" / "constraints.txt")
    args = parser.parse_args()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["test"]
    pins = {name: version for name, version in closure(deps).items() if name not in UNPINNED}
    args.out.write_text(HEADER + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins)))
    print(f"{len(pins)} pins -> {args.out}")


if __name__ == "__main__":
    main()
