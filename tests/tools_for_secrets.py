"""Tools for tests/test_secrets_worker.py and tests/test_secrets_task_args.py (loaded by the test's
worker with ``--tools tests.tools_for_secrets``): careless tools that quote or log the secrets they
are given, as real tools do."""

from __future__ import annotations

import logging

from toolfleet import ToolFailure, tool

log = logging.getLogger(__name__)


@tool(access="write", resources=lambda a: [f"card:{a['card']}"], sensitive=("pin",), timeout_s=10)
def charge_card(card: str, pin: str) -> str:
    """Charge a card (a journaled write: always refused, quoting the PIN it was given).

    Args:
        card: The card.
        pin: The card's PIN (a declared sensitive parameter).
    """
    raise ToolFailure(f"card {card} refused the PIN {pin}", "ask the user for the right PIN")


@tool(access="read", resources=lambda a: [])
def sign_in(user: str, password: str) -> str:
    """Sign in (logs the attempt the way a careless tool does, then succeeds).

    Args:
        user: Who signs in.
        password: Their password.
    """
    log.warning("sign_in: trying %s / %s", user, password)
    return f"signed in as {user}"


@tool(access="read", resources=lambda a: [])
def http_request(url: str, headers: list[dict] | None = None, env: list[dict] | None = None) -> str:
    """Pretend to send an HTTP request (headers and env as name/value pairs, as HAR and Kubernetes write them).

    Args:
        url: Where to send it.
        headers: The headers, each {"name": ..., "value": ...}.
        env: Environment variables, each {"name": ..., "value": ...}.
    """
    return f"sent to {url} with {len(headers or [])} header(s)"


@tool(access="read", resources=lambda a: [])
def fetch_report(user: str, password: str) -> str:
    """Fetch a report behind a login (refused: the error quotes the URL it built, as
    requests' ``HTTPError`` does, the password URL-encoded in its query).

    Args:
        user: Who logs in.
        password: Their password.
    """
    from urllib.parse import urlencode

    raise ToolFailure(f"401 Client Error: Unauthorized for url: https://reports.example.com/login?"
                      f"{urlencode({'u': user, 'p': password})}", "check the user and password")
