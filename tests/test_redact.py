"""Redaction of secrets and loading a policy (pure functions: no services)."""

from __future__ import annotations

import pytest

from toolfleet import ConfigurationError, Policy, tool
from toolfleet.tools.redact import MASK, is_secret_name, redact_arguments, redact_text

SHAPES = [
    'curl -H "Authorization: Bearer abcdef1234567890XYZ" https://x',
    "export OPENAI_API_KEY=sk-proj-abcdefghijklmnop1234",
    "ANTHROPIC sk-ant-api03-abcdefghijklmnopqrstuv",
    "git clone https://bob:hunter22@github.com/x/y",
    "token ghp_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    '{"password": "s3cret!"}',
    "mysql --password hunter2 -u root",
    "aws AKIAABCDEFGHIJKLMNOP",
    "slack xoxb-123456789012-abcdefghij",
    "stripe sk_live_abcdefghijklmnop1234",
    "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
]
SECRETS = ["abcdef1234567890XYZ", "abcdefghijklmnop1234", "abcdefghijklmnopqrstuv", "hunter22", "aaaaaaaaaaaaaaaa",
           "s3cret!", "hunter2", "AKIAABCDEFGHIJKLMNOP", "123456789012-abcdefghij", "sk_live_", "eyJhbGciOiJ",
           "MIIEow"]


@pytest.mark.parametrize(("text", "secret"), list(zip(SHAPES, SECRETS, strict=True)))
def test_secret_shapes_are_masked(text, secret):
    masked = redact_text(text)
    assert secret not in masked and MASK in masked


@pytest.mark.parametrize("text", ["the token count is 5", "keyboard = 5", "passed: 10 tests", "max_tokens: 1024",
                                  "echo done", "--tokens 5000"])
def test_ordinary_text_is_left_alone(text):
    assert redact_text(text) == text


def test_arguments_mask_declared_and_secret_named_parameters():
    shown = redact_arguments(
        {"pin": "1234", "db_password": "x-y-z", "headers": {"Authorization": "Basic abc"}, "n": 3, "note": "plain"},
        sensitive=["pin"],
    )
    assert shown == {"pin": MASK, "db_password": MASK, "headers": {"Authorization": MASK}, "n": 3, "note": "plain"}
    for name in ("api_key", "apiKey", "clientSecret", "Authorization", "DB_PASSWORD", "X-Auth-Token"):
        assert is_secret_name(name), name
    for name in ("max_tokens", "keyboard", "author", "path"):
        assert not is_secret_name(name), name


def test_tool_declarations_are_checked():
    with pytest.raises(ConfigurationError, match="not a parameter"):
        @tool(sensitive=("nope",))
        def f(a: str) -> str:
            """F."""
            return a

    with pytest.raises(ConfigurationError, match="risk"):
        @tool(risk="extreme")
        def g(a: str) -> str:
            """G."""
            return a

    @tool(access="read")
    def h(a: str) -> str:
        """H."""
        return a

    assert h.risk == "low" and h.describe()["risk"] == "low"


def test_policy_files_load_and_refuse_wrong_entries(tmp_path):
    good = tmp_path / "p.toml"
    good.write_text('default = "ask"\n[tools]\n"db_*" = "deny"\nread_file = "allow"\n[commands]\nallow = ["git *"]\n')
    policy = Policy.load(good)
    assert policy.tool_action("db_drop", "medium") == ("deny", "tools.db_*")
    assert policy.tool_action("read_file", "low") == ("allow", "tools.read_file")
    assert policy.tool_action("other", "low") == ("ask", "default")
    assert policy.commands.allow == ("git *",) and policy.loops.limit == 3

    bad = tmp_path / "bad.toml"
    bad.write_text('[tools]\nread_file = "maybe"\n')
    with pytest.raises(ConfigurationError, match="tools.read_file"):
        Policy.load(bad)
    with pytest.raises(ConfigurationError, match="cannot read"):
        Policy.load(tmp_path / "missing.toml")
    with pytest.raises(ConfigurationError):
        Policy.from_dict({"tools": {}, "surprise": 1})
