"""Secrets in the dispatcher's own INVALID_ARGUMENT and UNKNOWN_TOOL messages, which the audit trail (and so
``toolfleet trace``, its HTML page, ``toolfleet run``'s live view) records as the call's
``finished`` message. No worker is needed: the dispatcher answers an invalid call itself.

- A schema violation quotes the value given (``show_given``): it masked only a secret-named
  parameter, and quoted a declared ``sensitive`` one (docs/secrets.md: masked "where a tool quotes
  them back") in full, while the ``planned`` entry of the same trail showed it as ``***``. Now a
  sensitive value is hidden like a secret-named one, and the call's secret values are masked
  wherever else the message (or ``data.errors``) would repeat them.
- The ``planned`` entry, an approval request and Flower's view masked a sensitive parameter but
  not the same value repeated in another one (a command), nor a policy refusal quoting it.
"""

from __future__ import annotations

import json
from typing import Literal

import pytest

from toolfleet import Dispatcher, ToolCall, tool
from toolfleet.audit import AuditLog
from toolfleet.keys import Keys
from toolfleet.redis_client import client_for
from toolfleet.tools.registry import Registry, default_registry
from toolfleet.tools.validation import check_call

WAIT_S = 20
DSN_SECRET = "DsnNoShape-20931"
MYSQL_PW = "Zq81LmVp0rtX77aa"


@tool(access="read", resources=lambda a: [], sensitive=("dsn",))
def connect_db(dsn: str, retries: int = 1) -> str:
    """Connect to a database.

    Args:
        dsn: The connection string (a declared sensitive parameter).
        retries: How often to try.
    """
    return "connected"


def trail_text(settings, turn_id: str) -> str:
    client = client_for(settings.ledger)
    keys = Keys(settings.namespace)
    read = [[e.type, e.call_id, e.data] for e in AuditLog(client, keys, 60).read(turn_id)]
    raw = [[k.decode(), v.decode()] for _id, fields in client.xrange(keys.turn_audit(turn_id))
           for k, v in fields.items()]
    return json.dumps(read) + json.dumps(raw)


def run_one(settings, workspace, call: ToolCall):
    registry = default_registry()
    registry.add(connect_db)
    with Dispatcher(settings, registry) as d:
        turn = d.submit([call], workspace=str(workspace))
        [result] = turn.results(WAIT_S)
    return turn.turn_id, result


def test_a_sensitive_value_quoted_by_a_schema_error_is_masked_in_the_audit_trail(settings, workspace):
    # the model sends the declared-sensitive dsn as an array: the wrong type is quoted back
    arguments = json.dumps({"dsn": ["host=db user=app", DSN_SECRET]})
    turn_id, result = run_one(settings, workspace, ToolCall(id="db", name="connect_db", arguments=arguments, index=0))
    assert result.code is not None and result.code.value == "INVALID_ARGUMENT"
    trail = trail_text(settings, turn_id)
    assert '"dsn": "***"' in trail  # the planned entry masks it...
    assert DSN_SECRET not in result.error.message, result.error.message  # ...the message does not
    assert DSN_SECRET not in trail



# --- the same, without Redis: check_call is what the dispatcher (and the worker) runs ---

@tool(access="read", resources=lambda a: [], sensitive=("pin",))
def unlock(pin: int, mode: Literal["once", "always"] = "once", note: str = "") -> str:
    """Unlock a door.

    Args:
        pin: The PIN (a declared sensitive parameter).
        mode: How: once or always.
        note: A note kept in the log.
    """
    return "open"


def checked(name: str, arguments) -> object:
    registry = Registry()
    registry.add(connect_db)
    registry.add(unlock)
    result = check_call(registry, ToolCall(id="c", name=name, arguments=arguments))
    assert not isinstance(result, tuple), "expected an error result"
    return result


def everything(result) -> str:
    return json.dumps([result.content, result.error.message, result.error.hint, result.data], ensure_ascii=False)


@pytest.mark.parametrize("arguments", [
    {"dsn": ["host=db", DSN_SECRET]},  # wrong type
    {"dsn": {"url": DSN_SECRET}},
    {"dsn": 20931},
    {"dsn": DSN_SECRET, "retries": DSN_SECRET},  # the secret repeated under a plain parameter
    {"dsn": DSN_SECRET, DSN_SECRET: 1},  # ...and as an unknown parameter's name
    {"dsn": DSN_SECRET, "extra": {"nested": [DSN_SECRET + " and more"]}},
])
def test_a_declared_sensitive_value_is_never_quoted_by_a_schema_error(arguments):
    result = checked("connect_db", arguments)
    assert result.code.value == "INVALID_ARGUMENT"
    assert DSN_SECRET not in everything(result), everything(result)
    assert "20931" not in everything(result)


def test_a_sensitive_integer_sent_as_a_string_is_not_quoted_in_the_fix():
    result = checked("unlock", {"pin": "'83920571'"[1:-1]})
    text = everything(result)
    assert "83920571" not in text, text
    assert "without the quotes" in result.error.message


def test_a_plain_parameter_is_still_quoted():
    result = checked("unlock", {"pin": 1234, "mode": "onec"})
    assert '"onec"' in result.error.message and '"once"' in result.error.message  # the close match


def test_a_token_shaped_parameter_name_is_masked_in_the_pointer_and_fix():
    token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    result = checked("unlock", {"pin": 1, token: "x", "note": {"https://ci:" + token + "@git.example.com": 1}})
    assert token not in everything(result), everything(result)


@tool(access="write", resources=lambda a: [], command_arg="command", sensitive=("password",))
def db_shell(command: str, password: str) -> str:
    """Run a database shell command.

    Args:
        command: The shell command.
        password: The database password (a declared sensitive parameter).
    """
    return "done"


def test_a_policy_refusal_quoting_the_command_masks_the_calls_sensitive_values(settings, workspace):
    from toolfleet.policy.config import Policy

    policy = Policy.from_dict({"commands": {"allow": ["echo *"], "deny": ["dropdb *"], "unmatched": "ask"}})
    registry = default_registry()
    registry.add(db_shell)
    arguments = json.dumps({"command": f"dropdb {DSN_SECRET}", "password": DSN_SECRET})
    with Dispatcher(settings, registry, policy) as d:
        turn = d.submit([ToolCall(id="p", name="db_shell", arguments=arguments, index=0)], workspace=str(workspace))
        [result] = turn.results(WAIT_S)
    assert result.code is not None and result.code.value == "PERMISSION_DENIED", result
    assert "dropdb" in result.error.message
    assert DSN_SECRET not in result.content, result.content
    trail = trail_text(settings, turn.turn_id)
    assert DSN_SECRET not in trail, [trail[max(i - 200, 0):i + 40] for i in [trail.find(DSN_SECRET)]]
