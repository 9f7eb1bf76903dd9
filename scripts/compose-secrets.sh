#!/usr/bin/env bash
# Write .env for docker compose: a random password for each Redis role and for Grafana's admin.
# Keeps an existing .env (remove it to rotate, then `docker compose up -d` again).
# Usage: scripts/compose-secrets.sh [FILE]   (default: .env at the repository's root; the compose
# test writes its own file this way)
set -euo pipefail
out=${1:-}
if [ -n "$out" ]; then
    out=$(realpath -m -- "$out")
fi
cd "$(dirname "$0")/.."
out=${out:-.env}
if [ -e "$out" ]; then
    echo "$out exists; keeping it" >&2
    exit 0
fi
umask 077
{
    for name in REDIS_API_PASSWORD REDIS_STEP_WORKER_PASSWORD REDIS_SANDBOX_WORKER_PASSWORD \
                REDIS_EXPORTER_PASSWORD GRAFANA_ADMIN_PASSWORD; do
        echo "$name=$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
    done
    echo "# REACTQ_PUBLISH_ADDR=0.0.0.0   # publish the API beyond this host (put TLS in front of it)"
} > "$out"
echo "wrote $out (Grafana's admin password: grep GRAFANA_ADMIN_PASSWORD $out)"
