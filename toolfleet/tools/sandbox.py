"""The OS sandbox that ``run_command`` runs its commands in: build it, and check once that it works.

Built on bubblewrap (``bwrap``, the Debian package ``bubblewrap``), as the coding agents that run
model-proposed commands on Linux do (OpenAI Codex CLI, Anthropic's sandbox-runtime). What a
sandboxed command gets (docs/sandbox.md):

- the root file system read-only (``--ro-bind / /``), a private ``/tmp`` (tmpfs), a minimal ``/dev``,
  its own ``/proc``; the workspace bound read-write last, so it stays writable when it lies under
  ``/tmp``: the only writable place that outlives the call;
- its own user, PID, IPC, UTS and cgroup namespaces, every capability dropped, no nested user
  namespaces (``--disable-userns``), a new session (no terminal to inject keystrokes into);
- ``--die-with-parent`` plus the PID namespace: when the command's shell exits, or when the worker
  kills the ``bwrap`` process (time limit, cancel), the kernel kills every process of the
  namespace. Nothing the command started outlives the call;
- network ``"none"`` (own network namespace: only its own loopback; ``/run`` is hidden so the host's
  Unix sockets there are out of reach) or ``"host"``;
- an environment built from an allow-list (:data:`ENV_ALLOW`), never the worker's secrets;
- at most ``max_processes`` tasks (processes and threads) at once, kept by the kernel: a cgroup of
  its own (``pids.max``) or ``RLIMIT_NPROC`` in its user namespace (:mod:`.limits`), so a fork bomb
  stops there instead of filling the host's PID space;
- the worker's own secret files out of sight (:func:`secret_paths`: the fleet key file, the Redis
  password and TLS key files, toolfleet's home with the local stack's key and state, Docker's
  ``/run/secrets``): each covered by an empty tmpfs (a directory) or ``/dev/null`` (a file), since
  the command runs as the worker's user, who may read them.

Root of the worker or not, the command runs with no capability: as root, bwrap would otherwise keep
them and a ``mount -o remount,rw /`` would undo the read-only root.

State: :func:`configure` (called once at worker start-up, before the pool forks) records the
configuration and the result of a probe (a trivial command run in the sandbox); :func:`current`
gives it to the handler (probing the default configuration if nothing was configured, so a
process that skipped start-up is never unsandboxed by omission).
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..defaults import DEFAULT_MAX_PROCESSES
from ..errors import ToolFailure
from .limits import ProcessLimit, SandboxCgroup
from .limits import find as find_limit
from .sandbox_secrets import hide, secret_paths

log = logging.getLogger(__name__)

ENV_ALLOW = ("PATH", "HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TERM", "TZ", "USER",
             "LOGNAME", "SHELL")
"""Variables of the worker's environment a command sees (when set); everything else is dropped."""
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROBE_TIMEOUT_S = 10.0
PROBE_SCRIPT = ("echo ok > probe && test ! -w /usr"
                " && ! (cat /proc/sys/kernel/core_uses_pid > /proc/sys/kernel/core_uses_pid) 2>/dev/null")
"""Run in the sandbox at start-up: the workspace is writable, the root is not, and neither is
/proc/sys (writing a sysctl's own value back changes nothing when the check fails open)."""
SHARED_DIRECTORIES = frozenset({"/", "/tmp", "/var/tmp", "/dev", "/dev/shm", "/run", "/var/run", "/proc", "/sys"})
"""Workspaces refused: bound read-write, they would hand a command what the sandbox hides (the host's
``/tmp`` holds the Unix sockets of other services and of the worker's own session host, reachable
with network ``"none"``; ``/run`` those of databases and Docker)."""
SANDBOXED_TOOLS = frozenset({"run_command", "shell"})
"""Tools a worker does not serve when the sandbox cannot be created (and ``sandbox`` is not ``"none"``)."""
UNSANDBOXED_NOTE = '[unsandboxed: this worker runs commands without a sandbox (sandbox = "none", set by the operator)]'


