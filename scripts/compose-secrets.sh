#!/usr/bin/env bash
# Write .env for docker compose: a random password for each Redis role and for Grafana's admin.
# Keeps an existing .env and its passwords, adding only those it lacks (remove it to rotate, then
# `docker compose up -d` again).
# Usage: scripts/compose-secrets.sh [FILE]   (default: .env at the repository's root; the compose
# test writes its own file this way)
set -euo pipefail
out=${1:-}
if [ -n "$out" ]; then
    out=$(realpath -m -- "$out")
fi
cd "$(dirname "$0")/.."
out=${out:-.env}
umask 077
fresh=0
[ -e "$out" ] || { fresh=1; : > "$out"; }
added=()
for name in REDIS_API_PASSWORD REDIS_STEP_WORKER_PASSWORD REDIS_SANDBOX_WORKER_PASSWORD \
            REDIS_EXPORTER_PASSWORD REDIS_KEDA_PASSWORD REDIS_REPLICA_PASSWORD REDIS_SENTINEL_PASSWORD \
            REDIS_CLUSTER_ADMIN_PASSWORD GRAFANA_ADMIN_PASSWORD; do
    grep -q "^$name=" "$out" && continue
    echo "$name=$(python3 -c 'import secrets; print(secrets.token_hex(24))')" >> "$out"
    added+=("$name")
done
if [ "$fresh" = 1 ]; then
    echo "# REACTQ_PUBLISH_ADDR=0.0.0.0   # publish the API beyond this host (put TLS in front of it)" >> "$out"
    echo "wrote $out (Grafana's admin password: grep GRAFANA_ADMIN_PASSWORD $out)"
elif [ ${#added[@]} -gt 0 ]; then
    echo "$out exists; added ${added[*]}" >&2
else
    echo "$out exists; keeping it" >&2
fi
