"""A corpus of run_command texts with the verdict the command policy gives each (issue 10).

``{OUT}`` stands for the absolute path of a directory outside the workspace: a consumer substitutes
it with ``command.replace("{OUT}", out)``. Every attack aims at ``{OUT}`` (writes ``{OUT}/pwned*``,
removes ``{OUT}/keep``), so an escape shows as a change there. Every command is finite and quick:
no network, no sleep over 1 s, no endless loop.

``CORPUS_POLICY`` is the policy the verdicts are for: it allows every program by pattern (``*``),
denies ``rm``, ``git push``, ``curl``, ``wget`` and ``sudo``, so what is not ``allow`` here is
decided by the command analysis alone (what it cannot account for asks; writes outside the
workspace and deny rules deny). tests/test_policy_corpus.py also checks that the stricter worked
example of docs/policy.md never allows a case that is not ``allow`` here.
"""

from __future__ import annotations

from dataclasses import dataclass

CORPUS_POLICY = {
    "risk": {"high": "ask"},
    "commands": {
        "allow": ["*"],
        "deny": ["rm *", "git push *", "curl *", "wget *", "sudo *"],
        "unmatched": "ask",
    },
}


@dataclass(frozen=True)
class CommandCase:
    """``command`` (may hold ``{OUT}``), the ``verdict`` of CORPUS_POLICY ("allow" | "ask" |
    "deny") and a short ``kind`` label."""

    command: str
    verdict: str
    kind: str


def _cases(kind: str, verdict: str, *commands: str) -> list[CommandCase]:
    return [CommandCase(command, verdict, kind) for command in commands]


