"""Secrets in the task arguments Flower shows (``kwargsrepr``: ``task-sent``/``task-received``
events, Flower's ``kwargs``) and in the ``planned`` audit entry, both made by
:func:`toolfleet.tools.redact.redact_arguments`, through a real worker.

- Name/value pairs (``[{"name": "X-Api-Key", "value": "..."}]``: HAR and OpenAPI headers,
  Kubernetes ``env`` lists, Postman): the secret's name is in one key's *value* and the secret in
  the sibling ``value`` key, so ``redact_value`` (which looks at key names) masks nothing.
- Well-known credential shapes and program options that ``secret_shapes``/``secret_programs``
  do not know: a HashiCorp Vault token ``hvs.…``, ``sqlcmd -P``, ``htpasswd -b``, ``zip -P``,
  ``openssl enc -k``, ``ssh-keygen -N``, a Discord webhook's token, ``Ocp-Apim-Subscription-Key``.
"""

from __future__ import annotations

import json

import pytest

from toolfleet import Dispatcher, ToolCall, default_registry
from toolfleet.audit import AuditLog
from toolfleet.keys import Keys
from toolfleet.redis_client import client_for

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
