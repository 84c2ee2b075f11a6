"""Secret shapes are masked where they stand, the text around them kept; redaction never raises.

Pure functions (no services). The property tests plant a secret of each shape among ordinary
words and check: the secret is gone, every other character is where it was, ordinary text is
left alone, and no nested value or text makes redaction raise or take long.
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfleet import ToolResult
from toolfleet.models import ErrorCode
from toolfleet.tools.redact import (
    MASK,
    TOO_DEEP,
    is_secret_name,
    redact_arguments,
    redact_text,
    redact_value,
    secret_values,
    show_given,
)
from toolfleet.worker.redaction import mask_known_secrets, redacted_failure, task_summary

# (text, what it must become): the value goes, every other character stays
EXACT = [
    ("mysql --password=hunter2x -u root", "mysql --password=*** -u root"),
    ("mysql --password hunter2 -u root", "mysql --password *** -u root"),
    ("redis-cli -u redis://:S3cretPw@cache:6379/0 ping", "redis-cli -u redis://:***@cache:6379/0 ping"),
    ("git clone https://bob:hunter22@github.com/x/y", "git clone https://bob:***@github.com/x/y"),
    ("PGPASSWORD=pa55 psql -h db", "PGPASSWORD=*** psql -h db"),
    ("mysql -u root -pS3cr3t shop", "mysql -u root -p*** shop"),
    ("mysql -u root -p shop", "mysql -u root -p shop"),  # -p alone prompts; "shop" is the database
    ("aws configure set aws_secret_access_key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
     "aws configure set aws_secret_access_key ***"),
    ("pass=hunter2 --pass hunter3 -storepass changeit", "pass=*** --pass *** -storepass ***"),
    ('curl -H "Authorization: Bearer abc.def.ghi" https://api', 'curl -H "Authorization: Bearer ***" https://api'),
    ("curl -H 'Authorization: Basic dXNlcjpwYXNz' https://x", "curl -H 'Authorization: Basic ***' https://x"),
    ("curl -H 'Cookie: session=abc123; theme=dark' https://x", "curl -H 'Cookie: session=***; theme=***' https://x"),
    ("curl -H 'x-api-key: abcd1234' 'https://x/v1?access_token=zz9&page=2'",
     "curl -H 'x-api-key: ***' 'https://x/v1?access_token=***&page=2'"),
    ("curl -u alice:wonderland https://x", "curl -u alice:*** https://x"),
    ("sshpass -p 'pw with space' ssh host", "sshpass -p '***' ssh host"),
    ("SSHPASS=Zq9pLm2xWv sshpass -e ssh host", "SSHPASS=*** sshpass -e ssh host"),
    ("az login --service-principal -u app -p Zq9pLm2xWv --tenant t",
     "az login --service-principal -u app -p *** --tenant t"),
    ("redis-cli -a s3cret ping", "redis-cli -a *** ping"),
    ("echo Zq9pLm2x | docker login -u bob --password-stdin reg.io",
     "echo *** | docker login -u bob --password-stdin reg.io"),
    ("echo 'my pass' | sudo -S apt-get update", "echo '***' | sudo -S apt-get update"),
    ("echo pw9 | sudo sudo -k -S id", "echo *** | sudo sudo -k -S id"),
    ('echo "pw9 | sudo -S id', 'echo "***| sudo -S id'),  # an unclosed quote: its value up to the pipe
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIb\n  -----END RSA PRIVATE KEY-----",
     "-----BEGIN RSA PRIVATE KEY-----\n***\n  -----END RSA PRIVATE KEY-----"),
    ("echo pw9 | sudo id; sudo -S id", "echo pw9 | sudo id; sudo -S id"),  # -S is another command's
    ("mysql -pA1 -h db -pB2 -pC3 -pD4 -pE5 -pF6 -pG7 -pH8 -pI9 -pJ0 shop",
     "mysql -p*** -h db -p*** -p*** -p*** -p*** -p*** -p*** -p*** -p*** -p*** shop"),  # every repeat, not 8
    ("mysql -p'a;b' shop && mysql -pX2", "mysql -p'***' shop && mysql -p***"),
    ('redis-cli -a "x;y" -a Hunter22', 'redis-cli -a "***" -a ***'),  # the command goes on after "x;y"
    ('mysql -e "select 1; select 2" -pX2z shop', 'mysql -e "select 1; select 2" -p*** shop'),  # a breaker's
    ("echo pw9 | sudo -kS id", "echo *** | sudo -kS id"),  # finds, missed before too
    ("echo pw9 | sudo --stdin id", "echo *** | sudo --stdin id"),
    ("echo pw9 | sudo -k id; x -S", "echo pw9 | sudo -k id; x -S"),
    ('docker login -p "a|b" -p Hunter22 r.io', 'docker login -p "***" -p *** r.io'),
    ("printf '%s\\n' hunter2 | podman login --password-stdin -u me q.io",
     "printf '%s\\n' *** | podman login --password-stdin -u me q.io"),
    ("echo -n \"bob:Zq9pLm\" | chpasswd", "echo -n \"***\" | chpasswd"),
    ("echo s3cret | passwd --stdin bob", "echo *** | passwd --stdin bob"),
    ("openssl rsa -passin pass:mypass -in k.pem", "openssl rsa -passin *** -in k.pem"),
    ("export SECRET_KEY=django-insecure-xyz", "export SECRET_KEY=***"),
    ('{"password": "s3 cret", "max_tokens": 1024}', '{"password": "***", "max_tokens": 1024}'),
    ("{'token': 'a b c', 'n': 1}", "{'token': '***', 'n': 1}"),
    ("STRIPE_KEY=rk_abc GITHUB_TOKEN=ghx APP_SECRET=foo sort_key=name",
     "STRIPE_KEY=*** GITHUB_TOKEN=*** APP_SECRET=*** sort_key=name"),
    ("OPENAI_API_KEY=sk-proj-abcdefghijklmnop1234", "OPENAI_API_KEY=***"),
    ("use sk-proj-abcdefghijklmnop1234 now", "use *** now"),
    ("aws AKIAABCDEFGHIJKLMNOP done", "aws *** done"),
    ("gh ghp_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa github_pat_11AAAAAAAAAAAAAAAAAAAAAAAAAAAA", "gh *** ***"),
    ("slack xoxb-123456789012-abcdefghij", "slack ***"),
    ("stripe sk_live_abcdefghijklmnop1234", "stripe ***"),
    ("google AIzaSyA1234567890abcdefghijklmnopqrstuv", "google ***"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "jwt ***"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nAAAA\n-----END RSA PRIVATE KEY-----",
     "-----BEGIN RSA PRIVATE KEY-----\n***\n-----END RSA PRIVATE KEY-----"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNz (truncated)", "-----BEGIN OPENSSH PRIVATE KEY-----\n***"),
    ("command exited with status 1: curl -H 'Authorization: Bearer tok123456' https://api",
     "command exited with status 1: curl -H 'Authorization: Bearer ***' https://api"),
    ('log {\\"password\\": \\"hunter2\\"}', 'log {\\"password\\": \\"***\\"}'),
    ("https://hooks.slack.com/services/T000/B000/XXXX", "https://hooks.slack.com/services/***"),
    ("https://acct.blob.core.windows.net/c/f?sv=2020&sig=abc%2Bdef&se=1", "https://acct.blob.core.windows.net/c/f?sv=2020&sig=***&se=1"),
    # well-known tools' secrets and credential shapes (a tester's list: each showed in Flower's task kwargs)
    ("vault login hvs.CAESIJk9Fh2LmQ7rTz0aB1k9Fh2Lm >/dev/null", "vault login *** >/dev/null"),
    ("hvb.AAAAAQJk9Fh2LmQ7rTz0aB1k9Fh2Lm and xapp-1-A0123-4567-abcdef", "*** and ***"),
    ("AGE-SECRET-KEY-1QYQSZQGPQYQSZQGPQYQSZQGP", "***"),
    ("sqlcmd -S db -U sa -P 'p@ss w' -Q 'select 1' || true", "sqlcmd -S db -U sa -P '***' -Q 'select 1' || true"),
    ("bcp t out f -S db -U sa -PHunter22", "bcp t out f -S db -U sa -P***"),
    ("htpasswd -b .htpasswd admin Hunter22 || true", "htpasswd -b .htpasswd admin *** || true"),
    ("htpasswd -B -b -c .htpasswd admin 'a b' > /dev/null", "htpasswd -B -b -c .htpasswd admin '***' > /dev/null"),
    ("htpasswd -nb admin Hunter22", "htpasswd -nb admin ***"),
    ("zip -P Hunter22 out.zip README.md && unzip -P Hunter22 out.zip",
     "zip -P *** out.zip README.md && unzip -P *** out.zip"),
    ("7z a -pHunter22 out.7z d", "7z a -p*** out.7z d"),
    ("openssl enc -aes256 -k Hunter22 -in f", "openssl enc -aes256 -k *** -in f"),
    ("openssl enc -aes256 -pass pass:Hunter22 -in f", "openssl enc -aes256 -pass *** -in f"),
    ("curl -H 'Ocp-Apim-Subscription-Key: k9Fh2' https://x", "curl -H 'Ocp-Apim-Subscription-Key: ***' https://x"),
    ("https://discord.com/api/webhooks/1234567/k9Fh-2_L/github", "https://discord.com/api/webhooks/1234567/***/github"),
    ("https://x.webhook.office.com/webhookb2/a@b/IncomingWebhook/0f1e/9c8d", "https://x.webhook.office.com/webhookb2/a@b/IncomingWebhook/***"),
    ("https://api.telegram.org/bot123456789:AAHk9Fh2LmQ7rTz0aB1k9Fh2/sendMessage",
     "https://api.telegram.org/bot123456789:***/sendMessage"),
    ("ssh-keygen -t ed25519 -N 'new pw' -f k && ssh-keygen -p -P Old1 -N New2 -f k",
     "ssh-keygen -t ed25519 -N '***' -f k && ssh-keygen -p -P *** -N *** -f k"),
    ("gh auth login --with-token <<< gho_abc123 && echo tok9 | gh auth login --with-token",
     "gh auth login --with-token <<< *** && echo *** | gh auth login --with-token"),
    ('docker login -u me --password-stdin <<< "p w" r.io', 'docker login -u me --password-stdin <<< "***" r.io'),
    ("sqlplus -s scott/Tiger1@orcl @x.sql", "sqlplus -s scott/***@orcl @x.sql"),
    ("lftp -u bob,Hunter22 ftp://h", "lftp -u bob,*** ftp://h"),
    # name/value pairs written out (HAR, Kubernetes env, a logged repr, requests' header tuples)
    ('{"name": "X-Api-Key", "value": "k9 Fh2"}, {"name": "Accept", "value": "text/html"}',
     '{"name": "X-Api-Key", "value": "***"}, {"name": "Accept", "value": "text/html"}'),
    ("env: [{'name': 'DB_PASSWORD', 'value': 'hunter2'}]", "env: [{'name': 'DB_PASSWORD', 'value': '***'}]"),
    ('{"key": "x-api-key", "value": "pm", "type": "text"}', '{"key": "x-api-key", "value": "***", "type": "text"}'),
    ("headers=[('X-Api-Key', 'abc123xyz'), ('Accept', 'json')]", "headers=[('X-Api-Key', '***'), ('Accept', 'json')]"),
]
ORDINARY = [
    "the token count is 5", "keyboard = 5", "passed: 10 tests", "max_tokens: 1024", "echo done", "--tokens 5000",
    "This is a basic introduction to Basic Authentication", "risk-assessment-document-2024",
    "password_file=/run/secrets/db", "token_count: 42", "cd $PWD && ls", "PWD=/home/me", "bypass=true",
    "commit 3f2a9c1d8e7b6a5f4c3d2e1f0a9b8c7d6e5f4a3b", "http://localhost:8080/health", "git@github.com:org/r.git",
    "password: is required", "sort_key=name", "the author: Jane", "echo hello | sudo tee /x",
    "echo done | cat", "root:x:0:0:root:/root:/bin/bash", "12:30:45 started", "a:b:c:d:e",
    # the .pgpass-line shape (host:port:db:user:password), dropped, masked these (a reviewer's find)
    "link/ether 02:42:ac:11:00:02", "fe80:0:0:0:200:f8ff:fe21:67cf", "src/app.py:12:3:error:unused",
    "10.0.0.1:5432:1:2:ready",
    '["token", "count"]', "columns=('password', 'email')", '{"name": "token_count", "value": "42"}',
    "ssh-keygen -t ed25519 -N '' -f k", "htpasswd -c .htpasswd admin", "htpasswd -v .htpasswd admin",
    "zip -r out.zip d && cp -P a.zip b", "7z a -p out.7z d", "git hash-object --stdin <<< hello",
    "sqlplus / as sysdba", "openssl req -new -key k.pem -keyout x", "https://example.com/api/webhooks/list",
    "gzip -k -P x", "sqlcmd -S db -E -Q 'select 1'",
]


@pytest.mark.parametrize(("text", "expected"), EXACT)
def test_each_shape_is_masked_and_the_text_around_it_kept(text, expected):
    assert redact_text(text) == expected


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_left_alone(text):
    assert redact_text(text) == text


def test_secret_names():
    for name in ("pass", "password", "PGPASSWORD", "MYSQL_PWD", "aws_secret_access_key", "apiKey", "X-Auth-Token",
                 "STRIPE_KEY", "client_secret", "csrftoken", "AccountKey", "storepass"):
        assert is_secret_name(name), name
    for name in ("max_tokens", "keyboard", "author", "bypass", "password_file", "PWD", "sort_key", "tokenizer",
                 "secretary", "passage", "path"):
        assert not is_secret_name(name), name


def test_arguments_named_pass_and_known_values_are_masked():
    shown = redact_arguments({"pass": "hunter2", "user": "bob", "opts": {"db_password": "x"}, "n": 3})
    assert shown == {"pass": MASK, "user": "bob", "opts": {"db_password": MASK}, "n": 3}
    known = secret_values({"pass": "hunter2", "cfg": {"token": "tok-999"}, "path": "a.txt", "pin": "4321"},
                          sensitive=("pin",))
    assert known == {"hunter2", "tok-999", "4321"}
    assert redact_text("login as bob with hunter2 failed", known) == f"login as bob with {MASK} failed"


def test_error_results_mask_quoted_secrets_but_keep_the_output():
    failed = ToolResult.failure("c1", "run_command", ErrorCode.EXECUTION_ERROR,
                                "command exited with status 1: curl -H 'Authorization: Bearer tok123456' -u a:pw9",
                                "check --password=zz9", output="curl: (6) token tok123456 printed by the tool")
    assert "tok123456" not in failed.error.message and "zz9" not in failed.error.hint
    assert "Authorization: Bearer ***" in failed.content and "printed by the tool" in failed.content
    assert failed.content.endswith("token tok123456 printed by the tool")  # the tool's output: the model's
    quoted = ToolResult.failure("c2", "login", ErrorCode.EXECUTION_ERROR, "no user with password plainword", "")
    masked = mask_known_secrets(quoted, {"pass": "plainword"})
    assert masked.error.message == "no user with password ***" and "plainword" not in masked.content
    ok = ToolResult(call_id="c3", name="read_file", status="ok", content="PASSWORD=plainword")
    assert mask_known_secrets(ok, {"pass": "plainword"}) is ok


def test_task_summary_and_failures_carry_no_content():
    result = ToolResult(call_id="c", name="read_file", status="ok", content="OPENAI_API_KEY=sk-proj-" + "a" * 30)
    assert task_summary(result) == {"status": "ok", "code": None, "content_chars": len(result.content), "data": False}
    try:
        raise ValueError("could not parse {'password': 'hunter2'}")
    except ValueError as exc:
        raised = redacted_failure(exc)
    assert "hunter2" not in str(raised) and "ValueError" in str(raised) and "test_secret_shapes.py" in str(raised)


# ---- property tests ----

CRED = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.!@#%^+=~", min_size=3, max_size=40)
B64 = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", min_size=8, max_size=40)
URLSAFE = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-", min_size=8, max_size=40)


def _fixed(prefix: str, alphabet: str, size: int, suffix: str = ""):
    return st.text(alphabet, min_size=size, max_size=size + 8).map(lambda s: prefix + s + suffix)


UPPER_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
# (template with {s} where the secret goes, strategy of secrets); the expected text is the template with ***
PLANTED = [
    ("mysql --password={s} -u root", CRED),
    ("mysql --password {s} -u root", CRED.filter(lambda s: not s.startswith("-"))),
    ("redis://:{s}@cache:6379/0", CRED.filter(lambda s: "@" not in s and "#" not in s)),
    ("https://alice:{s}@example.com/x", CRED.filter(lambda s: "@" not in s and "#" not in s)),
    ("PGPASSWORD={s} psql -h db", CRED),
    ("mysql -u root -p{s} shop", CRED),
    ("aws configure set aws_secret_access_key {s}", B64.map(lambda s: s + "/9K")),
    ('curl -H "Authorization: Bearer {s}" https://api', URLSAFE),
    ('curl -H "Authorization: Basic {s}" https://api', B64.map(lambda s: s + "=")),
    ("curl -H 'x-api-key: {s}' https://api", CRED),
    ("https://api.example.com/v1?access_token={s}&page=2", CRED),
    ("export SECRET_KEY={s}", CRED),
    ("GITHUB_TOKEN={s}", CRED),
    ("STRIPE_KEY={s}", CRED),
    ('{{"password": "{s}"}}', st.text(ALNUM + " !#$%&'()*+,-./:;<=>?@[]^_`{|}~", min_size=1, max_size=30)),
    ("redis-cli -a {s} ping", CRED.filter(lambda s: not s.startswith("-"))),
    ("sqlcmd -S db -U sa -P {s} -Q q", CRED.filter(lambda s: not s.startswith("-"))),
    ("zip -P {s} out.zip f", CRED.filter(lambda s: not s.startswith("-"))),
    ("ssh-keygen -N {s} -f k", CRED.filter(lambda s: not s.startswith("-"))),
    ("htpasswd -b f admin {s}", CRED.filter(lambda s: not s.startswith("-"))),
    ("curl -d x https://discord.com/api/webhooks/987654/{s}", URLSAFE),
    ("{s}", _fixed("hvs.", ALNUM + "_-", 24)),
    ("curl -u alice:{s} https://x", CRED),
    ("{s}", _fixed("sk-proj-", ALNUM + "_-", 20)),
    ("{s}", _fixed("AKIA", UPPER_DIGITS, 16).map(lambda s: s[:20])),
    ("{s}", _fixed("ghp_", ALNUM, 36)),
    ("{s}", _fixed("github_pat_", ALNUM + "_", 22)),
    ("{s}", _fixed("xoxb-", ALNUM + "-", 12)),
    ("{s}", _fixed("sk_live_", ALNUM, 24)),
    ("{s}", _fixed("AIza", ALNUM + "_-", 35).map(lambda s: s[:39])),
    ("{s}", st.tuples(URLSAFE, URLSAFE, URLSAFE).map(lambda t: f"eyJ{t[0]}.eyJ{t[1]}.{t[2]}")),
    ("-----BEGIN RSA PRIVATE KEY-----\n{s}\n-----END RSA PRIVATE KEY-----", B64),
]
WORDS = ["the", "build", "passed", "10", "tests", "max_tokens=1024", "keyboard", "author:", "tokens", "bypass",
         "compass", "src/app.py", "https://example.com/docs?page=2&sort=name", "user@example.com", "monkey",
         "http://localhost:8080/health", "sort_key=name", "passage", "--tokens", "5000", "token_count: 42",
         "ERROR:", "exit", "status", "$HOME", "a=b", "x: y", "introduction", "3f2a9c1d8e7b6a5f4c3d2e1f0a9b8c7d",
         "tokenizer", "secretary", "é", "日本", "{", "}", "[1, 2]", "'quoted'", '"double"', "-v", "--verbose"]
ORDINARY_TEXT = st.lists(st.sampled_from(WORDS), max_size=12).map(" ".join)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.data(), ORDINARY_TEXT, ORDINARY_TEXT, st.sampled_from(range(len(PLANTED))))
def test_every_planted_secret_is_masked_and_nothing_else_changes(data, before, after, which):
    template, secrets = PLANTED[which]
    secret = data.draw(secrets)
    text = f"{before}\n{template.format(s=secret)}\n{after}"
    assert redact_text(text) == f"{before}\n{template.format(s=MASK)}\n{after}"


@FAST
@given(ORDINARY_TEXT)
def test_ordinary_words_are_never_changed(text):
    assert redact_text(text) == text


@FAST
@given(st.text(max_size=400))
def test_any_text_never_raises(text):
    assert isinstance(redact_text(text), str)


@FAST
@given(JSON, st.sampled_from(range(len(PLANTED))), st.data())
def test_any_json_never_raises_and_planted_secrets_vanish(value, which, data):
    template, secrets = PLANTED[which]
    secret = data.draw(secrets)
    planted = {"outer": [value, {"note": template.format(s=secret)}], "pass": secret}
    shown = redact_value(planted)
    dumped = json.dumps(shown)
    assert json.dumps(template.format(s=MASK))[1:-1] in dumped  # masked where it was planted, the rest kept
    assert shown["pass"] == MASK
    assert isinstance(show_given(value), str) and isinstance(redact_arguments({"v": value}), dict)


@pytest.mark.parametrize("depth", [900, 5000, 100_000])
def test_deep_nesting_never_raises(depth):
    value: object = "sk-proj-" + "z" * 30
    for i in range(depth):
        value = [value] if i % 2 else {"input": value}
    shown = redact_value(value)
    text = json.dumps(shown)
    assert TOO_DEEP in text and "zzzz" not in text
    assert show_given(value).startswith(("{", "["))
    assert redact_arguments({"input": value})["input"] != value
    assert secret_values({"password": value}) == set()  # too deep to look at: nothing to mask, nothing raised


@pytest.mark.parametrize("text", [
    "a" * 200_000, "key" * 70_000, "mysql " + " -p" * 60_000, "://" * 60_000, "a.b-" * 50_000,
    "password " * 20_000, '"password": "' + "x" * 200_000, "-----BEGIN RSA PRIVATE KEY-----" * 5_000,
    "x=" * 100_000, "curl " + "-u a:" * 40_000, "eyJ" + "a" * 100_000 + ".", "Authorization: " * 20_000,
    # a program's name repeated in one command with no option after it: each name once searched the
    # rest of the command (quadratic; 25 KB took 0.7 s, these would take minutes)
    "mysql " * 60_000, "sshpass " * 50_000, "docker login " * 30_000, "redis-cli " * 40_000,
    "ldapsearch " * 40_000, "smbclient " * 40_000, "echo a |" + " sudo" * 80_000, "echo a | passwd" + " x" * 80_000,
    # a secret name repeated inside its own value: each name once scanned the rest of the line
    "password=" * 40_000, "token:" * 60_000, '"secret": "' * 30_000,
    # a name that is no secret's read its whole would-be value, for every name inside it
    "key=" * 50_000, "-key=" * 40_000,
    # a look-ahead tried again at every character of a run of white space
    "-----BEGIN RSA PRIVATE KEY-----\nx" + " " * 200_000, 'echo "' + " " * 200_000 + " sudo",
    "echo '" + "\t" * 200_000 + " sudo", ".-" * 100_000 + " pass",
])
def test_adversarial_text_is_redacted_quickly(text):
    started = time.monotonic()
    redact_text(text)
    assert time.monotonic() - started < 3.0


@pytest.mark.parametrize("depth", [900, 5000, 100_000])
def test_deeply_nested_arguments_are_invalid_not_a_crash(depth):
    from toolfleet import ToolCall, default_registry
    from toolfleet.tools.validation import check_call

    registry = default_registry()
    value: object = "x"
    for _ in range(depth):
        value = [value]
    for arguments in ({"path": value}, '{"path": ' + "[" * depth + "]" * depth + "}"):
        result = check_call(registry, ToolCall(id="deep", name="read_file", arguments=arguments))
        assert result is not None and result.code == ErrorCode.INVALID_ARGUMENT
        assert "nested more than 100 levels deep" in result.error.message


def test_worker_log_records_and_unrunnable_message_bodies_are_redacted():
    script = """