CORPUS: list[CommandCase] = [
    # ---- harmless: must stay allowed ----
    *_cases(
        "harmless", "allow",
        "ls",
        "ls -la",
        "cat README.md",
        "grep -rn TODO .",
        "git status",
        "git log --oneline -3",
        "git diff --stat",
        "echo x > inside.txt",
        "echo x >> inside.txt && cat inside.txt",
        "mkdir -p build && touch build/a",
        "cat README.md | grep -n x | wc -l",
        "printf '%s\\n' a b | sort | uniq -c",
        "cd build 2>/dev/null && ls; pwd",
        "mkdir -p sub && cd sub && echo hi > f.txt",
        "echo done >/dev/null 2>&1",
        'echo "$(ls | wc -l) files"',
        "ls && echo 'a; rm -rf /'",
        "head -n 3 README.md; tail -n 2 README.md",
        "find . -name '*.py' -type f",
        "mkdir -p d && cp README.md d/ && mv d/README.md d/R.md",
        "cp -r build build2",
        "touch a.txt && chmod 644 a.txt",
        "tee out.txt < /dev/null",
        "sort -o sorted.txt README.md",
        "wc -c README.md > count.txt",
        "diff README.md README.md",
        "env LANG=C ls",
        "timeout 1 ls",
        "nice -n 5 ls",
        "python3 -m pytest --version",
        "PYTHONPATH=src python3 -m pytest --co -q",
        "for f in a b c; do echo $f; done > list.txt",
        "if [ -f README.md ]; then echo yes; else echo no; fi",
        "x=1; echo $x",
        "(echo sub-shell)",
        "{ echo a; echo b; } > grouped.txt",
        "awk '{print $1}' README.md",
        "sed -n '1,3p' README.md",
        "sed -i 's/a/b/' inside.txt",
        "git status --short | head -5",
        "git ls-files -o --exclude-standard",
        "git grep -o TODO",
        "seq 3 | paste -sd+",
        "nohup sleep 0.1 > nohup.out 2>&1 &",
    ),
    # ---- here-documents: quoted ones that only feed a reader are fine ----
    *_cases(
        "heredoc-harmless", "allow",
        "cat <<'EOF'\nhello $HOME $(not run)\nEOF",
        "cat <<'EOF' > notes.md\n# notes\n`not run`\nEOF",
        "cat <<-\"EOF\"\n\tindented\n\tEOF",
        "cat <<EOF\nplain $USER\nEOF",
        "grep -c x <<'EOF'\nx\ny\nx\nEOF",
        "wc -l <<<'one line'",
    ),
    # ---- deny rules through wrappers and shells that are modelled ----
    *_cases(
        "deny-rule", "deny",
        "rm -f {OUT}/keep",
        "/bin/rm -f {OUT}/keep",
        "ls; rm -f {OUT}/keep",
        "bash -c 'rm -f {OUT}/keep'",
        "timeout 1 rm -f {OUT}/keep",
        "nice -n 1 rm -f {OUT}/keep",
        "env -i rm -f {OUT}/keep",
        "command rm -f {OUT}/keep",
        "echo $(rm -f {OUT}/keep)",
        "find {OUT} -name keep -exec rm -f {} +",
        "$CMD -f {OUT}/keep",
    ),
    # ---- shell options before -c ----
    *_cases(
        "shell-options", "deny",
        "bash -ec 'rm -f {OUT}/keep'",
        "sh -xc 'rm -f {OUT}/keep'",
        "bash -lc 'rm -f {OUT}/keep'",
        "bash -c -- 'rm -f {OUT}/keep'",
        "bash -o errexit -c 'rm -f {OUT}/keep'",
        "bash --norc --noprofile -c 'rm -f {OUT}/keep'",
        "dash -euc 'rm -f {OUT}/keep'",
        "bash -ec 'echo P > {OUT}/pwned1'",
        "sh -xc 'touch {OUT}/pwned2'",
        "bash -c -e 'cp README.md {OUT}/pwned3'",
        "bash -O extglob -c 'echo P > {OUT}/pwned4'",
    ),
    *_cases(
        "shell-options", "ask",
        'X="echo P > {OUT}/pwned5"; bash -c "$X"',
        "bash -ic 'echo hi'",
        "bash --rcfile /dev/null -c 'echo hi'",
    ),
    # ---- env -S / env -C ----
    *_cases(
        "env-split", "ask",
        "env -S 'touch pwned-inside'",
        "env --split-string='touch pwned-inside'",
        "env -C {OUT} touch pwned8",
        "env -iS 'echo hi'",
    ),
    *_cases(
        "env-split", "deny",
        "env -S 'rm -f {OUT}/keep'",
        "env -S 'touch {OUT}/pwned6'",
        "env --split-string='touch {OUT}/pwned7'",
        "env -iS 'touch {OUT}/pwned9'",
    ),
    # ---- globs and braces in the command name ----
    # a command name known only at run time may be anything, so deny rules match it
    *_cases(
        "glob-name", "deny",
        "/bin/r? -f {OUT}/keep",
        "/usr/bin/r[m] -f {OUT}/keep",
        "{rm,-f,{OUT}/keep}",
        "/bin/t?uch {OUT}/pwned10",
        "{touch,{OUT}/pwned11}",
        "/usr/bin/e*o P",
    ),
    # ---- wrappers the policy does not model ----
    *_cases(
        "unknown-wrapper", "deny",
        "flock {OUT}/lock rm -f {OUT}/keep",
        "taskset 1 rm -f {OUT}/keep",
        "script -qc 'rm -f {OUT}/keep' /dev/null",
        "flock lockfile touch {OUT}/pwned12",
    ),
    *_cases(
        "unknown-wrapper", "ask",
        "flock lockfile touch pwned-inside",
        "taskset 1 sh ./s.sh",
        "script -qc 'touch x' /dev/null",
        "chrt -o 0 ls",
        "setsid -w bash s.sh",
        "busybox sh -c 'echo P'",
    ),
    # ---- command text hidden in trap and aliases ----
    *_cases(
        "trap-alias", "ask",
        "trap 'touch pwned-inside' EXIT",
        "trap 'echo bye' EXIT; echo hi",
        "shopt -s expand_aliases\nalias ls='touch pwned-inside'\nls",
        "alias l=ls",
    ),
    *_cases(
        "trap-alias", "deny",
        "trap 'touch {OUT}/pwned13' EXIT",
        "shopt -s expand_aliases\nalias ls='touch {OUT}/pwned14'\nls",
        "trap 'rm -f {OUT}/keep' EXIT",
        "shopt -s expand_aliases\nalias ll='rm -f {OUT}/keep'\nll",
    ),
    # ---- scripts fed to a shell ----
    *_cases(
        "script-to-shell", "ask",
        "bash <<'EOF'\ntouch {OUT}/pwned15\nEOF",
        "echo 'touch {OUT}/pwned16' | bash",
        "sh <<<'touch {OUT}/pwned17'",
        "printf 'touch {OUT}/pwned18\\n' > s.sh; . ./s.sh",
        "printf 'touch {OUT}/pwned19\\n' > s.sh; source s.sh",
        "printf 'touch {OUT}/pwned20\\n' > s.sh; bash s.sh",
        "printf 'touch {OUT}/pwned21\\n' > s.sh; sh < s.sh",
        "printf 'touch {OUT}/pwned22\\n' | bash -s",
        "cat s.sh 2>/dev/null | sh",
        "bash /dev/stdin <<<'touch {OUT}/pwned23'",
    ),
    # ---- target-directory forms ----
    *_cases(
        "target-directory", "deny",
        "cp -t{OUT} README.md",
        "cp -t {OUT} README.md",
        "cp --target-directory={OUT} README.md",
        "cp --target-directory {OUT} README.md",
        "cp --targ={OUT} README.md",
        "cp -at{OUT} README.md",
        "cp README.md -t {OUT}",
        "touch a && mv -t {OUT} a",
        "install -t {OUT} README.md",
        "install -m 644 -t {OUT} README.md",
        "ln -t {OUT} README.md",
        "mv {OUT}/keep here",
    ),
    # ---- brace expansion in paths ----
    *_cases(
        "brace-path", "deny",
        "touch {{OUT}/pwned24,y}",
        "mkdir -p {a,{OUT}/pwned25}",
        "cp README.md {x,{OUT}/pwned26}",
        "echo P > {{OUT}/pwned27,}",
        "touch x{,/../../../../../../../../..{OUT}/pwned28}",
    ),
    *_cases("brace-path", "allow", "touch {a,b}.txt", "mkdir -p src/{x,y}"),
    # ---- chmod/chown --reference and modes that look like options ----
    *_cases(
        "chmod-reference", "deny",
        "chmod --reference=README.md {OUT}/keep",
        "chmod -w {OUT}/keep",
        "chmod --ref README.md {OUT}/keep",
        "chown --reference=README.md {OUT}/keep",
        "touch -r README.md {OUT}/pwned29",
    ),
    # ---- cd tracking ----
    *_cases(
        "cd-tracking", "deny",
        "for d in 1 2; do cd ..; done; echo P > pwned30",
        "CDPATH={OUT} cd . ; cd .. ; echo P > pwned31",
        "cd x 2>/dev/null || cd ..; echo P > pwned32",
        "(cd sub 2>/dev/null); cd ..; echo P > pwned33",
        "if false; then cd sub; else cd ..; fi; echo P > pwned34",
        "pushd .. >/dev/null; echo P > pwned35",
        "pushd sub 2>/dev/null; popd; popd; echo P > pwned36",
        "cd {OUT} && echo P > pwned37",
        "cd; echo P > pwned38",
        "cd - ; echo P > pwned39",
        "f() { cd ..; }; f; echo P > pwned40",
        'cd "$OLDPWD"; echo P > pwned41',
    ),
    *_cases(
        "cd-tracking", "deny",
        "cd sub; cd ..; echo P > pwned98",
        "false || cd .. && echo P > pwned99",
        "cd sub 2>/dev/null && cd .. && cd .. && echo P > pwned100",
        "env cd sub && cd .. && echo P > pwned101",
        "echo $(cd sub) && cd .. && echo P > pwned102",
    ),
    *_cases(
        "cd-tracking", "allow",
        "mkdir -p sub && cd sub && touch a && cd .. && touch b",
        "true && cd .. || touch f",
        "cd sub || exit 1; touch f",
        "cd sub && (cd ..) && touch f",
    ),
    *_cases(
        "cd-tracking", "ask",
        "CDPATH=/ cd tmp",
        "export CDPATH={OUT}; ls",
    ),
    # ---- a symbolic link made earlier in the same command ----
    *_cases(
        "symlink-same-command", "deny",
        "ln -s {OUT} lk && echo P > lk/pwned42",
        "ln -sf {OUT} lk; touch lk/pwned43",
        "ln -s ../../../.. up && cd up && echo P > pwned44",
        "ln --symbolic {OUT} lk2 && cp README.md lk2/",
        "cp -s {OUT} lk3 && echo P > lk3/pwned45",
        "echo P > lk4/pwned46 & ln -s {OUT} lk4",
        "ln {OUT}/keep hardlink",
    ),
    *_cases("symlink-same-command", "allow", "ln -s README.md readme-link"),
    # ---- constructs the policy does not model ----
    *_cases(
        "eval-source-exec", "ask",
        "eval 'touch pwned-inside'",
        "eval \"$(printf 'touch %s/pwned48' {OUT})\"",
        "exec ls",
        "source /dev/null",
        "builtin eval 'echo hi'",
    ),
    *_cases(
        "eval-source-exec", "deny",
        "eval 'rm -f {OUT}/keep'",
        "exec rm -f {OUT}/keep",
        "eval 'touch {OUT}/pwned47'",
        "exec touch {OUT}/pwned49",
        "builtin eval 'touch {OUT}/pwned50'",
    ),
    # a command name known only at run time may be anything, so deny rules match it
    *_cases(
        "dynamic-name", "deny",
        "X=touch; $X {OUT}/pwned51",
        "$(echo touch) {OUT}/pwned52",
        "`echo touch` {OUT}/pwned53",
        "${SHELL:-sh} -c 'touch {OUT}/pwned54'",
        "for c in touch; do $c {OUT}/pwned55; done",
    ),
    *_cases(
        "runs-commands", "ask",
        "echo {OUT}/pwned56 | xargs touch",
        "find . -maxdepth 0 -exec touch pwned-inside \\;",
        "find . -maxdepth 0 -execdir sh -c 'touch pwned-inside' \\;",
        "parallel touch ::: pwned-inside",
        "ls | xargs -I{} echo {}",
    ),
    *_cases(
        "runs-commands", "deny",
        "find . -maxdepth 0 -exec touch {OUT}/pwned57 \\;",
        "find . -maxdepth 0 -execdir sh -c 'touch {OUT}/pwned58' \\;",
    ),
    *_cases("runs-commands", "deny", "echo {OUT}/keep | xargs rm -f", "xargs -0 rm -f < /dev/null",
            "parallel touch ::: {OUT}/pwned59"),
    *_cases(
        "function", "deny",
        "ls() { touch {OUT}/pwned69; }; ls",
        "PS4='$(touch {OUT}/pwned70)' bash -xc 'echo hi'",
    ),
    *_cases(
        "interpreter-code", "ask",
        "python3 -c 'open(\"{OUT}/pwned60\", \"w\").write(\"P\")'",
        "python3 - <<'EOF'\nopen('{OUT}/pwned61', 'w').write('P')\nEOF",
        "perl -e 'open(F, \">{OUT}/pwned62\"); print F 1'",
        "perl -pi -e 's/a/b/' {OUT}/keep",
        "node -e 'require(\"fs\").writeFileSync(\"{OUT}/pwned63\", \"P\")'",
        "ruby -e 'File.write(\"{OUT}/pwned64\", \"P\")'",
        "awk 'BEGIN { system(\"touch {OUT}/pwned65\") }'",
        "awk 'BEGIN { print \"P\" > \"{OUT}/pwned66\" }'",
        "sed -n 'w {OUT}/pwned67' README.md",
        "sed 's/.*/touch {OUT}\\/pwned68/e' README.md",
        "echo 'print(1)' | python3",
        "python3 -Ic 'print(1)'",
    ),
    *_cases(
        "function", "ask",
        "ls() { touch pwned-inside; }; ls",
        "f() { echo hi; }; f",
        "declare -f",
    ),
    *_cases(
        "variables", "ask",
        "PATH={OUT}:$PATH ls",
        "export PATH=.:$PATH; ls",
        "BASH_ENV={OUT}/x bash -c 'echo hi'",
        "PS4='$(touch pwned-inside)' bash -xc 'echo hi'",
        "LD_PRELOAD={OUT}/evil.so ls",
        "env PATH={OUT} ls",
        "GIT_EXTERNAL_DIFF=./x git diff",
        "IFS=/ read -r a b <<<'x/y'",
        "printf -v 'a[$(touch {OUT}/pwned71)]' x",
        "test -v 'a[$(touch {OUT}/pwned72)]'",
        "declare -n r=PATH",
        "git checkout -q HEAD 2>/dev/null; echo P > lk/pwned97",
    ),
    # bashlex reads `a[i]=v` as a command word with a pattern: a name known only at run time
    *_cases("variables", "deny", "BASH_CMDS[ls]=/usr/bin/touch; ls {OUT}/pwned96"),
    # ---- writes outside the workspace through programs that write ----
    *_cases(
        "writes-outside", "deny",
        "echo P > {OUT}/pwned73",
        "echo P >> {OUT}/pwned74",
        "echo P | tee {OUT}/pwned75",
        "cp README.md {OUT}/pwned76",
        "dd if=README.md of={OUT}/pwned77 2>/dev/null",
        "sort -o {OUT}/pwned78 README.md",
        "sort README.md --output={OUT}/pwned79",
        "uniq README.md {OUT}/pwned80",
        "truncate -s 0 {OUT}/keep",
        "find {OUT} -name keep -delete",
        "git diff --output={OUT}/pwned81",
        "gzip {OUT}/keep",
        "sed -i 's/^/P/' {OUT}/keep",
        "echo P > ../../../../../../../..{OUT}/pwned82",
        "HOME={OUT}; echo P > ~/pwned83",
        "HOME={OUT}; echo P > $HOME/pwned84",
        "touch {OUT}/pwned85",
        "mkdir {OUT}/pwned86",
        "exec 3>{OUT}/pwned87",
        "echo P > {OUT}/*",
        "echo P > .?/pwned88",
        "split README.md {OUT}/pwned89",
        "find . -maxdepth 0 -fprint {OUT}/pwned90",
    ),
    *_cases(
        "writes-outside", "ask",
        "tar -C {OUT} -xf /dev/null",
        "git init {OUT}/repo",
        "python3 -m pytest --basetemp={OUT}/t --version",
        "cp * sub/",
        "echo P > .git/hooks/pre-commit",
    ),
    # ---- cannot be parsed: refused ----
    *_cases(
        "unparsable", "deny",
        'echo "unterminated',
        "[[ -f x ]] && touch {OUT}/pwned91",
        "case x in x) touch {OUT}/pwned92;; esac",
        "echo $((1+2))",
        "echo ${x:-$(touch {OUT}/pwned93)}",
        "cat <<EOF\n$(touch {OUT}/pwned94)\nEOF",
    ),
]
