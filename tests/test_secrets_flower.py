"""No secret reaches Flower, the worker's log or the audit trail, while the model still reads what
it asked for (issue 10, build item 5).

A real worker (prefork, log at INFO captured from its stderr, so Celery's "received" and
"succeeded in" lines are there) and a real Flower run calls that read and echo secrets of each
shape: a ``.env`` read by ``read_file``, ``run_command`` printing it, a failing command quoting a
bearer token and passwords, tools whose failures quote arguments named ``pass``/``password``/
``token``, a tool raising an exception that quotes its password, a tool returning secrets as
data, and a malformed task whose validation error quotes its arguments. Then Flower's
``/api/tasks`` and ``/api/task/info/<id>``, the task events, the worker's log and the turn's audit
stream must hold none of the secrets, and the results the dispatcher hands the model must hold the
file's real content.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import redis

from toolfleet import Dispatcher, ToolCall, default_registry
from toolfleet.audit import AuditLog
from toolfleet.keys import Keys
from toolfleet.signing import sign
from toolfleet.worker.app import TASK_NAME

from .conftest import FLEET_KEY, READY_TIMEOUT_S, ROOT, TEST_TOOLS
from .test_audit import Flower, TaskEvents

WAIT_S = 60
TOOLS = [TEST_TOOLS, "tests.secret_tools"]
ENV_SECRETS = {
    "OPENAI_API_KEY": "sk-proj-Q7wErTy12UiOp34AsDfGh56JkL",
    "AWS_ACCESS_KEY_ID": "AKIAQWERTYUIOP123456",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzzSECRET1",
    "GITHUB_TOKEN": "ghp_Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Jh1Gf0Ed9Cb8",
    "SLACK_BOT_TOKEN": "xoxb-202611300001-QwErTyUiOpAs",
    "STRIPE_SECRET_KEY": "sk_live_51HqWeRtYuIoPaSdFgHjKl",
    "GOOGLE_API_KEY": "AIzaSyB-1234567890abcdefghijklmnopqrs",
    "SESSION_JWT": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLXNlY3JldA",
    "PGPASSWORD": "PgPw-5531",
}
URL_SECRETS = {"DATABASE_URL": ("postgres://app:{}@db:5432/app", "DbPassw0rd-77"),
               "REDIS_URL": ("redis://:{}@cache:6379/0", "RedisPw-8812")}
PEM_BODY = "MIIEowIBAAKCAQEAkEyBodyOfThePrivateKey"
ENV_FILE = "\n".join([f"{k}={v}" for k, v in ENV_SECRETS.items()]
                     + [f"{k}={url.format(pw)}" for k, (url, pw) in URL_SECRETS.items()]
                     + ["-----BEGIN RSA PRIVATE KEY-----", PEM_BODY, "-----END RSA PRIVATE KEY-----", ""])
COMMAND_SECRETS = ["CmdPw-4410", "BearerTok-99017", "CurlPw-3321", "RedisCli-2209", "MyPw-7781", "PgCmd-6652",
                   "AwsCmdSecret/55Kq", "EchoPw-1187"]
FAILING_COMMAND = ("curl -sS -m 1 -H 'Authorization: Bearer BearerTok-99017' -u alice:CurlPw-3321 http://127.0.0.1:9/"
                   " || mysql -u root -pMyPw-7781 -h db || PGPASSWORD=PgCmd-6652 psql redis://:RedisCli-2209@cache"
                   " --password=CmdPw-4410 || aws configure set aws_secret_access_key AwsCmdSecret/55Kq; false")
ARGUMENT_SECRETS = {"pass": "PlainPass-6620", "password": "PlainPassword-1204", "token": "PlainToken-5519"}
OTHER_SECRETS = ["DsnPw-3390", "OpenDbPw-8830", "ShowKey-9921", "ShowBearer-4471", "Malformed-Pw-6021",
                 "MalformedBearer-77xy"]
SECRETS = ([*ENV_SECRETS.values(), *(pw for _, pw in URL_SECRETS.values()), PEM_BODY, *COMMAND_SECRETS,
            *ARGUMENT_SECRETS.values(), *OTHER_SECRETS, FLEET_KEY])  # the fleet key has no shape: known


def call(cid: str, name: str, index: int, **arguments) -> ToolCall:
    return ToolCall(id=cid, name=name, arguments=json.dumps(arguments), index=index)


class LoggedWorker:
    """A ``toolfleet worker`` at log level INFO with its stderr and stdout in a file."""

    def __init__(self, settings, tmp_path) -> None:
        self.settings = settings
        self.log_path = tmp_path / "worker.log"
        self.log = open(self.log_path, "wb")
        env = dict(os.environ, PYTHONPATH=str(ROOT), TOOLFLEET_NAMESPACE=settings.namespace)
        env.pop("REDIS_URL", None)
        env.pop("TOOLFLEET_BROKER_URL", None)
        argv = [sys.executable, "-m", "toolfleet", "worker", "--redis-url", settings.redis_url, "--namespace",
                settings.namespace, "--concurrency", "2", "--hostname", f"secrets@{settings.namespace}",
                "--loglevel", "INFO"]
        for module in TOOLS:
            argv += ["--tools", module]
        if settings.broker_url:
            argv += ["--broker-url", settings.broker_url]
        self.proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        client = redis.Redis.from_url(settings.redis_url, socket_timeout=READY_TIMEOUT_S + 5)
        ready = client.blpop([Keys(settings.namespace).workers_ready], timeout=READY_TIMEOUT_S)
        if ready is None:
            self.stop()
            raise RuntimeError(f"the worker did not start; its log:\n{self.log_path.read_text()}")

    def stop(self) -> str:
        """Warm shutdown, joined (so every log line is written); returns the whole log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        return self.log_path.read_text(errors="replace")


