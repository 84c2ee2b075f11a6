"""Secrets as tools and tool names really show them (a breaker's finds, against a real worker,
Flower and the trace): a sensitive value a tool quotes escaped (``repr``, ``json.dumps``: a
backslash doubled, ``ä`` as ``\\u00e4``) was not masked, the exact value not matching; a token
glued to a word by ``_`` or ``-`` (``tool_ghp_...``, ``backup_AKIA...``) was never recognised, so a
tool name or an argument holding one reached Flower, the audit and the model as written."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet import ToolResult
from toolfleet.models import ErrorCode
from toolfleet.tools.redact import redact_text
from toolfleet.worker.redaction import mask_known_secrets

GLUED = ["tool_ghp_Zx9YabcdefghijklmnopqrstuvCb7", "backup_AKIAQWERTYUIOP654321", "key-sk-proj-abcdefghijklmnopqrstuv",
         "x_sk_live_abcdefghijkl", "tool_glpat-abcdefghijklmnopqrstuvw", "my-xoxb-1234567890-abcdefghij",
         "cfg_hf_abcdefghijklmnopqrstuvwxyz0123456"]
NOT_TOKENS = ["disk-usage-report-for-2024-summary", "desk_test_abcdefghijklm", "backupAKIAQWERTYUIOP654321",
              "risk-assessment-quarterly-final", "task-sk-ordinary"]


@pytest.mark.parametrize("text", GLUED)
def test_a_token_glued_to_a_word_by_a_separator_is_masked(text):
    head = text.split("_")[0] if "_" in text else text.split("-")[0]
    shown = redact_text(f"there is no tool named {text!r}")
    assert shown.startswith("there is no tool named") and head in shown and "***" in shown, shown
    assert text[len(head) + 1:] not in shown, shown


@pytest.mark.parametrize("text", NOT_TOKENS)
def test_ordinary_words_glued_to_a_prefix_are_not_tokens(text):
    assert redact_text(f"see {text} now") == f"see {text} now"


@pytest.mark.parametrize("value", ["hunt\\er2-BSLASH-77", "pässwörd-UNI-5521", "C:\\Users\\pw-WIN-8812",
                                   'a"quote"d-pw-1', "two\nlines-pw-2"])
@pytest.mark.parametrize("quote", [repr, json.dumps, lambda v: json.dumps(v, ensure_ascii=False), str])
def test_a_sensitive_value_quoted_escaped_is_masked_in_the_error(value, quote):
    arguments = {"user": "eve", "pin": value}
    failed = ToolResult.failure("c1", "vault_login", ErrorCode.EXECUTION_ERROR,
                                f"vault refused {quote(arguments)}", f"pin was {quote(value)}")
    masked = mask_known_secrets(failed, arguments, ("pin",))
    for form in {value, json.dumps(value)[1:-1], repr(value)[1:-1]}:
        assert form not in masked.content and form not in masked.error.hint, masked.content
    assert "eve" in masked.content


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(value=st.text(min_size=3, max_size=24).filter(lambda v: v.strip() == v and len(set(v)) > 2),
       quote=st.sampled_from([repr, json.dumps, lambda v: json.dumps(v, ensure_ascii=False)]))
def test_any_sensitive_value_quoted_by_repr_or_json_is_masked(value, quote):
    arguments = {"pin": value}
    shown = redact_text(f"refused {quote(arguments)} at login", known={value})
    quoted = quote(value)[1:-1]
    if len(quoted) >= 3:
        assert quoted not in shown, shown
