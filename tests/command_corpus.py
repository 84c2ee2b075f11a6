"""Command variants with the verdict the policy must give them (STUB: replaced by the policy
engineer's corpus at merge; the format is the agreed one).

``command`` may hold ``{OUT}``: an absolute directory outside the workspace, substituted with
``command.replace("{OUT}", out)`` (no str.format: commands hold braces). ``verdict`` is what the
policy says (``"allow"``, ``"ask"`` or ``"deny"``), ``kind`` a short label of the trick used.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CommandCase:
    command: str
    verdict: str
    kind: str


CORPUS: list[CommandCase] = [
    CommandCase("echo P > {OUT}/f", "ask", "redirect-outside"),
    CommandCase("bash -ec 'rm -f {OUT}/victim.txt'", "deny", "shell-options-before-c"),
    CommandCase("env -S 'rm -f {OUT}/victim.txt'", "deny", "env-split"),
    CommandCase("/bin/r? -f {OUT}/victim.txt", "deny", "glob-command-name"),
    CommandCase("{rm,-f,{OUT}/victim.txt}", "deny", "brace-command-name"),
    CommandCase("cp -t{OUT} README.md", "ask", "target-directory"),
    CommandCase("ln -s {OUT} lk && echo P > lk/f", "ask", "symlink-same-command"),
    CommandCase("echo 'echo P > {OUT}/f' | bash", "ask", "script-to-shell"),
    CommandCase("sleep 1234 & echo started", "allow", "background-process"),
    CommandCase("cat <<'EOF'\nhello\nEOF", "allow", "quoted-heredoc-cat"),
    CommandCase("touch made.txt && ls", "allow", "workspace-write"),
]
