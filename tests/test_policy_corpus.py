"""The command corpus (tests/command_corpus.py) through the policy engine, and properties of the
checker over random command text: it never raises, always decides, and never allows what it does
not model. Pure functions: no services needed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfleet.policy import Policy, evaluate
from toolfleet.tools.command import run_command

from .command_corpus import CORPUS, CORPUS_POLICY

POLICY = Policy.from_dict(CORPUS_POLICY)
ACTIONS = {"allow", "ask", "deny"}


def _worked_example() -> Policy:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "policy.md").read_text()
    example = doc[doc.index("## Worked example"):]
    toml = example[example.index("```toml") + len("```toml"):]
    import tomllib

    return Policy.from_dict(tomllib.loads(toml[: toml.index("```")]))


WORKED_EXAMPLE = _worked_example()


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    base = tmp_path_factory.mktemp("corpus")
    workspace, out = base / "ws", base / "out"
    (workspace / "sub").mkdir(parents=True)
    out.mkdir()
    return str(workspace), str(out)


def _verdict(policy: Policy, command: str, workspace: str):
    return evaluate(policy, run_command, {"command": command}, workspace=workspace)


@pytest.mark.parametrize("case", CORPUS, ids=[f"{case.kind}-{i}" for i, case in enumerate(CORPUS)])
def test_corpus_verdict(case, places):
    workspace, out = places
    command = case.command.replace("{OUT}", out)
    verdict = _verdict(POLICY, command, workspace)
    assert verdict.action == case.verdict, f"{command!r}: {verdict}"
    # the stricter worked example of docs/policy.md never allows what CORPUS_POLICY does not
    if case.verdict != "allow":
        assert _verdict(WORKED_EXAMPLE, command, workspace).action != "allow", command


def test_corpus_is_large_and_covers_every_kind():
    kinds = {case.kind for case in CORPUS}
    assert len(CORPUS) >= 120
    assert {"shell-options", "env-split", "glob-name", "unknown-wrapper", "trap-alias", "script-to-shell",
            "target-directory", "brace-path", "chmod-reference", "cd-tracking", "symlink-same-command"} <= kinds
    assert {case.verdict for case in CORPUS} == ACTIONS
    assert sum(case.verdict == "allow" for case in CORPUS) >= 40
    assert len({case.command for case in CORPUS}) == len(CORPUS)


def test_every_case_is_finite_and_local():
    """The sandbox runs every case for real: no network, no long sleep, no endless loop."""
    for case in CORPUS:
        assert "http" not in case.command and "sleep 1" not in case.command, case
        assert "while" not in case.command and "until" not in case.command, case


# ---- properties over random command text ----

SAFE = ["ls", "ls -la", "cat README.md", "grep -n x f", "echo hi", "git status", "wc -l f", "echo x > in.txt",
        "mkdir -p b", "touch b/a", "cat <<'EOF'\nx\nEOF\ntrue", "head -3 f", "true"]
# constructs the policy does not model: a command holding one is never allowed
UNMODELED = ["eval ls", "source s.sh", ". ./s.sh", "exec ls", "xargs ls", "find . -exec ls {} +",
             "python3 -c 'print(1)'", "perl -e 1", "node -e 1", "ruby -e 1", "flock f ls", "taskset 1 ls",
             "script -qc ls /dev/null", "f() { ls; }", "trap 'ls' EXIT", "alias l=ls", "shopt -s expand_aliases",
             'bash -c "$X"', "bash s.sh", "echo ls | bash", "sh <<<ls", "$X", "$(echo ls) x", "`echo ls`",
             "/bin/l? x", "{ls,x}", "env -S 'ls x'", "PATH=. ls", "parallel ls ::: a", "bash -i",
             "awk 'BEGIN{system(\"ls\")}'", "echo x | python3", "git -c core.pager=x log", "ln -s /x l && touch l/f",
             "cp -t /x a", "touch {/x/y,z}", "echo x > /x/y", "touch ../f"]
OPERATORS = ["; ", " && ", " || ", " | ", "\n"]


@st.composite
def commands(draw, pool):
    parts = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))
    text = parts[0]
    for part in parts[1:]:
        text += draw(st.sampled_from(OPERATORS)) + part
    wrap = draw(st.sampled_from(["{}", "( {} )", "{{ {}; }}", "if true; then {}; fi", "bash -c '{}'"]))
    if wrap == "bash -c '{}'" and "'" in text:
        wrap = "{}"
    return wrap.format(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=80))
def test_any_text_gets_a_verdict(places, text):
    verdict = _verdict(POLICY, text, places[0])
    assert verdict.action in ACTIONS and verdict.reason


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet="abcdehlmnrstx -'\"$(){};|&<>`\\*?[]~=./\n#!0123", max_size=60))
def test_shell_shaped_text_gets_a_verdict(places, text):
    verdict = _verdict(POLICY, text, places[0])
    assert verdict.action in ACTIONS and verdict.reason


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_command_holding_an_unmodeled_construct_is_never_allowed(places, data):
    safe = data.draw(commands(SAFE))
    construct = data.draw(st.sampled_from(UNMODELED))
    joiner = data.draw(st.sampled_from(OPERATORS))
    text = data.draw(st.sampled_from([f"{safe}{joiner}{construct}", f"{construct}{joiner}{safe}"]))
    verdict = _verdict(POLICY, text, places[0])
    assert verdict.action != "allow", (text, verdict)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(commands(SAFE))
def test_commands_made_of_modelled_parts_are_allowed(places, text):
    """The other side: fail closed must not mean refuse everything."""
    verdict = _verdict(POLICY, text, places[0])
    assert verdict.action == "allow", (text, verdict)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted({"eval", "source", ".", "exec", "xargs", "trap", "alias", "flock", "taskset", "script",
                               "parallel", "python3", "perl", "node", "ruby", "busybox", "unshare"})),
       st.lists(st.sampled_from(["-c", "-e", "x", "'ls'", "-", "--", "1", "f.sh"]), min_size=1, max_size=4))
def test_a_command_run_by_an_unmodeled_runner_is_never_allowed(places, runner, args):
    text = " ".join([runner, *args])
    if runner in ("python3", "perl", "node", "ruby") and args[:1] and args[0] not in ("-c", "-e", "-"):
        return  # `python3 x` runs a file: decided by the patterns (docs/policy.md)
    if runner == "perl" and "-e" not in args:
        return  # `perl -c x` checks the file x: a file, decided by the patterns
    if runner == "exec" and all(arg.startswith("-") for arg in args):
        return  # `exec -c`, `exec --` run nothing
    verdict = _verdict(POLICY, text, places[0])
    assert verdict.action != "allow", (text, verdict)


def test_a_parameter_without_its_brace_is_refused_not_a_hang(places):
    """bashlex 0.18 looped forever on these (found by fuzzing): now a parse error, refused."""
    for text in ["'${'m<}", "'b${'!m<}lla/n[td", "echo '${'x<}"]:
        verdict = _verdict(POLICY, text, places[0])
        assert verdict.action == "deny" and "parsed" in verdict.reason, text


def test_a_nul_byte_is_refused_not_a_crash(places):
    verdict = _verdict(POLICY, "echo x >\x00", places[0])
    assert verdict.action == "deny" and "NUL" in verdict.reason


def test_the_sandbox_not_the_policy_is_the_boundary_for_unknown_programs(places):
    """A program file is not read by the policy: `python3 script.py` is decided by the patterns."""
    assert _verdict(POLICY, "python3 script.py", places[0]).action == "allow"
    assert _verdict(WORKED_EXAMPLE, "python3 script.py", places[0]).action == "ask"


def test_reasons_mask_secrets(places):
    verdict = _verdict(POLICY, "eval 'echo sk-proj-abcdefghijklmnopqrstuvwxyz0123456789'", places[0])
    assert verdict.action == "ask" and "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789" not in verdict.reason
    secret = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    for command in (f"ln -s /x lk && echo {secret} > lk/f", f"flock {secret} ls", f"$X {secret}",
                    f"echo {secret} > /etc/x", f"echo '{secret}"):
        verdict = _verdict(POLICY, command, places[0])
        assert secret not in verdict.reason, (command, verdict.reason)


def test_out_placeholder_is_outside_the_workspace(places):
    workspace, out = places
    assert not os.path.realpath(out).startswith(os.path.realpath(workspace) + os.sep)


def test_a_concern_is_never_answered_by_a_remembered_allow(places):
    """What the policy cannot account for needs a person call by call: remembered rules do not
    answer it, but a remembered deny still refuses."""
    from toolfleet.policy import Rule

    workspace = places[0]
    allow = [Rule(tool="run_command", action="allow", pattern="python3 *", workspace=workspace)]
    verdict = evaluate(POLICY, run_command, {"command": "python3 -c 'print(1)'"}, workspace=workspace,
                       remembered=lambda: allow)
    assert verdict.action == "ask" and verdict.rule == "commands.unaccounted"
    deny = [Rule(tool="run_command", action="deny", pattern="python3 *", workspace=workspace)]
    verdict = evaluate(POLICY, run_command, {"command": "python3 -c 'print(1)'"}, workspace=workspace,
                       remembered=lambda: deny)
    assert verdict.action == "deny"
