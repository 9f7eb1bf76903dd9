"""The production backend: locked-down Docker containers, each serving one tenant on one tier.

Each sandbox is a container running the supervisor (see inside/_agent.py) under tini, with every
hardening applied whatever the tier: no network, read-only root, a capped tmpfs at /tmp as
the only writable place, all capabilities dropped but the supervisor's SETUID, SETGID and
KILL, no-new-privileges, pids/memory(+no swap)/CPU limits, fsize/nofile ulimits, no
/dev/shm, no logging driver (an output flood must not fill the host's disk), an explicit
minimal environment and no mounts at all. The code itself runs as an unprivileged uid of its
tenant's own (base/exec_uids.py) with no capabilities. A container may serve many executions of
one tenant (the pool binds it at its first use), each from a clean state the supervisor vouches
for, and never two tenants.

The host keeps its authority over every execution: the wall-clock deadline is enforced here
by killing the container; CPU time, peak memory and OOM kills come from the container's
cgroup, as the delta over the execution (executions in one container are serial); the exit
record is read from the supervisor, never from the code. Any anomaly — a timeout, an OOM
kill, a protocol violation, a cleanup the supervisor could not finish or did not report in
time, an engine that cannot be measured — retires the container: it is killed synchronously
(the kill has completed before the result is returned) and queued for removal; a removal
that fails is retried, and anything still left is the sweeper's (base/sweeper.py). A tier whose
OCI runtime the engine lacks is unavailable: it never runs on runc instead. A tier that only
prefers a runtime (`prefer_runtime`, e.g. gVisor for the untrusted tiers) gets it where the
engine has it, and runc elsewhere.
"""

from __future__ import annotations

import logging
import queue
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from types import ModuleType
from typing import TYPE_CHECKING

from ..base.errors import SandboxUnavailable, TierUnavailable
from ..base.exec_uids import exec_uid
from ..base.models import ReapReason, SandboxResult, Tier
from ..base.protocol import FrameParser, agent_source, encode_request
from ..base.sweeper import SweepPolicy
from .cgroup import CgroupMeter, Usage
from .frames import Demux, anomaly, lost, unsettled
from .outcome import HostFacts, finish
from .owners import owner_alive, owner_id

if TYPE_CHECKING:
    import docker


def _sdk() -> ModuleType:
    """The docker SDK, imported on first use: it brings requests and urllib3 (~80 ms of imports) that
    the CLI's other verbs and the step workers never use."""
    import docker
    import docker.errors
    import docker.types

    return docker

log = logging.getLogger(__name__)

LABEL = "reactq.sandbox"
LABEL_TIER = "reactq.sandbox.tier"
LABEL_OWNER = "reactq.sandbox.owner"
LABEL_HOST = "reactq.sandbox.host"
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}
# The supervisor is the container's root with only what it needs to start each execution as another
# uid and to end every process of that uid; the code gets none of it (see inside/_agent.py).
SUPERVISOR_USER = "0:0"
SUPERVISOR_CAPS = ["SETUID", "SETGID", "KILL"]
# How long the supervisor may take to clean up after the program before the container is retired.
CLEANUP_TIMEOUT_S = 3.0
_REMOVE_ATTEMPTS = 4


@dataclass
class DockerSandbox:
    """A started container with the supervisor waiting on its attached stdin."""

    container_id: str
    tier: Tier
    sock: object
    raw: socket.socket
    meter: CgroupMeter | None = None
    hostname: str = ""
    created_at: float = field(default_factory=time.monotonic)
    tenant: str | None = None  # bound at its first execution, never changed
    executions: int = 0
    last_used: float = field(default_factory=time.monotonic)
    taken_at: float = 0.0  # when the pool last handed it to a caller
    # The cgroup's CPU seconds at the last exit record: the next execution is charged from there, the
    # cleanup after the last one (read after its call returned) included.
    cpu_at_exit: float | None = None


@dataclass(frozen=True)
class Executed:
    """One execution's result, and why its container was retired (None: it may serve the tenant again)."""

    result: SandboxResult
    retired_because: str | None = None

    @property
    def reusable(self) -> bool:
        return self.retired_because is None