def flower_get(flower: Flower, path: str) -> dict:
    with urllib.request.urlopen(f"{flower.url}{path}", timeout=5) as reply:
        return json.load(reply)


def wait_in_flower(flower: Flower, states: dict[str, str], timeout_s: float = 30) -> dict:
    """Flower learns of tasks from worker events, asynchronously, and offers nothing to join on:
    look until each task shows its final state (as tests/test_audit.py does)."""
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = flower.tasks()
        if all(tasks.get(t, {}).get("state") == s for t, s in states.items()) or time.monotonic() > deadline:
            return tasks
        time.sleep(0.2)


def leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def test_no_secret_in_flower_worker_log_or_audit(settings, tmp_path, workspace):
    (workspace / ".env").write_text(ENV_FILE)
    flower = Flower(settings, tmp_path)
    worker = LoggedWorker(settings, tmp_path)
    stopped = False
    try:
        calls = [
            call("env", "read_file", 0, path=".env"),
            call("echo", "run_command", 1, command="cat .env && echo 'mysql -u root -pEchoPw-1187'"),
            call("fail", "run_command", 2, command=FAILING_COMMAND),
            call("login", "log_in", 3, user="alice", **ARGUMENT_SECRETS),
            call("db", "open_db", 4, dsn="mysql://root:DsnPw-3390@db/app", password="OpenDbPw-8830"),
            call("show", "show_config", 5, text="api_key: ShowKey-9921\nAuthorization: Bearer ShowBearer-4471"),
            call("key", "run_command", 6, command=f"echo {FLEET_KEY} > fleet.txt"),  # a model handling the key
        ]
        with Dispatcher(settings, default_registry(TOOLS)) as d, TaskEvents(d.app) as events:
            warm = d.submit([call("warm", "read_file", 0, path="README.md")], workspace=str(workspace))
            warm.results(WAIT_S)
            assert f"{warm.turn_id}:warm" in wait_in_flower(flower, {f"{warm.turn_id}:warm": "SUCCESS"}), \
                "flower saw no task"
            turn = d.submit(calls, workspace=str(workspace))
            results = {r.call_id: r for r in turn.results(WAIT_S)}
            # a task whose envelope does not validate: the error quotes its arguments (signed with
            # the fleet key, so it passes the signature check and fails in the task: docs/signing.md)
            malformed = f"{settings.namespace}-malformed"
            queue = Keys(settings.namespace).queue(d.registry.get("read_file").queue)
            bad = {"turn_id": "t",
                   "arguments": {"password": "Malformed-Pw-6021", "note": "Bearer MalformedBearer-77xy"},
                   "key_id": settings.fleet_keys.current_id, "expires_at": time.time() + 600}
            bad["signature"] = sign(settings.fleet_keys, task=TASK_NAME, task_id=malformed, queue=queue,
                                    limits=[None, None], envelope=bad)
            d.app.send_task(TASK_NAME, task_id=malformed, queue=queue, kwargs={"envelope": bad},
                            kwargsrepr="{'envelope': '(malformed on purpose)'}", argsrepr="()", ignore_result=True)
            # an error result is a failed task (issue 15, point 5: worker/task_states.py)
            task_ids = {f"{turn.turn_id}:{c.id}": "SUCCESS" if results[c.id].ok else "FAILURE" for c in calls} \
                | {malformed: "FAILURE"}

            def all_in(seen) -> bool:
                return {(t, "task-succeeded" if s == "SUCCESS" else "task-failed") for t, s in task_ids.items()} \
                    <= {(e.get("uuid"), e.get("type")) for e in seen}

            assert events.wait_for(all_in, WAIT_S), "the workers' task events did not arrive"
            in_events = json.dumps([e for e in events.events if e.get("uuid") in task_ids])
        tasks = wait_in_flower(flower, task_ids)
        infos = {tid: flower_get(flower, f"/api/task/info/{tid}") for tid in task_ids}
        log = worker.stop()
        stopped = True
    finally:
        if not stopped:
            worker.stop()
        flower.stop()

    # the model reads what it asked for: the ledger has the file and the command's output as they are
    assert results["env"].ok and results["env"].content.count("=") >= len(ENV_SECRETS)
    assert ENV_SECRETS["OPENAI_API_KEY"] in results["env"].content and PEM_BODY in results["env"].content
    assert results["echo"].ok and "EchoPw-1187" in results["echo"].content
    assert results["show"].ok and results["show"].data == {"config": "api_key: ShowKey-9921\n"
                                                           "Authorization: Bearer ShowBearer-4471"}
    # ...but an error message never quotes a secret, in the ledger either
    for cid in ("fail", "login", "db"):
        error = results[cid].error
        assert error is not None and not leaks(error.message + error.hint), (cid, error)
    assert "-u alice:*** http://127.0.0.1:9/ || mysql -u root -p*** -h db || PGPASSWORD=*** psql " \
           "redis://:***@cache --password=*** || aws configure set aws_secret_access_key ***" \
           in results["fail"].error.message
    assert "Authorization: Bearer ***" in results["fail"].error.message
    assert results["db"].error.message.startswith("RuntimeError: could not connect to mysql://root:***@db/app")

    # Flower: the task list and each task's page
    for tid, state in task_ids.items():
        assert tasks.get(tid, {}).get("state") == state, (tid, tasks.get(tid))
    assert not leaks(json.dumps(tasks)), leaks(json.dumps(tasks))
    for tid, info in infos.items():
        assert not leaks(json.dumps(info)), (tid, leaks(json.dumps(info)))
    env_info = infos[f"{turn.turn_id}:env"]
    assert json.loads(env_info["result"].replace("'", '"').replace("None", "null").replace("False", "false")) == {
        "status": "ok", "code": None, "content_chars": len(results["env"].content), "data": False}
    assert "CallFailed('EXECUTION_ERROR" in infos[f"{turn.turn_id}:fail"]["exception"]
    assert {tid for tid, s in task_ids.items() if s == "FAILURE"} == {
        f"{turn.turn_id}:fail", f"{turn.turn_id}:login", f"{turn.turn_id}:db", malformed}
    assert "'data': True" in infos[f"{turn.turn_id}:show"]["result"]
    assert "***" in infos[f"{turn.turn_id}:login"]["kwargs"] and "alice" in infos[f"{turn.turn_id}:login"]["kwargs"]
    failure = infos[malformed]["exception"]
    assert "CallTaskError" in failure and "call_id: Field required" in failure

    # the task events Flower is built from
    assert not leaks(in_events), leaks(in_events)

    # the worker's log, with Celery's own lines at INFO
    assert f"{turn.turn_id}:env] received" in log and f"{turn.turn_id}:env] succeeded in" in log, log[-3000:]
    assert "CallTaskError" in log
    assert "open_db: connecting to mysql://root:***@db/app" in log  # a tool's own log line, redacted
    assert not leaks(log), leaks(log)

    # the audit trail, as read (its started / finished entries come from the event stream) and as stored
    trail = AuditLog(redis.Redis.from_url(settings.redis_url), Keys(settings.namespace), 60).read(turn.turn_id)
    read = json.dumps([[event.type, event.call_id, event.data] for event in trail])
    assert '"finished"' in read and "***" in read
    assert not leaks(read), leaks(read)
    client = redis.Redis.from_url(settings.redis_url)
    raw = json.dumps([[k.decode(), v.decode()] for _id, fields in
                      client.xrange(Keys(settings.namespace).turn_audit(turn.turn_id)) for k, v in fields.items()])
    assert "***" in raw
    assert not leaks(raw), leaks(raw)
