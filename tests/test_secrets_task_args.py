"""Secrets in the task arguments Flower shows (``kwargsrepr``: ``task-sent``/``task-received``
events, Flower's ``kwargs``) and in the ``planned`` audit entry, both made by
:func:`toolfleet.tools.redact.redact_arguments`, through a real worker.

- Name/value pairs (``[{"name": "X-Api-Key", "value": "..."}]``: HAR and OpenAPI headers,
  Kubernetes ``env`` lists, Postman; ``[["X-Api-Key", "..."]]``): the secret's name is in one
  key's *value* and the secret in the sibling ``value`` key, so ``redact_value``, which looked
  only at key names, masked nothing (now ``redact.pair_secret_key``/``is_secret_pair``).
- Well-known credential shapes and program options that ``secret_shapes``/``secret_programs``
  did not know (now they do): a HashiCorp Vault token ``hvs.…``, ``sqlcmd -P``, ``htpasswd -b``, ``zip -P``,
  ``openssl enc -k``, ``ssh-keygen -N``, a Discord webhook's token, ``Ocp-Apim-Subscription-Key``.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfleet import Dispatcher, ToolCall, default_registry
from toolfleet.audit import AuditLog
from toolfleet.keys import Keys
from toolfleet.redis_client import client_for
from toolfleet.tools.redact import MASK, MAX_DEPTH, redact_arguments, secret_values

from .test_audit import TaskEvents

WAIT_S = 60
TOOLS = "tests.tools_for_secrets"
SECRET = "k9Fh2LmQ7rTz0aB1"


def run_and_capture(settings, workspace, calls):
    with Dispatcher(settings, default_registry([TOOLS])) as d, TaskEvents(d.app) as events:
        turn = d.submit(calls, workspace=str(workspace))
        results = turn.results(WAIT_S)
        wanted = {f"{turn.turn_id}:{c.id}" for c in calls}
        assert events.wait_for(lambda seen: wanted <= {e.get("uuid") for e in seen if e.get("type") == "task-received"},
                               WAIT_S), "no task-received events"
        mine = [e for e in events.events if e.get("uuid") in wanted]
    client = client_for(settings.ledger)
    trail = json.dumps([[e.type, e.call_id, e.data]
                        for e in AuditLog(client, Keys(settings.namespace), 60).read(turn.turn_id)])
    return results, mine, trail


def test_name_value_pairs_are_masked_in_flower_and_the_audit_trail(settings, start_worker, workspace):
    start_worker(tools=TOOLS)
    calls = [ToolCall(id="req", name="http_request", index=0, arguments=json.dumps({
        "url": "https://api.example.com/v1/items",
        "headers": [{"name": "Accept", "value": "application/json"}, {"name": "X-Api-Key", "value": SECRET}],
        "env": [{"name": "DB_PASSWORD", "value": SECRET + "-env"}],
    }))]
    results, events, trail = run_and_capture(settings, workspace, calls)
    assert results[0].ok, results[0]
    received = [e["kwargs"] for e in events if e["type"] == "task-received"]
    assert received and "application/json" in received[0]
    assert SECRET not in json.dumps(events), received  # what Flower shows as the task's kwargs
    assert SECRET not in trail


@pytest.mark.parametrize("command", [
    f"VAULT_ADDR=https://vault:8200 vault login hvs.CAESI{SECRET}{SECRET} >/dev/null || true",
    f"sqlcmd -S db -U sa -P {SECRET} -Q 'select 1' || true",
    f"htpasswd -b .htpasswd admin {SECRET} || true",
    f"zip -P {SECRET} out.zip README.md || true",
    f"openssl enc -aes256 -k {SECRET} -in README.md -out /dev/null || true",
    f"curl -sS -m 1 -H 'Ocp-Apim-Subscription-Key: {SECRET}' http://127.0.0.1:9/ || true",
    f"curl -sS -m 1 -d '{{}}' http://127.0.0.1:9/api/webhooks/1234567/{SECRET} || true",
], ids=["vault-token", "sqlcmd-P", "htpasswd-b", "zip-P", "openssl-k", "azure-apim-header", "discord-webhook"])
def test_command_secrets_of_well_known_tools_are_masked_in_flower(settings, start_worker, workspace, command):
    start_worker(tools=TOOLS)
    calls = [ToolCall(id="cmd", name="run_command", index=0, arguments=json.dumps({"command": command}))]
    _results, events, trail = run_and_capture(settings, workspace, calls)
    received = [e["kwargs"] for e in events if e["type"] == "task-received"]
    assert SECRET not in json.dumps(events), received
    assert SECRET not in trail


# ---- name/value pairs, without a worker ----

def test_name_value_pairs_of_each_common_form_are_masked_and_others_kept():
    arguments = {
        "har": {"headers": [{"name": "Authorization", "value": "Basic dXNlcjpwdw=="},
                            {"name": "Accept", "value": "text/html", "comment": ""}]},
        "k8s": {"env": [{"name": "DB_PASSWORD", "value": "pw-1"}, {"name": "LOG_LEVEL", "value": "debug"},
                        {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "token"}}}]},
        "postman": [{"key": "x-api-key", "value": "pm-2", "type": "text"}, {"key": "page", "value": "2"}],
        "openapi": [{"header": "X-Auth-Token", "value": "oa-3"}, {"field": "client_secret", "value": "f-4"}],
        "aws": {"Tags": [{"Key": "Name", "Value": "web"}],
                "Parameters": [{"ParameterKey": "DbPassword", "ParameterValue": "cf-5"}]},
        "pairs": [["X-Api-Key", "pa-6"], ["Accept", "json"], ("session_id", 77)],
        "empty": [{"name": "password", "value": ""}, ["token", None]],
    }
    shown = redact_arguments(arguments)
    assert shown["har"]["headers"] == [{"name": "Authorization", "value": MASK},
                                       {"name": "Accept", "value": "text/html", "comment": ""}]
    assert shown["k8s"]["env"][:2] == [{"name": "DB_PASSWORD", "value": MASK}, {"name": "LOG_LEVEL", "value": "debug"}]
    assert shown["k8s"]["env"][2]["name"] == "API_TOKEN"  # a reference to a Secret (valueFrom), no value
    assert shown["postman"] == [{"key": "x-api-key", "value": MASK, "type": "text"}, {"key": "page", "value": "2"}]
    assert shown["openapi"] == [{"header": "X-Auth-Token", "value": MASK}, {"field": "client_secret", "value": MASK}]
    assert shown["aws"] == {"Tags": [{"Key": "Name", "Value": "web"}],
                            "Parameters": [{"ParameterKey": "DbPassword", "ParameterValue": MASK}]}
    assert shown["pairs"] == [["X-Api-Key", MASK], ["Accept", "json"], ["session_id", MASK]]
    assert shown["empty"] == [{"name": "password", "value": ""}, ["token", None]]
    # a tool quoting them back has them masked in its error message and the worker's log lines
    assert {"Basic dXNlcjpwdw==", "pw-1", "pm-2", "oa-3", "f-4", "cf-5", "pa-6", "77"} <= secret_values(arguments)
    assert not {"text/html", "debug", "web", "2", "json"} & secret_values(arguments)


SECRET_NAMES = ["X-Api-Key", "Authorization", "DB_PASSWORD", "api_key", "Ocp-Apim-Subscription-Key", "client_secret",
                "GITHUB_TOKEN", "x-auth-token", "Cookie", "PGPASSWORD", "aws_secret_access_key", "STRIPE_KEY"]
OTHER_NAMES = ["Accept", "Content-Type", "LOG_LEVEL", "page", "max_tokens", "keyboard", "password_file", "author"]
NAME_KEYS = ["name", "key", "header", "field", "Name", "Key", "ParameterKey"]
PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet="abcdef xyz-_", max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "items", "spec"]), inner,
                                                                 max_size=3),
    max_leaves=12,
)
PAIR_SECRET = st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ0123456789", min_size=10, max_size=24).map(lambda s: "Qz" + s)


def _pair(name_key: str, name: str, value: str, as_list: bool) -> object:
    if as_list:
        return [name, value]
    value_key = "ParameterValue" if name_key == "ParameterKey" else ("Value" if name_key[0].isupper() else "value")
    return {name_key: name, value_key: value}


def _plant(container: object, pair: object, path: list[int], depth: int) -> object:
    """``pair`` put ``depth`` levels down inside ``container`` (lists and objects, chosen by ``path``)."""
    node = pair
    for level in range(depth):
        node = [container, node] if path[level % len(path)] % 2 else {"items": node, "other": container}
    return node


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PLAIN, st.sampled_from(SECRET_NAMES), st.sampled_from(OTHER_NAMES), st.sampled_from(NAME_KEYS), PAIR_SECRET,
       st.booleans(), st.integers(0, MAX_DEPTH - 4), st.lists(st.integers(0, 1), min_size=1, max_size=5))
def test_any_value_under_a_secret_name_in_a_name_value_pair_at_any_depth_is_masked(
        container, secret_name, other_name, name_key, secret, as_list, depth, path):
    arguments = {"request": _plant(container, _pair(name_key, secret_name, secret, as_list), path, depth)}
    shown = json.dumps(redact_arguments(arguments))  # what kwargsrepr and the audit trail carry
    assert secret not in shown and MASK in shown and secret_name in shown
    assert secret in secret_values(arguments)
    # the same pair under an ordinary name is shown as it is
    ordinary = {"request": _plant(container, _pair(name_key, other_name, secret, as_list), path, depth)}
    assert secret in json.dumps(redact_arguments(ordinary))
    assert secret not in secret_values(ordinary)
