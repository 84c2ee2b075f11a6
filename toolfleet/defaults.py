"""Defaults that the CLI needs before (or without) importing pydantic: the Redis URL and the
namespace. :mod:`.settings` re-exports them; keep this module free of heavy imports (it is on the
path of ``toolfleet --help`` and ``toolfleet down``, issue 15 point 8)."""

from __future__ import annotations

import getpass
import os
import re

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def default_namespace() -> str:
    """``toolfleet-<user>``: the namespace used when none is given (``Settings()``, every CLI
    command, ``toolfleet up``). Per user, so two people whose stacks reach the same Redis (the one
    on 6379) do not share queues and run each other's calls (issue 15, point 12; docs/design.md,
    "Namespaces"). The user name is that of the process (``getpass.getuser()``, else the uid);
    characters a namespace may not hold become ``_``. Set ``TOOLFLEET_NAMESPACE`` (or pass
    ``namespace=``) to share a namespace on purpose."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no USER/LOGNAME and no passwd entry (a bare container)
        user = str(os.getuid())
    return "toolfleet-" + (re.sub(r"[^A-Za-z0-9_.-]", "_", user) or str(os.getuid()))

DEFAULT_MAX_PROCESSES = 512
"""Tasks (processes and threads) per sandbox (``Settings.sandbox_max_processes``, docs/sandbox.md
"Processes"). ``make -j`` on a few cores, a JVM's or a compiler's threads and a test runner's
workers fit many times over; a fork bomb stops at a size the host carries (512 shells are a few
hundred MB; the default ``pid_max`` is 32768) while its call runs out its time limit, even with
tens of sandboxes at once."""

MIN_MAX_PROCESSES = 16
"""The smallest ``sandbox_max_processes`` but 0 (no limit): the sandbox's own processes count against
the limit (the deadline's ``timeout``, ``bwrap`` and its init, a live shell's lease watchdog, the
shell: 3 or 4), so a limit of 1 to 4 let no command run at all, and a few more no pipeline."""
