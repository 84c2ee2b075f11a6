"""Workspace file names as the tools print them: one name can never read as two entries.

A name may hold any character but '/' and NUL (a newline, a carriage return, bytes that are not
UTF-8), and a link's target likewise; ``list_dir`` prints one entry per line and ``grep`` one
``file:line:text`` per line, so a name made by ``run_command`` such as ``notes.txt\\nid_rsa -> ..``
would list as entries that do not exist. :func:`shown_name` leaves ordinary names as they are and
quotes the others whole in bash's ANSI-C form, ``$'...'``, the way GNU ``ls`` does on a terminal:
``$'notes.txt\\nid_rsa -> ..'``. Quoted are names holding a character that is not printable
(``str.isprintable``: C0 and C1 controls, DEL, line and paragraph separators, format characters,
the bytes that are not UTF-8), names beginning with ``$'`` (so a plain name never looks quoted),
and names holding one of the ``separators`` of the output they are printed in (``:`` in ``grep``'s
``file:line:text``, `` -> `` in ``list_dir``'s links). Inside the quotes, ``\\`` and ``'`` are
escaped, ``\\a \\b \\t \\n \\v \\f \\r \\e`` name those controls and any other character that is
not printable is written as its UTF-8 bytes, ``\\xHH`` each (a byte that is not UTF-8 is itself),
so ``ls $'...'`` in bash names exactly that file.
"""

from __future__ import annotations

from collections.abc import Iterable

_ESCAPES = {"\\": "\\\\", "'": "\\'", "\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v",
            "\f": "\\f", "\r": "\\r", "\x1b": "\\e"}
QUOTE_OPEN = "$'"


def shown_name(name: str, separators: Iterable[str] = ()) -> str:
    """``name`` as it is when it needs no quoting, else ``$'...'`` (the module docstring says when
    and how). Names from ``os.scandir`` and ``os.readlink`` carry bytes that are not UTF-8 as lone
    surrogates (``surrogateescape``); they are written as those bytes."""
    if name.isprintable() and not name.startswith(QUOTE_OPEN) and not any(s in name for s in separators):
        return name
    out = []
    for ch in name:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            try:
                raw = ch.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:  # a surrogate no byte became (not from the file system)
                raw = ch.encode("utf-8", "surrogatepass")
            out.append("".join(f"\\x{b:02x}" for b in raw))
    return QUOTE_OPEN + "".join(out) + "'"
