#!/bin/sh
# Start redis-server with the role users of acl.conf, their passwords taken from the environment
# (REDIS_API_PASSWORD, REDIS_STEP_WORKER_PASSWORD, REDIS_SANDBOX_WORKER_PASSWORD, REDIS_EXPORTER_PASSWORD,
# REDIS_KEDA_PASSWORD).
# Refuses to start while one is unset or not URL-safe. Usage: start.sh ACL_TEMPLATE [redis-server args...]
set -eu
template="$1"; shift
umask 077
acl=$(mktemp "${TMPDIR:-/tmp}/reactq-users.XXXXXX")
cp "$template" "$acl.tmp"
for name in REDIS_API_PASSWORD REDIS_STEP_WORKER_PASSWORD REDIS_SANDBOX_WORKER_PASSWORD REDIS_EXPORTER_PASSWORD \
            REDIS_KEDA_PASSWORD; do
    value=$(printenv "$name" || true)
    case "$value" in
        "") echo "start.sh: $name is not set" >&2; exit 2 ;;
        *[!A-Za-z0-9_-]*) echo "start.sh: $name must be URL-safe (letters, digits, '-', '_')" >&2; exit 2 ;;
    esac
    sed "s/\${$name}/$value/g" "$acl.tmp" > "$acl.new" && mv "$acl.new" "$acl.tmp"
done
grep -v '^#' "$acl.tmp" | grep -v '^$' > "$acl"
rm -f "$acl.tmp"
exec redis-server "$@" --aclfile "$acl"
