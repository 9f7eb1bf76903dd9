#!/bin/sh
# Start redis-server with the role users of acl.conf, their passwords taken from the environment
# (REDIS_API_PASSWORD, REDIS_STEP_WORKER_PASSWORD, REDIS_SANDBOX_WORKER_PASSWORD, REDIS_EXPORTER_PASSWORD,
# REDIS_KEDA_PASSWORD). Refuses to start while one is unset or not URL-safe.
# The users only a Redis Cluster or a Sentinel-managed Redis needs (REDIS_REPLICA_PASSWORD,
# REDIS_SENTINEL_PASSWORD, REDIS_CLUSTER_ADMIN_PASSWORD) exist only when their password is set: a single
# Redis has no `replica`, `sentinel` or `cluster-admin` user (docs/decisions/redis-cluster-deploy.md).
# Usage: start.sh ACL_TEMPLATE [redis-server args...]
set -eu
template="$1"; shift
umask 077
acl=$(mktemp "${TMPDIR:-/tmp}/reactq-users.XXXXXX")
cp "$template" "$acl.tmp"
for name in REDIS_API_PASSWORD REDIS_STEP_WORKER_PASSWORD REDIS_SANDBOX_WORKER_PASSWORD REDIS_EXPORTER_PASSWORD \
            REDIS_KEDA_PASSWORD REDIS_REPLICA_PASSWORD REDIS_SENTINEL_PASSWORD REDIS_CLUSTER_ADMIN_PASSWORD; do
    value=$(printenv "$name" || true)
    case "$name:$value" in
        REDIS_REPLICA_PASSWORD:|REDIS_SENTINEL_PASSWORD:|REDIS_CLUSTER_ADMIN_PASSWORD:)
            grep -v "\${$name}" "$acl.tmp" > "$acl.new" && mv "$acl.new" "$acl.tmp"; continue ;;
        *:) echo "start.sh: $name is not set" >&2; exit 2 ;;
        *:*[!A-Za-z0-9_-]*) echo "start.sh: $name must be URL-safe (letters, digits, '-', '_')" >&2; exit 2 ;;
    esac
    sed "s/\${$name}/$value/g" "$acl.tmp" > "$acl.new" && mv "$acl.new" "$acl.tmp"
done
grep -v '^#' "$acl.tmp" | grep -v '^$' > "$acl"
rm -f "$acl.tmp"
# A server with a `replica` user replicates as that user whenever it is (or becomes) a replica: a cluster
# node, a Sentinel-managed broker. The password stays out of the compose file and the pod spec.
if [ -n "${REDIS_REPLICA_PASSWORD:-}" ]; then
    exec redis-server "$@" --aclfile "$acl" --masteruser replica --masterauth "$REDIS_REPLICA_PASSWORD"
fi
exec redis-server "$@" --aclfile "$acl"