def _stats_usage(stats: dict) -> Usage | None:
    """CPU and peak memory from the engine's stats API (remote engines, where no cgroup is visible)."""
    try:
        cpu = int(stats["cpu_stats"]["cpu_usage"]["total_usage"]) / 1e9
    except (KeyError, TypeError, ValueError):
        return None
    memory = stats.get("memory_stats") or {}
    peak = memory.get("max_usage")
    return Usage(cpu, int(peak) if isinstance(peak, int) else None, 0)


def _skip_environment_lookups(api: docker.APIClient) -> None:
    """An engine on a local socket (a unix socket, a named pipe, ssh) is reached without HTTP proxies, netrc or
    a CA bundle, yet requests looks all of them up in the environment for every request when its session
    trusts it: ~1.5 ms of the ~9 ms of CPU a container's start costs this process (BENCHMARKS.md, eleventh
    session). An engine over tcp:// keeps them (it may sit behind a proxy)."""
    if str(api.base_url).startswith("http+docker://"):
        api.trust_env = False


class DockerBackend:
    """Creates, runs and destroys sandbox containers on one Docker engine."""

    name = "docker"

    def __init__(self, image: str = "reactq-sandbox:latest", *, base_url: str | None = None) -> None:
        self.image = image
        self.base_url = base_url
        self._client: docker.DockerClient | None = None
        self._runtimes: set[str] = set()
        self._removals: queue.Queue[str | None] = queue.Queue()
        self._remover: threading.Thread | None = None
        self._lock = threading.Lock()
        self._executing: dict[str, float] = {}  # container id -> wall-clock start of its execution
        self.owner = ""

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        """Connect to the engine and check the image; SandboxUnavailable if either fails."""
        try:
            if self.base_url:
                self._client = _sdk().DockerClient(base_url=self.base_url, timeout=30)
            else:
                self._client = _sdk().from_env(timeout=30)
            _skip_environment_lookups(self._client.api)
            self._client.ping()
            self._runtimes = set((self._client.info().get("Runtimes") or {}).keys())
            self._client.images.get(self.image)
        except _sdk().errors.ImageNotFound as exc:
            raise SandboxUnavailable(
                f"sandbox image {self.image} is missing; run `reactq sandbox build-image`"
            ) from exc
        except (_sdk().errors.DockerException, OSError) as exc:
            raise SandboxUnavailable(f"no Docker engine answers: {exc}") from exc
        self.owner = owner_id()
        self._remover = threading.Thread(target=self._remove_loop, name="sandbox-remover", daemon=True)
        self._remover.start()

    def close(self) -> None:
        """Finish pending removals, then drop the connection."""
        if self._remover is not None:
            self._removals.put(None)
            self._remover.join(timeout=60)
            self._remover = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def ping(self) -> None:
        """SandboxUnavailable unless the engine answers."""
        try:
            self.api.ping()
        except (_sdk().errors.DockerException, OSError) as exc:
            raise SandboxUnavailable(f"the Docker engine does not answer ({exc.__class__.__name__})") from exc

    @property
    def api(self) -> docker.APIClient:
        if self._client is None:
            raise SandboxUnavailable("the docker backend is not started")
        return self._client.api

    # -- one container -------------------------------------------------------------
    def check_runtime(self, tier: Tier) -> None:
        """Fail closed: a tier that asks for a runtime this engine lacks is unavailable."""
        if tier.runtime is not None and tier.runtime not in self._runtimes:
            have = ", ".join(sorted(self._runtimes)) or "none"
            raise TierUnavailable(tier.name, f"it requires the OCI runtime {tier.runtime!r}, which this Docker "
                                  f"engine does not have (it has: {have}); the tier is refused rather than run "
                                  "with weaker isolation")

    def runtime_of(self, tier: Tier) -> str | None:
        """The OCI runtime a tier's containers get: the one it requires, else the one it prefers when this
        engine has it, else the engine's default (runc)."""
        if tier.runtime is not None:
            return tier.runtime
        return tier.prefer_runtime if tier.prefer_runtime in self._runtimes else None

    def host_config(self, tier: Tier) -> dict:
        self.check_runtime(tier)
        runtime = self.runtime_of(tier)
        sdk = _sdk()
        mem = f"{tier.memory_mb}m"
        tmpfs_bytes = tier.tmpfs_mb * 1024 * 1024
        config: dict = self.api.create_host_config(
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,noexec,size={tier.tmpfs_mb}m,mode=1777"},
            cap_drop=["ALL"],
            cap_add=SUPERVISOR_CAPS,
            security_opt=["no-new-privileges"],
            # gVisor's sentry serves every process of the sandbox from its own threads: a pids cgroup
            # limit stops the sandbox from starting at all (runsc 20221219), so there RLIMIT_NPROC,
            # set by the supervisor for the execution uid, bounds the processes instead.
            pids_limit=None if runtime == "runsc" else tier.pids,
            mem_limit=mem,
            memswap_limit=mem,
            nano_cpus=int(tier.cpus * 1e9),
            ulimits=[
                sdk.types.Ulimit(name="fsize", soft=tmpfs_bytes, hard=tmpfs_bytes),
                sdk.types.Ulimit(name="nofile", soft=tier.nofile, hard=tier.nofile),
                sdk.types.Ulimit(name="core", soft=0, hard=0),
            ],
            ipc_mode="none",
            log_config=sdk.types.LogConfig(type="none"),
            runtime=runtime,
        )
        return config

    def create_sandbox(self, tier: Tier) -> DockerSandbox:
        """Create, attach and start one container; SandboxUnavailable on engine errors or a missing runtime."""
        host_config = self.host_config(tier)
        cid = None
        # A name of its own, so a program (and a test) can tell which container served it.
        hostname = f"sandbox-{secrets.token_hex(6)}"
        try:
            created = self.api.create_container(
                self.image,
                # tini from the image as PID 1 reaps orphans and forwards signals. Not init=True:
                # that bind-mounts the host's docker-init binary, and no host path enters a sandbox.
                entrypoint=["/usr/bin/tini", "--"],
                command=["python3", "-c", agent_source()],
                user=SUPERVISOR_USER,
                environment=SANDBOX_ENV,
                working_dir="/tmp",
                hostname=hostname,
                network_disabled=True,
                stdin_open=True,
                tty=False,
                labels={LABEL: "1", LABEL_TIER: tier.name, LABEL_OWNER: self.owner,
                        LABEL_HOST: socket.gethostname()},
                host_config=host_config,
            )
            cid = created["Id"]
            sock = self.api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            raw = getattr(sock, "_sock", sock)
            self.api.start(cid)
            pid = int(self.api.inspect_container(cid)["State"].get("Pid") or 0)
        except (_sdk().errors.DockerException, OSError) as exc:
            if cid is not None:
                self.destroy_id(cid)
            raise SandboxUnavailable(f"cannot start a sandbox container: {exc}") from exc
        return DockerSandbox(container_id=cid, tier=tier, sock=sock, raw=raw, meter=CgroupMeter.open(pid, cid),
                             hostname=hostname)

    def run(self, sandbox: DockerSandbox, code: str, *, tenant: str = "",
            started: float | None = None) -> Executed:
        """Send `code` to the sandbox's supervisor and collect the result, its cleanup included. The
        container stays up only when it may serve again (measured, clean, nothing went wrong); otherwise it
        is dead and queued for removal when this returns, whatever happened."""
        executed, cleaning = self.run_to_exit(sandbox, code, tenant=tenant, started=started)
        if cleaning is None:
            return executed
        return Executed(executed.result, self.settle(sandbox, cleaning))

    def run_to_exit(self, sandbox: DockerSandbox, code: str, *, tenant: str = "",
                    started: float | None = None) -> tuple[Executed, Demux | None]:
        """As `run`, but back as soon as the program's exit record is read: the result, and, while the
        supervisor is still cleaning up after it, the stream to `settle` before the container may serve
        again (None: its ready record came with the exit record, or the container is retired already)."""
        started = started if started is not None else time.monotonic()
        tier = sandbox.tier
        if sandbox.tenant is None:
            sandbox.tenant = tenant
        elif sandbox.tenant != tenant:
            raise SandboxUnavailable("a sandbox bound to one tenant was offered another's code")
        sandbox.executions += 1
        parser = FrameParser(cap=tier.output_bytes)
        demux = Demux(parser)
        with self._lock:
            self._executing[sandbox.container_id] = time.time()
        base = sandbox.meter.usage() if sandbox.meter is not None else None
        if sandbox.meter is not None:
            sandbox.meter.reset_peak()
        timed_out, infra_error = self._exchange(sandbox, self._request(sandbox, code, tenant), demux)
        usage = sandbox.meter.usage() if sandbox.meter is not None else None
        retired_because = anomaly(parser, timed_out, infra_error, usage, base)
        if retired_because is None and parser.ready is not None:
            retired_because = unsettled(parser)
        if retired_because is not None:
            usage = self.stop(sandbox) or usage
        with self._lock:
            self._executing.pop(sandbox.container_id, None)
        sandbox.last_used = time.monotonic()
        cpu = oom = None
        if usage is not None:
            since = sandbox.cpu_at_exit
            if since is None:
                since = base.cpu_seconds if base is not None else 0.0
            cpu, sandbox.cpu_at_exit = max(0.0, usage.cpu_seconds - since), usage.cpu_seconds
            oom = usage.oom_kills > (base.oom_kills if base is not None else 0)
        if (sandbox.meter is None and (parser.exit is None or parser.exit.signal == 9)) or (
                parser.exit is None and not timed_out and not oom):
            # No record: the container itself died. Under gVisor an OOM kill takes the whole sandbox
            # (and its cgroup with it), and only the engine remembers why.
            oom = self._oom_killed(sandbox)
        gone = lost(parser, timed_out, bool(oom)) if infra_error is None else None
        if gone is not None:  # the host's trouble, never the program's: the caller may run it again
            infra_error, retired_because = gone, "lost"
        facts = HostFacts(started=started, timed_out=timed_out, cpu_seconds=cpu,
                          memory_peak_bytes=usage.memory_peak_bytes if usage is not None else None,
                          oom_killed=bool(oom), infra_error=infra_error, agent_said=bytes(demux.agent_err))
        if retired_because is not None:
            self.destroy_id(sandbox.container_id)
        cleaning = demux if retired_because is None and parser.ready is None else None
        return Executed(finish(tier, self.name, parser, facts), retired_because), cleaning

    def settle(self, sandbox: DockerSandbox, cleaning: Demux) -> str | None:
        """Read the rest of an execution's stream, up to its supervisor's ready record (the cleanup done,
        CLEANUP_TIMEOUT_S at most): why the container must not serve again (it is then retired), or None."""
        try:
            self._read_until(sandbox, cleaning, time.monotonic() + CLEANUP_TIMEOUT_S,
                             lambda parser: parser.ready is not None)
        except OSError:
            pass  # no ready record: retired below
        parser = cleaning.parser
        why = "protocol" if parser.protocol_error is not None else unsettled(parser)
        if why is not None:
            self.stop(sandbox)
            self.destroy_id(sandbox.container_id)
        return why

    @staticmethod
    def alive(sandbox: DockerSandbox) -> bool:
        """Whether a waiting container can still serve, asked of the kernel in microseconds: its init has
        not exited (its pidfd turns readable when it does) and its attach stream is open and quiet (a
        waiting supervisor says nothing; the stream of a removed container ends)."""
        waiter = select.poll()
        try:
            waiter.register(sandbox.raw.fileno(), select.POLLIN | select.POLLRDHUP)
            if sandbox.meter is not None:
                waiter.register(sandbox.meter.pidfd, select.POLLIN)
            return not waiter.poll(0)
        except (OSError, ValueError):  # a closed socket or descriptor
            return False

    def _request(self, sandbox: DockerSandbox, code: str, tenant: str) -> bytes:
        """Under gVisor the sandbox's own kernel bounds processes and memory per sandbox (its sentry
        takes no pids cgroup, and an OOM kill there would take the whole sandbox): the supervisor sets
        RLIMIT_NPROC and RLIMIT_AS for the program. Under runc the cgroup does, and RLIMIT_NPROC would
        count the uid's processes in every container of the host. The code runs as its tenant's own
        uid (base/exec_uids.py), so per-user kernel limits are not shared with other tenants."""
        tier = sandbox.tier
        uid = exec_uid(tenant)
        if self.runtime_of(tier) == "runsc":
            return encode_request(code, tier, tenant=tenant, nproc=tier.pids, as_bytes=tier.memory_mb << 20,
                                  uid=uid)
        return encode_request(code, tier, tenant=tenant, uid=uid)

    @staticmethod
    def _exchange(sandbox: DockerSandbox, request: bytes, demux: Demux) -> tuple[bool, str | None]:
        """Send the request; read frames until the exit record, the program's wall-clock deadline (it
        starts when the code is sent, not while a container started) or the output cap. Whether the
        program timed out, and our own side's failure if any."""
        try:
            sandbox.raw.sendall(request)
            in_time = DockerBackend._read_until(sandbox, demux, time.monotonic() + sandbox.tier.wall_time_s,
                                                lambda parser: parser.exit is not None or parser.ready is not None)
        except OSError as exc:
            return False, f"lost the sandbox connection: {exc}"
        return not in_time, None

    @staticmethod
    def _read_until(sandbox: DockerSandbox, demux: Demux, until: float, done: Callable[[FrameParser], bool]) -> bool:
        """Feed the stream to `demux` until `done`, a protocol error, the output cap or the stream's end;
        False when `until` (monotonic) passed first."""
        parser = demux.parser
        while not done(parser) and parser.protocol_error is None and not parser.truncated:
            remaining = until - time.monotonic()
            if remaining <= 0:
                return False
            sandbox.raw.settimeout(remaining)
            try:
                data = sandbox.raw.recv(65536)
            except TimeoutError:
                return False
            if not data:
                break
            demux.feed(data)
        return True

    def execute(self, code: str, tier: Tier, tenant: str = "") -> SandboxResult:
        """One-shot: a fresh container for this execution only (no pool)."""
        started = time.monotonic()
        sandbox = self.create_sandbox(tier)
        executed = self.run(sandbox, code, tenant=tenant, started=started)
        if executed.reusable:
            self.destroy(sandbox)
        return executed.result

    def stop(self, sandbox: DockerSandbox) -> Usage | None:
        """Measure the container, then kill it synchronously; its usage (None when unmeasurable)."""
        try:
            if sandbox.meter is not None:
                usage = sandbox.meter.usage()
            else:
                usage = _stats_usage(self.api.stats(sandbox.container_id, stream=False, one_shot=True))
        except Exception:  # noqa: BLE001 - an unmeasurable sandbox is charged by wall time, never spared the kill
            usage = None
        # Close our end first: the engine's stream copier must not block on a reader that stopped
        # reading (an output flood), or an API kill would wait for it.
        self._close_socket(sandbox)
        killed = sandbox.meter.kill() if sandbox.meter is not None else False
        if sandbox.meter is not None:
            sandbox.meter.close()
        if not killed:
            self.kill_id(sandbox.container_id)
        with self._lock:
            self._executing.pop(sandbox.container_id, None)
        return usage

    def _oom_killed(self, sandbox: DockerSandbox) -> bool:
        try:
            return bool(self.api.inspect_container(sandbox.container_id)["State"].get("OOMKilled"))
        except _sdk().errors.DockerException:
            return False

    # -- teardown ------------------------------------------------------------------
    def kill_id(self, container_id: str) -> None:
        """Kill a container through the engine and wait until it is no longer running."""
        try:
            self.api.kill(container_id)
            self.api.wait(container_id, timeout=10)
        except Exception:  # noqa: BLE001 - gone already, or the engine is in trouble: the sweeper retries
            pass

    @staticmethod
    def _close_socket(sandbox: DockerSandbox) -> None:
        for closable in (sandbox.raw, sandbox.sock):
            try:
                closable.close()  # type: ignore[attr-defined]
            except (OSError, AttributeError):
                pass

    def destroy(self, sandbox: DockerSandbox) -> None:
        """Kill now, remove in the background (an idle pool sandbox, or one never used)."""
        self.stop(sandbox)
        self.destroy_id(sandbox.container_id)

    def destroy_id(self, container_id: str) -> None:
        """Queue a forced removal; done off the request path so it costs the caller nothing."""
        if self._remover is None:
            self.remove_now(container_id)
        else:
            self._removals.put(container_id)

    def remove_now(self, container_id: str) -> bool:
        """Forced removal, retried a few times; False = still there (the sweeper will try again)."""
        for attempt in range(_REMOVE_ATTEMPTS):
            try:
                self.api.remove_container(container_id, force=True, v=True)
                return True
            except _sdk().errors.NotFound:
                return True
            except Exception as exc:  # noqa: BLE001 - the remover thread must survive engine hiccups
                if "already in progress" in str(exc):
                    return True
                if attempt == _REMOVE_ATTEMPTS - 1:
                    log.warning("could not remove sandbox container %s (left to the sweeper): %s",
                                container_id[:12], exc)
                    return False
                time.sleep(0.2 * 2 ** attempt)
        return False

    def _remove_loop(self) -> None:
        while True:
            cid = self._removals.get()
            if cid is None:
                return
            self.remove_now(cid)

    def pending_removals(self) -> int:
        return self._removals.qsize()

    # -- what the sweeper needs ----------------------------------------------------
    def executing_since(self, container_id: str) -> float | None:
        """Wall-clock time this worker handed the container its code; None if it is not executing here."""
        with self._lock:
            return self._executing.get(container_id)

    def reap_orphans(self) -> list[str]:
        """Remove labelled containers whose owning worker process (on this host) is gone.

        Containers of live workers, and of other hosts sharing the engine, are left alone here
        (the sweeper bounds their age). A worker that died mid-execution leaves its container
        running; the next worker to start on the host removes it here.
        """
        reaped = []
        for c in self.list_sandboxes():
            owner = (c.get("Labels") or {}).get(LABEL_OWNER, "")
            if not owner_alive(owner):
                self.remove_now(c["Id"])
                reaped.append(c["Id"])
        return reaped

    def sweep(self, policy: SweepPolicy) -> list[tuple[str, ReapReason]]:
        """Kill and remove every labelled container the policy condemns (see base/sweeper.py)."""
        reaped = []
        now = time.time()
        for c in self.list_sandboxes():
            cid = c["Id"]
            owner = (c.get("Labels") or {}).get(LABEL_OWNER, "")
            stopped_at = self._stopped_at(cid) if c.get("State") not in ("running", "created") else None
            reason = policy.verdict(c, now=now, executing_since=self.executing_since(cid),
                                    owner_alive=owner_alive(owner), stopped_at=stopped_at)
            if reason is None:
                continue
            self.kill_id(cid)
            if self.remove_now(cid):
                reaped.append((cid, reason))
        return reaped

    def _stopped_at(self, container_id: str) -> float | None:
        """When a stopped container stopped (epoch seconds); None if the engine cannot say."""
        try:
            finished = str(self.api.inspect_container(container_id)["State"].get("FinishedAt") or "")
            stamp = datetime.fromisoformat(finished[:26].rstrip("Z") + "+00:00")
        except Exception:  # noqa: BLE001 - gone meanwhile, or an odd timestamp: judge by age instead
            return None
        return stamp.timestamp() if stamp.year > 1 else None

    def list_sandboxes(self) -> list[dict]:
        return self.api.containers(all=True, filters={"label": f"{LABEL}=1"})
