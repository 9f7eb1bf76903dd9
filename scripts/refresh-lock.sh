#!/usr/bin/env bash
# Move the lock (deploy/constraints.txt) forward: install reactq[test] at the newest versions pyproject.toml's
# ranges admit, in a new virtual environment, run the whole suite there (scripts/test.sh), and write the lock
# only if it passed. Prints what changed. Run it as root on a machine like CI's (the suite needs its services).
#
# Usage: bash scripts/refresh-lock.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

venv=$(mktemp -d /tmp/reactq-refresh.XXXXXX)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[test]"   # no lock: the newest in range
"$venv/bin/python" scripts/freeze_constraints.py --out "$venv/candidate.txt"

if PATH="$venv/bin:$PATH" REACTQ_CONSTRAINTS="$venv/candidate.txt" bash scripts/test.sh "$@"; then
    diff -u deploy/constraints.txt "$venv/candidate.txt" || true
    cp "$venv/candidate.txt" deploy/constraints.txt
    echo "the suite passed: deploy/constraints.txt now holds these versions (commit it)"
else
    echo "the suite failed with the newest versions: deploy/constraints.txt is unchanged" >&2
    diff -u deploy/constraints.txt "$venv/candidate.txt" >&2 || true
    exit 1
fi
