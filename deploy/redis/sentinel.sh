#!/bin/sh
# Start a Redis Sentinel watching the broker's primary, logged in to it (and to its replicas) as the
# `sentinel` ACL user of acl.conf, whose password is REDIS_SENTINEL_PASSWORD. Sentinel rewrites its own
# config file, so it is written fresh into a writable directory (SENTINEL_DIR, default /data) at each start:
# the primary it follows after a failover is learned again from the other sentinels and the replicas.
# Clients (kombu, redis-py) reach sentinels without a password: keep port 26379 to the app's pods
# (docs/decisions/redis-cluster-deploy.md).
# Usage: sentinel.sh MASTER_NAME PRIMARY_HOST PRIMARY_PORT QUORUM [redis-server args...]
set -eu
name="$1"; host="$2"; port="$3"; quorum="$4"; shift 4
case "${REDIS_SENTINEL_PASSWORD:-}" in
    "") echo "sentinel.sh: REDIS_SENTINEL_PASSWORD is not set" >&2; exit 2 ;;
    *[!A-Za-z0-9_-]*) echo "sentinel.sh: REDIS_SENTINEL_PASSWORD must be URL-safe" >&2; exit 2 ;;
esac
umask 077
conf="${SENTINEL_DIR:-/data}/sentinel.conf"
cat > "$conf" <<CONF
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel monitor $name $host $port $quorum
sentinel auth-user $name sentinel
sentinel auth-pass $name $REDIS_SENTINEL_PASSWORD
sentinel down-after-milliseconds $name ${SENTINEL_DOWN_AFTER_MS:-5000}
sentinel failover-timeout $name ${SENTINEL_FAILOVER_TIMEOUT_MS:-60000}
sentinel parallel-syncs $name 1
CONF
exec redis-server "$conf" --sentinel "$@"
