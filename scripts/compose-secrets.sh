#!/usr/bin/env bash
# Write .env for docker compose: a random password for each Redis role and for Grafana's admin.
# Keeps an existing .env (remove it to rotate, then `docker compose up -d` again).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -e .env ]; then
    echo ".env exists; keeping it" >&2
    exit 0
fi
umask 077
{
    for name in REDIS_API_PASSWORD REDIS_STEP_WORKER_PASSWORD REDIS_SANDBOX_WORKER_PASSWORD \
                REDIS_EXPORTER_PASSWORD GRAFANA_ADMIN_PASSWORD; do
        echo "$name=$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
    done
    echo "# REACTQ_PUBLISH_ADDR=0.0.0.0   # publish the API beyond this host (put TLS in front of it)"
} > .env
echo "wrote .env (Grafana's admin password: grep GRAFANA_ADMIN_PASSWORD .env)"