@dataclass(frozen=True)
class SandboxConfig:
    """``mode``: ``"bwrap"`` or ``"none"``; ``network``: ``"none"`` or ``"host"``; ``bwrap``: the binary
    (a name looked up on ``PATH`` or a path); ``hidden``: paths covered in every sandbox
    (:func:`secret_paths`). Source: :class:`toolfleet.settings.Settings`."""

    mode: str = "bwrap"
    network: str = "none"
    bwrap: str = "bwrap"
    hidden: tuple[str, ...] = ()  # absolute paths covered in every sandbox: the worker's own secrets
    max_processes: int = DEFAULT_MAX_PROCESSES  # per sandbox, threads included; 0: no limit (.limits)
    cgroup: str = "auto"  # where per-sandbox cgroups are made: "auto", "off" or a directory (.limits)

    @classmethod
    def from_settings(cls, settings: Any, environ: Mapping[str, str] | None = None) -> SandboxConfig:
        """The sandbox ``settings`` describe; ``hidden`` from :func:`secret_paths` of ``environ``
        (default: this process's environment)."""
        return cls(mode=settings.sandbox, network=settings.sandbox_network, bwrap=settings.bwrap_path,
                   hidden=secret_paths(settings, os.environ if environ is None else environ),
                   max_processes=settings.sandbox_max_processes, cgroup=settings.sandbox_cgroup)


