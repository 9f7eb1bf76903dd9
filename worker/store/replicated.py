"""On a Redis Cluster, writes that must outlive their primary: sent to the primary serving their slot and
followed, on the same connection, by WAIT for a replica's acknowledgement.

Redis replicates asynchronously: a primary SIGKILLed a moment after a write loses it if its replica had not
received it, and the replica it fails over to never had it. A run's record and its steps are written once
and read back by the next step (whose message went out after the write), so a lost write is a run gone or
a step done twice. WAIT counts only the writes of its own connection, so the writes and the WAIT go down one
connection to the node (a pipeline on the node's own client), not through the cluster client's pool.
A replica that does not answer within WAIT_MS leaves the write unconfirmed but made (availability over
durability: docs/decisions/redis-cluster.md). A redirect or a broken connection (a failover under way)
falls back to the cluster client, which follows the cluster's new layout, without the WAIT.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script

from . import cas
from .cas import Command

log = logging.getLogger("reactq.store")

WAIT_MS = 1000
_REROUTE = (redis.exceptions.MovedError, redis.exceptions.AskError, redis.exceptions.TryAgainError,
            redis.exceptions.ClusterDownError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def _node_client(cluster: RedisCluster, key: str) -> redis.Redis:
    return cluster.get_redis_connection(cluster.get_node_from_key(key))


def _waited(client: redis.Redis, commands: list[Command], replicas: int) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    if replicas == 0:
        return list(pipe.execute())
    pipe.execute_command("WAIT", replicas, WAIT_MS)
    *replies, acked = pipe.execute()
    if int(acked) < replicas:
        log.warning("a write was not acknowledged by its replicas in time", extra={"replicas": int(acked)})
    return replies


def run_script(cluster: RedisCluster, script: Script, script_keys: list[str], args: list[Any], replicas: int) -> Any:
    """`script` on the primary of its first key's slot, then WAIT for `replicas`; its reply."""
    command = ("EVALSHA", script.sha, len(script_keys), *script_keys, *args)
    try:
        client = _node_client(cluster, script_keys[0])
        try:
            return _waited(client, [command], replicas)[0]
        except redis.exceptions.NoScriptError:  # a node that never ran it (a replica promoted since)
            client.script_load(script.script)
            return _waited(client, [command], replicas)[0]
    except _REROUTE:
        log.info("a cluster node moved or failed during a write; going through the cluster client")
        return script(keys=script_keys, args=args)


def run_commands(cluster: RedisCluster, commands: list[Command], replicas: int) -> list[Any]:
    """Commands (each on its first argument's key) grouped by the primary serving them, each group followed
    by WAIT for `replicas`; their replies in order."""
    by_node: dict[str, list[int]] = {}
    for i, command in enumerate(commands):
        by_node.setdefault(cluster.get_node_from_key(command[1]).name, []).append(i)
    replies: list[Any] = [None] * len(commands)
    for indexes in by_node.values():
        group = [commands[i] for i in indexes]
        try:
            got = _waited(_node_client(cluster, str(group[0][1])), group, replicas)
        except _REROUTE:
            log.info("a cluster node moved or failed during a write; going through the cluster client")
            got = cas.run_commands(cluster, group)  # type: ignore[arg-type]
        for i, reply in zip(indexes, got, strict=True):
            replies[i] = reply
    return replies
