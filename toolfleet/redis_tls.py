"""TLS to Redis: one set of options, carried by the URL, understood by every client toolfleet uses.

A ``rediss://`` URL is Redis over TLS; ``redis://user:password@host`` (or ``rediss://...``) logs in
as a Redis ACL user (docs/deploying.md gives each role's rules). The TLS options are the query
parameters that redis-py (``Redis.from_url``), kombu (the broker) and Celery's Redis result backend
all read from a URL: ``ssl_ca_certs`` (CA bundle, PEM path), ``ssl_certfile`` / ``ssl_keyfile``
(client certificate and key, PEM paths, for a Redis started with ``tls-auth-clients yes``) and
``ssl_cert_reqs`` (``required``, ``optional`` or ``none``).

:func:`with_tls` writes the options of :class:`toolfleet.settings.Settings` (``redis_ca_file``...,
from ``TOOLFLEET_REDIS_CA_FILE``...) into a ``rediss://`` URL, so the URL alone configures every
client, including the processes a URL is handed to (``toolfleet worker --redis-url``, Flower).
A ``rediss://`` URL always gets ``ssl_cert_reqs`` (default ``required``): without it kombu falls back
to *not* checking the server's certificate, and Celery's result backend refuses the URL.

:func:`ssl_options` gives the same options as the dict Celery's ``broker_use_ssl`` and
``redis_backend_use_ssl`` settings take (Flower reads ``broker_use_ssl`` for its queue view).
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

TLS_SCHEME = "rediss"
CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
# Settings field -> URL query parameter (the names redis-py, kombu and Celery read)
TLS_QUERY = {"redis_ca_file": "ssl_ca_certs", "redis_cert_file": "ssl_certfile", "redis_key_file": "ssl_keyfile",
             "redis_cert_reqs": "ssl_cert_reqs"}


def is_tls(url: str | None) -> bool:
    """``url`` is Redis over TLS (``rediss://``)."""
    return bool(url) and url.split("://", 1)[0].lower() == TLS_SCHEME


def with_tls(url: str, options: dict[str, str | None]) -> str:
    """``url`` with the TLS ``options`` (Settings field names of :data:`TLS_QUERY`; ``None``: not
    given) added as query parameters when it is a ``rediss://`` URL; a parameter the URL already
    has wins. Any other URL is returned unchanged. ``ssl_cert_reqs`` defaults to ``required``."""
    if not is_tls(url):
        return url
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    for field, param in TLS_QUERY.items():
        value = options.get(field)
        if value and param not in query:
            query[param] = str(value)
    query.setdefault("ssl_cert_reqs", "required")
    return urlunsplit(parts._replace(query=urlencode(query, safe="/")))


def ssl_options(url: str | None) -> dict[str, Any] | None:
    """The TLS options of a ``rediss://`` URL as Celery's ``broker_use_ssl`` /
    ``redis_backend_use_ssl`` dict (``ssl_cert_reqs`` as an :mod:`ssl` constant); ``None`` for a URL
    that is not ``rediss://``. Raises ``ValueError`` for an ``ssl_cert_reqs`` that is not
    required/optional/none."""
    if not url or not is_tls(url):
        return None
    query = dict(parse_qsl(urlsplit(url).query))
    reqs = query.get("ssl_cert_reqs", "required")
    key = reqs.lower().removeprefix("cert_")
    if key not in CERT_REQS:
        raise ValueError(f"ssl_cert_reqs must be required, optional or none, not {reqs!r}")
    options: dict[str, Any] = {"ssl_cert_reqs": CERT_REQS[key]}
    for param in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if query.get(param):
            options[param] = query[param]
    return options


def with_login(url: str, user: str | None, password: str) -> str:
    """``url`` (``redis://`` or ``rediss://``) logging in as ``user`` (``None``: the URL's own user,
    else Redis's ``default``) with ``password``, quoted for the URL; a URL that has a password of
    its own, or is not a Redis URL, is returned unchanged."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", TLS_SCHEME) or parts.password is not None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    name = quote(user if user is not None else (parts.username or ""), safe="")
    return urlunsplit(parts._replace(netloc=f"{name}:{quote(password, safe='')}@{host}"))


def password_in_userinfo(url: str) -> str:
    """``url`` with a ``?password=`` query parameter (which redis-py and Celery's Redis result
    backend read; the query's wins over a ``:password@``) moved into its ``user:password@``, the
    same login. For the URL handed to Celery as the result backend: Celery masks a URL's
    ``:password@`` wherever it shows the URL (``celery inspect conf``, Flower's worker page, the
    worker's banner), never its query. Any other URL is returned unchanged."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.scheme not in ("redis", TLS_SCHEME) or not parts.query:
        return url
    query = parse_qsl(parts.query, keep_blank_values=True)
    passwords = [value for name, value in query if name == "password"]
    if not passwords or not passwords[-1]:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    name = quote(unquote(parts.username or ""), safe="")
    rest = urlencode([(k, v) for k, v in query if k != "password"])
    return urlunsplit(parts._replace(netloc=f"{name}:{quote(passwords[-1], safe='')}@{host}", query=rest))
