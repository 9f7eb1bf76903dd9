#!/usr/bin/env bash
# Start a Docker engine for the sandbox tests and workers, idempotently.
#
# - installs docker.io from Debian (apt-get update first) when dockerd is missing;
# - registers gVisor's runsc (when installed) in /etc/docker/daemon.json, reloading a running engine;
# - does nothing else when an engine already answers (`docker info` or the socket);
# - otherwise starts dockerd in the background, trying the overlay2 storage driver
#   first and falling back to vfs (works on any filesystem, e.g. nested in CI);
# - waits until the engine answers and prints where its log is.
# Must run as root. Env: REACTQ_DOCKERD_LOG (default /var/log/reactq-dockerd.log),
# REACTQ_DOCKERD_WAIT seconds (default 60).
set -euo pipefail

LOG="${REACTQ_DOCKERD_LOG:-/var/log/reactq-dockerd.log}"
WAIT="${REACTQ_DOCKERD_WAIT:-60}"

engine_answers() {
    if command -v docker >/dev/null 2>&1; then
        docker info >/dev/null 2>&1 && return 0
    fi
    # No CLI: ask the socket directly.
    [ -S /var/run/docker.sock ] && command -v curl >/dev/null 2>&1 \
        && curl -fsS --unix-socket /var/run/docker.sock http://localhost/_ping >/dev/null 2>&1
}

# gVisor: register Debian's runsc with the engine (`--network=none`: runsc refuses to run with the
# network enabled in the root network namespace). A running engine rereads daemon.json on SIGHUP.
register_runsc() {
    command -v runsc >/dev/null 2>&1 || return 0
    [ "$(id -u)" = 0 ] || return 0
    mkdir -p /etc/docker
    python3 - "$(command -v runsc)" <<'PY'
import json, pathlib, sys
path = pathlib.Path("/etc/docker/daemon.json")
config = json.loads(path.read_text() or "{}") if path.exists() else {}
wanted = {"path": sys.argv[1], "runtimeArgs": ["--network=none"]}
if config.get("runtimes", {}).get("runsc") != wanted:
    config.setdefault("runtimes", {})["runsc"] = wanted
    path.write_text(json.dumps(config, indent=2) + "\n")
PY
}

register_runsc
if engine_answers; then
    if command -v runsc >/dev/null 2>&1 && ! docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q runsc \
            && [ -f /var/run/docker.pid ]; then
        kill -HUP "$(cat /var/run/docker.pid)" && sleep 1
        echo "registered runsc with the running engine"
    fi
    echo "docker engine already answers (log: ${LOG} if started by this script)"
    exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        echo "dockerd is missing and this is not root: install docker.io first" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends docker.io iptables tini
fi

if [ "$(id -u)" != 0 ]; then
    echo "starting dockerd needs root" >&2
    exit 1
fi

# dockerd needs a cgroup v1 or v2 hierarchy; on a bare CI container /sys/fs/cgroup may be unmounted.
if ! mountpoint -q /sys/fs/cgroup 2>/dev/null; then
    mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null || true
fi

start_dockerd() {
    local driver="$1"
    echo "starting dockerd with storage driver ${driver} (log: ${LOG})"
    # setsid + nohup: the engine outlives this shell and the CI step that ran it.
    setsid nohup dockerd --storage-driver="${driver}" --host=unix:///var/run/docker.sock \
        >>"${LOG}" 2>&1 </dev/null &
    local pid=$!
    local waited=0
    while [ "${waited}" -lt "${WAIT}" ]; do
        if engine_answers; then
            echo "docker engine answers (pid ${pid}, storage driver ${driver}, log: ${LOG})"
            return 0
        fi
        if ! kill -0 "${pid}" 2>/dev/null; then
            echo "dockerd (${driver}) exited; last log lines:" >&2
            tail -n 15 "${LOG}" >&2 || true
            return 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    echo "dockerd (${driver}) did not answer within ${WAIT}s; stopping it" >&2
    kill "${pid}" 2>/dev/null || true
    sleep 2
    return 1
}

# A stale pid file from a dead engine makes dockerd refuse to start.
if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
    rm -f /var/run/docker.pid
fi

for driver in ${REACTQ_DOCKER_STORAGE_DRIVER:-overlay2 vfs}; do
    if start_dockerd "${driver}"; then
        exit 0
    fi
done
echo "could not start dockerd; see ${LOG}" >&2
exit 1
