"""The worker's secrets a sandbox covers (docs/secrets.md, docs/sandbox.md): where they lie
(:func:`secret_paths`) and the bwrap arguments that cover them at each command (:func:`hide`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

SECRET_FILE_VARIABLES = ("TOOLFLEET_FLEET_KEY_FILE", "TOOLFLEET_REDIS_PASSWORD_FILE", "TOOLFLEET_REDIS_KEY_FILE")
"""Variables naming files of the worker's secrets (docs/signing.md, docs/secrets.md)."""
SECRET_DIRECTORIES = ("/run/secrets", "/var/run/secrets")
"""Docker's secrets and Kubernetes' (the service account token under ``/var/run/secrets``)."""


def secret_paths(settings: Any, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Where this worker's secrets lie on its disk, as absolute paths (symbolic links are resolved
    by :func:`~toolfleet.tools.sandbox.bwrap_argv` at each command, so a secret rotated by
    re-pointing a link, as Kubernetes does with secret volumes, stays covered): the files
    :data:`SECRET_FILE_VARIABLES` and ``settings.redis_key_file`` name, the ``ssl_keyfile`` of each of its URLs (a ``rediss://``
    URL configures its client alone: :mod:`toolfleet.redis_tls`), toolfleet's home (``$TOOLFLEET_HOME``, default
    ``~/.toolfleet``: the local stack's fleet key and state, with the Redis URL) and the secrets
    directories of Docker and Kubernetes (:data:`SECRET_DIRECTORIES`). A sandboxed command sees
    none of them; the file tools are confined to the workspace, and a secret the operator put in
    a workspace, or other copies of one (a hard link elsewhere), are the operator's to keep out of
    reach."""
    named = [environ.get(name) for name in SECRET_FILE_VARIABLES]
    named += [*url_key_files(settings), getattr(settings, "redis_key_file", None), *SECRET_DIRECTORIES,
              environ.get("TOOLFLEET_HOME") or os.path.join(os.path.expanduser("~"), ".toolfleet")]
    out: list[str] = []
    for path in named:
        if path:
            absolute = os.path.abspath(path)
            if absolute != "/" and absolute not in out:
                out.append(absolute)
    return tuple(out)


def url_key_files(settings: Any) -> list[str]:
    """The ``ssl_keyfile`` (a TLS client's private key, PEM path) named in the query of
    ``settings``' Redis, broker and ledger URLs (:mod:`toolfleet.redis_tls`), in that order."""
    out = []
    for name in ("redis_url", "broker_url", "ledger_url"):
        url = getattr(settings, name, None)
        try:
            query = parse_qsl(urlsplit(url).query) if isinstance(url, str) else []
        except ValueError:
            continue
        out += [value for key, value in query if key == "ssl_keyfile" and value]
    return out


def hide(paths: Sequence[str], root: str) -> tuple[list[str], list[str]]:
    """bwrap arguments that cover ``paths`` (resolved now, those that exist), split into those
    that go before the workspace's bind (a directory holding the workspace: the workspace is bound
    again inside the empty tmpfs) and those after it (everything else, so a secret inside the
    workspace stays covered). The workspace itself and ``/`` are never covered.

    A secret inside the workspace also gets each directory between the workspace and it bound onto
    itself first: the kernel refuses to rename a mount point (``EBUSY``), so a command cannot move
    the folder that holds the secret (``mv ops ops2``) and leave it, on the host, where the next
    sandbox does not look (a breaker read a covered key so, one command after the ``mv``)."""
    before: list[str] = []
    pinned: list[str] = []  # directories between the workspace and a secret in it, shallowest first
    after: list[str] = []
    inside = root.rstrip("/") + "/"
    for path in dict.fromkeys(os.path.realpath(p) for p in paths):
        if path in (root, "/") or not os.path.lexists(path):
            continue
        if path.startswith(inside):
            parts = path[len(inside):].split("/")[:-1]
            pinned.extend(inside + "/".join(parts[:n]) for n in range(1, len(parts) + 1))
        if os.path.isdir(path):
            (before if root.startswith(path.rstrip("/") + "/") else after).extend(["--tmpfs", path])
        else:
            after.extend(["--ro-bind", "/dev/null", path])
    binds = [arg for d in sorted(dict.fromkeys(pinned), key=lambda d: d.count("/")) for arg in ("--bind", d, d)]
    return before, binds + after
