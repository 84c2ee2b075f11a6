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
- A JSON syntax error quotes the 40 characters before where parsing stopped; they were masked on
  their own, and the cut can leave a secret without the name or program that made it recognisable
  (``mysql ... -pSECRET`` without ``mysql``). An unknown tool name was cut to 64 characters (head
  and tail) before it was masked. Now the whole text is masked, then cut (``validation.around``),
  with a hypothesis property over secrets of known shapes anywhere in malformed JSON.
"""

from __future__ import annotations

import json
from typing import Literal

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from toolfleet import Dispatcher, ToolCall, tool
from toolfleet.audit import AuditLog
from toolfleet.keys import Keys
from toolfleet.redis_client import client_for
from toolfleet.tools.registry import Registry, default_registry
from toolfleet.tools.validation import around, check_call

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


@pytest.mark.parametrize("command", [
    # a literal new line inside a JSON string (a model writing a two-line command) stops the parser
    f"mysql --host=db.internal.example.com -u root -p{MYSQL_PW} -e 'select 1;\nselect 2'",
    f"git clone https://deploy:{MYSQL_PW}{MYSQL_PW}@git.example.com/x.git\ncd x",
])
def test_a_json_syntax_error_does_not_quote_a_secret_cut_from_its_name(settings, workspace, command):
    raw = '{"command": "' + command + '"}'  # not json.dumps: the new line stays raw
    turn_id, result = run_one(settings, workspace, ToolCall(id="cmd", name="run_command", arguments=raw, index=0))
    assert result.code is not None and result.code.value == "INVALID_ARGUMENT"
    assert "parsing stopped after" in result.error.message
    assert MYSQL_PW not in result.error.message, result.error.message
    assert MYSQL_PW not in trail_text(settings, turn_id)


@pytest.mark.parametrize("raw", [
    '{"retries": 2, "dsn": "' + DSN_SECRET + '"',  # cut short: the closing brace never came
    '{"dsn": "' + DSN_SECRET + '", "retries": 2,}',  # a trailing comma
    "{'dsn': '" + DSN_SECRET + "', 'retries': 2}",  # single quotes, as Python writes a dict
    '{"dsn": "' + DSN_SECRET + '" "retries": 2}',  # a comma missing
    '{"dsn": "' + DSN_SECRET[:9] + '\n' + DSN_SECRET[9:] + '"}',  # a raw new line inside the string
    '{"dsn": "' + DSN_SECRET[:9] + '\\u0041' + DSN_SECRET[9:] + '"',  # cut short, an escape inside
    json.dumps(json.dumps({"dsn": DSN_SECRET, "retries": 2})),  # encoded twice: a JSON string holding JSON
])
def test_a_declared_sensitive_value_in_malformed_json_is_never_quoted(settings, workspace, raw):
    # the arguments are no JSON, so no value is known to be the sensitive parameter's: it was
    # quoted in the syntax error's context (message, ledger, audit `finished`) and written whole
    # in the `planned` entry, where a secret-named parameter's value is masked by its name
    turn_id, result = run_one(settings, workspace, ToolCall(id="db", name="connect_db", arguments=raw, index=0))
    assert result.code is not None and result.code.value == "INVALID_ARGUMENT"
    assert "JSON" in result.error.message
    for piece in (DSN_SECRET, DSN_SECRET[:9], DSN_SECRET[9:]):
        assert piece not in result.content, result.content
        assert piece not in trail_text(settings, turn_id)


def test_an_unknown_tool_name_is_masked_before_it_is_shortened(settings, workspace):
    # a weak model puts the command in the name field; the name is cut to 64 characters (head and
    # tail) before it is masked, so the tail of the password is quoted without its name
    password = "Hx7Lq29VbN4mZ0pt"
    name = f"run_command with the environment set first: export DATABASE_PASSWORD={password}"
    turn_id, result = run_one(settings, workspace, ToolCall(id="u", name=name, arguments="{}", index=0))
    assert result.code is not None and result.code.value == "UNKNOWN_TOOL"
    tail = password[-12:]
    assert tail not in result.error.message, result.error.message
    assert tail not in trail_text(settings, turn_id)


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


KNOWN_SHAPES = [
    "sk-proj-Q7wErTy12UiOp34AsDfGh56JkL",
    "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    "AKIAQ3EGRIZ7XJ5LMN2P",
    "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
]
PASSWORD = "Zq81LmVp0rtX77aa"
SETTINGS = [  # where a password has a recognisable name or program in front of it
    "mysql -u root -p{s}", "git clone https://deploy:{s}@git.example.com/x.git", "export DATABASE_PASSWORD={s}",
    "curl -H 'Authorization: Bearer {s}' https://api.example.com", "{s}",
]


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=st.sampled_from(KNOWN_SHAPES + [PASSWORD]), setting=st.sampled_from(SETTINGS),
       pad_before=st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=60),
       pad_after=st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=60),
       breaker=st.sampled_from(["\n", "\t", '"', "", "}", ",", "\\q"]), cut=st.integers(0, 200))
def test_a_secret_of_a_known_shape_in_malformed_json_is_never_quoted(secret, setting, pad_before, pad_after,
                                                                     breaker, cut):
    if setting == "{s}" and secret == PASSWORD:
        secret = KNOWN_SHAPES[0]  # a bare password has no shape: nothing could recognise it
    command = pad_before + " " + setting.format(s=secret) + " " + pad_after
    raw = '{"command": "' + command + breaker + '"}'
    raw = raw[:len(raw) - cut % 3] if breaker == "" else raw  # a text cut short too
    try:
        json.loads(raw)
        return  # valid after all: not what this is about
    except ValueError:
        pass
    result = checked("run_command", raw)
    assert secret not in everything(result)
    for piece in (secret[i:i + 8] for i in range(0, len(secret) - 7, 4)):
        assert piece not in result.error.message, (piece, result.error.message)


@given(text=st.text(max_size=120), pos=st.integers(0, 130))
def test_around_shows_only_pieces_of_the_masked_text(text, pos):
    from toolfleet.tools.redact import mask_text

    pos = min(pos, len(text))
    before, after = around(text, pos)
    whole = mask_text(text)
    assert before.removeprefix("…").removesuffix("***") in whole
    assert after in whole


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


# --- siblings: other places that quoted a model's (or a state's) text cut first, then masked ---

TOKEN = "sk-proj-Q7wErTy12UiOp34AsDfGh56JkL"


def test_the_stream_adapters_mask_before_they_cut():
    from toolfleet.dispatcher.adapters.wire import cut, short

    for text in (f"curl -H 'Authorization: Bearer {TOKEN}'", f"mysql -u root -p{PASSWORD} -e 'select 1'"):
        for limit in (20, 30, 40, 60):
            for shown in (short(text, limit), cut(text, limit)):
                assert TOKEN[8:20] not in shown and PASSWORD[4:] not in shown, shown


def test_a_session_states_differences_and_validation_errors_mask_before_they_cut():
    from pydantic import BaseModel, ValidationError

    from toolfleet.tools.state_json import _differs, validation_text

    shown = _differs("/token", f"Bearer {TOKEN}", f"Bearer {TOKEN} ")
    assert TOKEN[-12:] not in shown and TOKEN[:12] not in shown, shown

    class Login(BaseModel):
        retries: int

    try:
        Login(retries=f"mysql -u root -p{PASSWORD} -e 'select 1'")
    except ValidationError as exc:
        text = validation_text(exc)
    assert "retries" in text and PASSWORD[:6] not in text and PASSWORD[-6:] not in text, text


def test_reading_sensitive_values_from_text_is_linear():
    """Arrays opened under the sensitive name again and again, never closed: each was read to the
    end of the text (quadratic: minutes for 160 KB); a name inside an array read whole is skipped."""
    import time

    from toolfleet.tools.redact import sensitive_values_in_text

    text = '{"dsn": "' + DSN_SECRET + '", ' + '"dsn": [' * 20_000
    began = time.monotonic()
    found = sensitive_values_in_text(text, ["dsn"])
    assert time.monotonic() - began < 5.0 and DSN_SECRET in found
