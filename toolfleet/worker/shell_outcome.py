"""What one command of a live shell (:mod:`.live_shell`) did, how it is written to the shell, and
why a shell ended under a call: the contract between the shell and the session host
(:mod:`.affinity`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Outcome:
    """What one command did: ``output`` (text), ``status`` (exit status; ``None`` when stopped),
    ``stopped`` (``"timeout"``/``"cancelled"``/``None``), ``restarted`` (the shell was replaced:
    cwd and environment reset), ``note`` (said to the model before the output), ``exited`` (the
    shell itself ended while the command ran: ``exit``, or killed)."""

    output: str
    status: int | None
    stopped: str | None = None
    restarted: bool = False
    note: str = ""
    exited: bool = False

    @property
    def completed(self) -> bool:
        """The command ran to its end in the shell (not stopped, and the shell lives on)."""
        return self.stopped is None and not self.restarted and not self.exited


def encode(command: str) -> str:
    """``command`` as a bash ANSI-C quoted word (``$'\\xHH...'``): read by bash's own parser, no
    external program, so it works whatever the session did to ``PATH``. Raises ``ValueError`` for
    a NUL character (a bash string cannot hold one)."""
    data = command.encode("utf-8", "surrogateescape")
    if b"\0" in data:
        raise ValueError("a command cannot contain a NUL character")
    return "$'" + "".join(f"\\x{byte:02x}" for byte in data) + "'"


class LeaseLapsed(Exception):
    """The shell was ended by its lease (:mod:`.sandbox_lease`); ``ran``: the call's command had been
    written to it (it may have acted in part)."""

    def __init__(self, ran: bool) -> None:
        super().__init__("the shell's lease lapsed")
        self.ran = ran


class ShellEnded(Exception):
    """The shell was ended on purpose (:meth:`Shell.end`: its session closed) while a call used
    it: no new shell is started for it; ``ran`` as for :class:`LeaseLapsed`."""

    def __init__(self, ran: bool) -> None:
        super().__init__("the shell was ended: its session was closed")
        self.ran = ran