@dataclass(frozen=True)
class SandboxState:
    """A configuration and whether it works here: ``error`` is ``None`` when the probe passed (or the
    mode is ``"none"``), else why the sandbox cannot be created."""

    config: SandboxConfig
    error: str | None = None
    limit: ProcessLimit = ProcessLimit()  # what bounds each sandbox's processes here (.limits.find)

    @property
    def unsandboxed(self) -> bool:
        return self.config.mode == "none"

    def describe(self) -> dict[str, Any]:
        """For the tool catalog and ``toolfleet tools``: ``{"mode", "network"[, "error"]}``."""
        out: dict[str, Any] = {"mode": self.config.mode, "network": self.config.network}
        if not self.unsandboxed:
            out.update(max_processes=self.limit.max_processes, process_limit=self.limit.kind)
        if self.error:
            out["error"] = self.error
        return out

    def hidden_now(self, workspace: Path) -> tuple[str, ...]:
        """The mounts that cover the worker's secrets for a sandbox of ``workspace`` made now
        (symbolic links resolved now, only paths that exist); ``()`` unsandboxed. A long-lived
        sandbox (a ``shell`` session) compares it before each command with the one it was made
        with: a secret rotated or created since is not covered in it (the shell is restarted)."""
        if self.unsandboxed:
            return ()
        before, after = hide(self.config.hidden, os.path.realpath(workspace))
        return (*before, "--bind-workspace", *after)

    def command(self, argv: Sequence[str], workspace: Path, network: str | None = None,
                environ: Mapping[str, str] | None = None,
                info_fd: int | None = None, mounts: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
        """The argv and environment to start ``argv`` with, in ``workspace``. Raises
        :class:`ToolFailure` (``TOOL_UNAVAILABLE``) when the sandbox cannot be created, and
        (``PERMISSION_DENIED``) when the workspace is ``/`` or not a directory. ``network``
        overrides the configured one for this command; ``info_fd`` (an fd the child inherits) gets
        bwrap's ``--info-fd`` JSON, whose ``child-pid`` is the sandbox's init; ``mounts`` (bwrap
        arguments) are made on the sandbox's own ``/dev`` before anything else is mounted on it."""
        if self.error and not self.unsandboxed:
            raise ToolFailure(f"run_command refused: the sandbox cannot be created on this worker ({self.error})",
                              "the operator must install bubblewrap (apt-get install bubblewrap) or set "
                              'sandbox = "none" explicitly', code="TOOL_UNAVAILABLE")
        env = allowed_env(os.environ if environ is None else environ)
        if self.unsandboxed:
            return list(argv), env
        return bwrap_argv(self.config, self.limit.wrap(argv), workspace, network or self.config.network, env, info_fd,
                          mounts), env

    def cgroup(self) -> SandboxCgroup | None:
        """A cgroup of its own for the next sandbox (:mod:`.limits`), to join in the starting child
        (:func:`sandbox_child`) and close once the sandbox has ended; ``None`` where cgroups do not
        keep the limit (unsandboxed, no cgroup, ``RLIMIT_NPROC`` instead). Raises ``ToolFailure``
        (``TOOL_UNAVAILABLE``) when it cannot be made: a sandbox never starts unbounded by accident."""
        if self.unsandboxed:
            return None
        try:
            return self.limit.open()
        except OSError as exc:
            raise ToolFailure(f"the sandbox's cgroup (its process limit) could not be made: {exc}",
                              "try again; the operator may set sandbox_cgroup = \"off\" (docs/sandbox.md)",
                              code="TOOL_UNAVAILABLE") from None


def allowed_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of ``environ`` (:data:`ENV_ALLOW`), with ``PATH`` defaulted, ``TMPDIR=/tmp``
    and ``XDG_CACHE_HOME=/tmp/.cache`` (``HOME`` is read-only in the sandbox; tools keep caches there)."""
    env = {name: environ[name] for name in ENV_ALLOW if name in environ}
    env.setdefault("PATH", DEFAULT_PATH)
    env["TMPDIR"] = "/tmp"
    env["XDG_CACHE_HOME"] = "/tmp/.cache"
    return env


def bwrap_argv(config: SandboxConfig, argv: Sequence[str], workspace: Path, network: str,
               env: Mapping[str, str], info_fd: int | None = None, mounts: Sequence[str] = ()) -> list[str]:
    """The bubblewrap command line that runs ``argv`` confined to ``workspace`` (see the module doc).
    Mount order matters: later mounts cover earlier ones, so the workspace comes after ``/tmp``."""
    root = os.path.realpath(workspace)
    if root in SHARED_DIRECTORIES or not os.path.isdir(root):
        raise ToolFailure(f"run_command refused: the workspace {str(workspace)!r} is not a directory that can be "
                          "confined (it must exist and be neither / nor a directory the host shares, such as "
                          "/tmp)", "give the turn a workspace directory of its own", code="PERMISSION_DENIED")
    if network not in ("none", "host"):
        raise ToolFailure(f"unknown sandbox network {network!r}", 'use "none" or "host"', code="INVALID_ARGUMENT")
    # /proc read-only: a worker running as root maps the sandbox's user to host uid 0, and files of
    # /proc/sys (0644, owned by uid 0) are writable by their owner's mode bits alone, capabilities or
    # not: kernel.core_pattern would run a workspace program as host root (a core dump helper)
    out = [config.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", *mounts, "--proc", "/proc", "--remount-ro", "/proc",
           "--tmpfs", "/tmp"]
    if network == "none":
        out += ["--tmpfs", "/run"]  # the host's Unix sockets (databases, docker) are reachable through a read-only bind
    before, after = hide(config.hidden, root)
    out += [*before, "--bind", root, root, *after, "--chdir", root,
            "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    if network == "none":
        out.append("--unshare-net")
    for name, value in env.items():
        out += ["--setenv", name, value]
    if info_fd is not None:
        out += ["--info-fd", str(info_fd)]
    return [*out, "--", *argv]


def probe(config: SandboxConfig) -> str | None:
    """Run ``true`` in the sandbox ``config`` describes, in a fresh directory; ``None`` when it ran,
    else why not (binary missing, namespaces refused, ...). Bounded by ``PROBE_TIMEOUT_S``."""
    if config.mode == "none":
        return None
    if config.mode != "bwrap":
        return f'unknown sandbox mode {config.mode!r} (use "bwrap" or "none")'
    binary = host_binary(config.bwrap)
    if binary is None:
        return f"the bubblewrap binary {config.bwrap!r} was not found (apt-get install bubblewrap)"
    with tempfile.TemporaryDirectory(prefix="toolfleet-probe-") as workspace:
        try:
            argv = bwrap_argv(config, ["/bin/sh", "-c", PROBE_SCRIPT], Path(workspace),
                              config.network, allowed_env(os.environ))
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=PROBE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired, ToolFailure) as exc:
            return f"{binary} could not be run: {exc}"
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).decode("utf-8", "replace").strip()[:300]
            return f"{binary} failed (exit status {done.returncode}): {detail or 'no message'}"
        if (Path(workspace) / "probe").read_text().strip() != "ok":
            return f"{binary} ran but the workspace was not writable in the sandbox"
    return None


_state: SandboxState | None = None


SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""Where the binaries that run *outside* the sandbox for a call (bubblewrap, the deadline's
``timeout``) are looked up first: root's directories, which no sandbox can write (the host's file
system is read-only in it). A worker's ``PATH`` may hold a directory a sandbox writes (a workspace's
``.venv/bin`` when the worker runs from the project the agent edits): a ``timeout`` planted there ran
as the worker, outside the sandbox (a breaker's find)."""


def host_binary(name: str) -> str | None:
    """The absolute path of the binary ``name`` (a path: itself, if it is executable), found on
    :data:`SYSTEM_PATH` first, then on this process's ``PATH``; ``None`` if neither has it."""
    if os.sep in name:
        return shutil.which(name)
    return shutil.which(name, path=SYSTEM_PATH) or shutil.which(name)


def deadline_binary() -> str:
    """The coreutils ``timeout`` that bounds each sandboxed command from outside (:func:`host_binary`,
    resolved once per process; ``/usr/bin/timeout`` when none is found, which then fails plainly)."""
    global _timeout
    if _timeout is None:
        _timeout = host_binary("timeout") or "/usr/bin/timeout"
    return _timeout


_timeout: str | None = None


_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
_KEYCTL_JOIN_SESSION_KEYRING = 1
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: a child only calls into it


def sandbox_child(parent: int, cgroup: SandboxCgroup | None = None) -> None:
    """``preexec_fn`` of a sandbox's start from the process ``parent`` (``functools.partial(
    sandbox_child, os.getpid())``): :func:`own_keyring`, and ``PR_SET_PDEATHSIG`` (SIGKILL), so
    what the pool process starts (the deadline's ``timeout``, which runs ``bwrap --die-with-parent``)
    dies with it: a pool process killed mid-call (its answer ``OUTCOME_UNKNOWN`` a fraction of a
    second later, the worker's main process alive, so the reaper's lease holds) no longer leaves
    the command running to its time limit, writing after its caller's answer (a breaker's find).
    A frozen pool process is not dead: the deadline and the reaper bound that case. Exits at once
    if ``parent`` died before the death signal was set. With ``cgroup`` (:meth:`SandboxState.cgroup`),
    it first joins that cgroup, so all the sandbox starts counts against its process limit."""
    if cgroup is not None:
        cgroup.join()
    own_keyring()
    _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:
        os._exit(1)


def own_keyring() -> None:
    """``preexec_fn`` of a sandbox's start: the child joins a new, empty anonymous session keyring
    (``keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)``, keyrings(7)) before it execs, so the sandbox
    and all it starts neither read nor write the worker's session keyring, which no namespace of
    bubblewrap's separates: a command's key in ``@s`` outlived its call and was read by another
    tenant's later call, and a key the worker's session held (Kerberos ``KEYRING:`` caches) was
    readable in the sandbox (a breaker's find, with the worker in a session keyring of its own, as
    runc and systemd's ``KeyringMode=private`` start services). A kernel or seccomp profile that
    refuses ``keyctl`` refuses it in the sandbox too: then there is nothing to separate."""
    if _SYS_KEYCTL is not None:
        _libc.syscall(_SYS_KEYCTL, _KEYCTL_JOIN_SESSION_KEYRING, None)


def configure(config: SandboxConfig) -> SandboxState:
    """Probe ``config`` and make it this process's sandbox (inherited by forked pool processes). The
    bubblewrap binary is resolved here, once (:func:`host_binary`), so every command runs the one
    probed; so is the deadline's ``timeout`` (:func:`deadline_binary`)."""
    deadline_binary()
    found = host_binary(config.bwrap) if config.mode == "bwrap" else None
    if found:
        config = replace(config, bwrap=found)
    limit = find_limit(config.max_processes, config.cgroup) if config.mode == "bwrap" else ProcessLimit()
    if limit.warning:
        log.warning("%s", limit.warning)
    return install(SandboxState(config, probe(config), limit))


def install(state: SandboxState) -> SandboxState:
    """Make ``state`` (already probed, e.g. by an earlier :func:`configure`) this process's sandbox."""
    global _state
    _state = state
    return state


def current() -> SandboxState:
    """This process's sandbox; the default configuration (bwrap, network none), probed, if
    :func:`configure` was never called."""
    return _state if _state is not None else configure(SandboxConfig())


def start_up_message(state: SandboxState) -> str | None:
    """What a worker says at start-up about its sandbox: a refusal, a warning, or ``None``."""
    if state.unsandboxed:
        return ('WARNING: sandbox = "none": run_command runs commands WITHOUT a sandbox (no confinement to the '
                "workspace, processes may outlive calls); every result says so")
    if state.error:
        return (f"run_command is NOT served by this worker: the sandbox cannot be created: {state.error}. "
                'Install bubblewrap (apt-get install bubblewrap), or run unsandboxed on purpose with --sandbox none '
                "(TOOLFLEET_SANDBOX=none)")
    if state.limit.warning:
        return f"WARNING: {state.limit.warning}"
    return None


def serve_sandboxed(registry: Any, settings: Any) -> tuple[Any, str | None]:
    """At worker start-up: configure and probe the sandbox of ``settings``; returns the registry to
    serve (without :data:`SANDBOXED_TOOLS` when the sandbox cannot be created) and what to tell the
    operator (``None`` when all is well)."""
    from .registry import Registry

    state = configure(SandboxConfig.from_settings(settings))
    if state.error and not state.unsandboxed:
        registry = Registry([spec for spec in registry if spec.name not in SANDBOXED_TOOLS])
    return registry, start_up_message(state)