import logging, sys
from toolfleet.worker.redaction import install_log_redaction
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
install_log_redaction()
log = logging.getLogger("t")
log.info("connecting with %s", "--password=hunter2x")
try:
    raise ValueError("token=abc123secret")
except ValueError:
    log.exception("failed for %(who)s", {"who": "redis://:pw9secret@cache"})
log.info("bad format %s %s", "only one")
from celery.worker.consumer import consumer
class Message:
    body = b'{"password": "bodysecret"}'
print(consumer.dump_body(Message, Message.body))
"""
    import subprocess
    import sys

    from .conftest import ROOT

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    for secret in ("hunter2x", "abc123secret", "pw9secret", "bodysecret"):
        assert secret not in out.stdout + out.stderr, out.stdout
    assert "connecting with --password=***" in out.stdout and "redis://:***@cache" in out.stdout
    assert "token=***" in out.stdout and "could not be formatted" in out.stdout
    assert "<message body of 26 bytes: not shown>" in out.stdout


def test_the_process_own_secrets_are_masked_whatever_their_shape(monkeypatch):
    """A fleet key is 43 random characters, no shape to recognise: the process's own secrets (its
    fleet keys, the passwords of its Redis URLs) are masked in every shown text (found by a helper:
    ``echo <key> > k`` showed the key in Flower's arguments)."""
    from toolfleet.settings import Settings
    from toolfleet.tools import redact

    key = "q8ZyP0eiVVteuJyFDNb5RVKPisd2z9b4Q_OUkO5-NVc"
    settings = Settings(redis_url="redis://app:R3dis%2Fpw-1234@db:6379/0", fleet_key=key,
                        broker_url="amqp://guest:guest@mq:5672//")
    assert settings.secret_values() == (key, "R3dis/pw-1234", "guest")
    monkeypatch.setattr(redact, "_OWN", ())
    redact.register_own_secrets(settings.secret_values())
    assert redact._OWN == (key, "R3dis/pw-1234")  # "guest" is too short to mask everywhere
    assert redact_text(f"echo {key} > k") == "echo *** > k"
    assert redact_arguments({"text": "the pass phrase is R3dis/pw-1234, see"}) == {
        "text": "the pass phrase is ***, see"}
    assert redact_text("echo guest") == "echo guest"

