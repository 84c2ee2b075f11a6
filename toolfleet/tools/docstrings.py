"""A tool's description from its handler's docstring: what the model reads about the tool."""

from __future__ import annotations

from typing import Any


def doc_text(doc: Any) -> str:
    """A docstring's description as the model reads it: its paragraphs, each hard-wrapped line joined
    to the one before with a space (a summary wrapped onto a second line stays one sentence; the
    ``tools`` listing shows its first line), lists and indented lines kept as written."""
    joiner = "\n\n" if doc.blank_after_short_description else "\n"
    raw = joiner.join(part for part in (doc.short_description, doc.long_description) if part)
    paragraphs = []
    for paragraph in raw.split("\n\n"):
        lines: list[str] = []
        for line in paragraph.split("\n"):
            listed = line[:1].isspace() or line.lstrip()[:2] in ("- ", "* ", "• ") or line.lstrip()[:1].isdigit()
            if lines and line.strip() and not listed:
                lines[-1] = f"{lines[-1].rstrip()} {line.strip()}"
            else:
                lines.append(line)
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)
