"""Text every part may send or store (docs/design.md, result contract): below the dispatcher and the
worker alike, so neither imports the other for it."""

from __future__ import annotations


def safe_text(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD (valid pairs joined): encodable as UTF-8.

    A model's JSON may carry ``"\\ud800"`` escapes (RFC 8259 allows them; Python's ``json`` decodes
    them to lone surrogates), and a handler may return such text; Redis, JSON encoders and the
    providers' APIs need UTF-8, so every name and text that leaves a process passes through here."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
