"""The shipped Redis users (deploy/redis/acl.conf), on a real redis-server started by deploy/redis/start.sh:
no user but the app's own (api, step-worker, sandbox-worker) may run a script or a blocking command, and
no user at all may run DEBUG, KEYS, FLUSHALL, CONFIG SET, MONITOR, SHUTDOWN and the like.

A script runs to its end with every other client waiting: `while true do redis.call('PING') end` answered
BUSY to everyone until an admin ran SCRIPT KILL. Every command of the server's own table is tried as each
non-app user, with arguments enough to pass the arity check (Redis checks the ACL right after it).

The users only a Redis Cluster or a Sentinel-managed Redis has (`replica`, `sentinel`, `cluster-admin`:
docs/decisions/redis-cluster-deploy.md) read no key and run only the commands their job needs: replication,
Sentinel's monitoring and failover, and building the cluster."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fixtures_cluster import ROOT
from tests.fixtures_services import start_on_free_port

ACL = ROOT / "deploy" / "redis"
APP_USERS = {"api", "step-worker", "sandbox-worker"}
READERS = {"exporter", "keda"}
# What each infrastructure user is granted, exactly: Redis's own documented sets for a replica and a
# Sentinel, and the CLUSTER command for `redis-cli --cluster create` (tests/test_redis_cluster_deploy.py).
INFRA_GRANTS = {
    "replica": {"psync", "replconf", "ping"},
    "sentinel": {"multi", "exec", "slaveof", "ping", "subscribe", "publish", "config|rewrite", "role", "info",
                 "client|setname", "client|kill", "script|kill"},
    "cluster-admin": {"cluster", "info", "ping"},
}
# What may run no user at all: it blocks or scans the whole server, or changes it.
NOBODY = [("DEBUG", ("SLEEP", "0")), ("KEYS", ("*",)), ("FLUSHALL", ()), ("FLUSHDB", ()),
          ("CONFIG", ("SET", "maxmemory", "0")), ("MONITOR", ()), ("SHUTDOWN", ("NOSAVE",)), ("SAVE", ()),
          ("BGSAVE", ()), ("ACL", ("LIST",)),
          ("CLIENT", ("KILL", "ID", "1")), ("SCRIPT", ("KILL",)), ("SLAVEOF", ("127.0.0.1", "1")),
          ("MIGRATE", ("127.0.0.1", "1", "k", "0", "1"))]
FREEZE = "while true do redis.call('PING') end"


def shipped_users() -> list[str]:
    return re.findall(r"^user (\S+) on ", (ACL / "acl.conf").read_text(), re.M)


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, dict[str, str]]]:
    """redis-server started by deploy/redis/start.sh with acl.conf: (port, user -> password)."""
    variables = sorted(set(re.findall(r"\$\{(REDIS_[A-Z_]+_PASSWORD)\}", (ACL / "acl.conf").read_text())))
    passwords = {v: f"pw-{v.lower()}" for v in variables}
    workdir: Path = tmp_path_factory.mktemp("acl")
    port, proc = start_on_free_port(lambda port: subprocess.Popen(
        ["sh", str(ACL / "start.sh"), str(ACL / "acl.conf"), "--port", str(port), "--bind", "127.0.0.1", "--dir",
         str(workdir), "--save", ""], env={**os.environ, **passwords}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL))
    try:
        yield port, {v.removeprefix("REDIS_").removesuffix("_PASSWORD").lower().replace("_", "-"): pw
                     for v, pw in passwords.items()}
    finally:
        proc.kill()  # a server frozen by a script would not stop on SIGTERM
        proc.wait(10)


def let_through(server: tuple[int, dict[str, str]], user: str, allowed: set[str]) -> list[str]:
    """The commands of the server's own table, other than `allowed` and connection commands, that `user`
    may run: each called with arguments enough to pass the arity check (the ACL is checked right after)."""
    table = login(server, "api").command()  # the server's own command table: name -> arity, flags ...
    assert {"eval", "evalsha", "script", "blpop", "debug", "keys"} <= set(table)
    client = login(server, user)
    through = []
    for name, info in table.items():
        if name in allowed or name in {"auth", "hello", "quit", "reset"}:  # connection commands: always allowed
            continue
        args = ["reactq.none"] * (abs(int(info["arity"])) - 1)
        if not refused(client, name, *args):
            through.append(name)
    return through


def login(server: tuple[int, dict[str, str]], user: str) -> redis.Redis:
    port, passwords = server
    # a short socket timeout: a blocking command let through fails the test instead of hanging it
    return redis.Redis(port=port, username=user, password=passwords[user], socket_timeout=5)


def refused(client: redis.Redis, command: str, *args: Any) -> bool:
    try:
        client.execute_command(command, *args)
    except redis.exceptions.NoPermissionError:
        return True
    except redis.exceptions.ResponseError as exc:
        return "NOPERM" in str(exc)
    return False


def granted(user: str) -> set[str]:
    """The commands and subcommands a non-app user is granted by name in acl.conf (`+cmd`, `+cmd|sub`)."""
    [line] = [x for x in (ACL / "acl.conf").read_text().splitlines() if x.startswith(f"user {user} on ")]
    assert "+@" not in line and "allcommands" not in line, line  # no category: each grant by name
    return {token[1:].lower() for token in line.split() if token.startswith("+")}


def test_every_shipped_user_is_checked_here() -> None:
    assert set(shipped_users()) == APP_USERS | READERS | set(INFRA_GRANTS)


@pytest.mark.integration
@pytest.mark.parametrize("user", sorted(READERS))
def test_a_non_app_user_runs_no_script_and_no_blocking_command(acl_server: tuple[int, dict[str, str]],
                                                                user: str) -> None:
    admin = login(acl_server, "api")
    admin.delete("reactq.steps")
    admin.rpush("reactq.steps", "m")
    client = login(acl_server, user)
    assert client.ping()
    for command, args in [("EVAL", (FREEZE, 0)), ("EVAL", ("return 1", 0)), ("EVALSHA", ("0" * 40, 0)),
                          ("SCRIPT", ("LOAD", "return 1")), ("SCRIPT", ("EXISTS", "0" * 40)),
                          ("BLPOP", ("reactq.steps", 1)), ("BRPOP", ("reactq.steps", 1)),
                          ("BRPOPLPUSH", ("reactq.steps", "reactq.steps", 1)), ("WAIT", (0, 1)),
                          ("XREAD", ("BLOCK", 1, "STREAMS", "reactq.steps", "$")), ("SUBSCRIBE", ("reactq",)),
                          ("MULTI", ()), *NOBODY]:
        assert refused(client, command, *args), (user, command, args)
    assert admin.llen("reactq.steps") == 1 and admin.ping()  # nothing froze or went


@pytest.mark.integration
@pytest.mark.parametrize("user", sorted(READERS))
def test_a_non_app_user_may_run_nothing_of_the_servers_command_table_but_its_grants(
    acl_server: tuple[int, dict[str, str]], user: str
) -> None:
    """Every command the server knows is refused unless acl.conf grants it by name, and no grant is a
    script, a blocking command, or one that scans or changes the whole server."""
    grants = granted(user)
    whole = {g.split("|")[0] for g in grants}
    # bounded reads: a reply, a number, server statistics; subcommands only of what else would change things
    assert whole <= {"ping", "llen", "info", "select", "dbsize", "client", "config", "slowlog", "latency",
                     "cluster"}, grants
    assert {g for g in grants if g in {"client", "config", "slowlog", "latency", "cluster"}} == set(), grants
    assert {g for g in grants if "|" in g} <= {"client|list", "client|setname", "config|get", "slowlog|get",
                                                "slowlog|len", "latency|latest", "cluster|info"}, grants
    assert let_through(acl_server, user, whole) == [], user


@pytest.mark.integration
@pytest.mark.parametrize("user", sorted(APP_USERS))
def test_the_apps_own_users_run_scripts_but_nothing_that_scans_or_changes_the_server(
    acl_server: tuple[int, dict[str, str]], user: str
) -> None:
    client = login(acl_server, user)
    assert client.eval("return 1", 0) == 1  # the app's own scripts (worker/store/*.lua)
    assert client.info("server")["redis_version"]
    for command, args in NOBODY:
        if (command, args) == ("SCRIPT", ("KILL",)):
            continue  # the app may stop its own script
        assert refused(client, command, *args), (user, command, args)


@pytest.mark.integration
@pytest.mark.parametrize("user", sorted(INFRA_GRANTS))
def test_an_infrastructure_user_reads_no_key_and_runs_only_its_grants(acl_server: tuple[int, dict[str, str]],
                                                                       user: str) -> None:
    """`replica`, `sentinel` and `cluster-admin` are granted by name what replication, Sentinel and
    `redis-cli --cluster create` run, with no key pattern: a leaked password of one reads no run."""
    [line] = [x for x in (ACL / "acl.conf").read_text().splitlines() if x.startswith(f"user {user} on ")]
    assert " ~" not in line and "allkeys" not in line and " &*" not in line, line
    assert granted(user) == INFRA_GRANTS[user]
    login(acl_server, "api").set("reactq:run:acl-test", "secret")
    client = login(acl_server, user)
    for command, args in [("GET", ("reactq:run:acl-test",)), ("SET", ("reactq:run:acl-test", "x")),
                          ("EVAL", ("return 1", 0)), ("BLPOP", ("reactq.steps", 1))]:
        assert refused(client, command, *args), (user, command)
    whole = {g.split("|")[0] for g in INFRA_GRANTS[user]}
    # a subcommand grant (client|kill, config|rewrite, script|kill) lets only that subcommand through
    assert let_through(acl_server, user, whole) == [], user
    for command, args in NOBODY:
        sub = f"{command}|{args[0] if args else ''}".lower()
        if command.lower() in INFRA_GRANTS[user] or sub in INFRA_GRANTS[user]:
            continue  # SLAVEOF, CLIENT KILL, SCRIPT KILL: what Sentinel is there for
        assert refused(client, command, *args), (user, command, args)


@pytest.mark.integration
@pytest.mark.parametrize("user", sorted(APP_USERS))
def test_the_apps_own_users_may_read_the_cluster_slots_redis_py_asks_for(acl_server: tuple[int, dict[str, str]],
                                                                          user: str) -> None:
    """RedisCluster (redis-py) reads CLUSTER SLOTS on connect: the app's users may (granted by name: Redis 6.2
    files CLUSTER under @admin), and no other CLUSTER subcommand (tests/test_redis_cluster_deploy.py runs
    them against a real cluster)."""
    client = login(acl_server, user)
    with pytest.raises(redis.exceptions.ResponseError) as not_a_cluster:
        client.execute_command("CLUSTER", "SLOTS")
    assert "NOPERM" not in str(not_a_cluster.value)  # "cluster support disabled": past the ACL
    for args in (("RESET",), ("FAILOVER",), ("FORGET", "x"), ("MEET", "127.0.0.1", "1"), ("ADDSLOTS", "1")):
        assert refused(client, "CLUSTER", *args), (user, args)
