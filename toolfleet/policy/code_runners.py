"""Programs that run code of their own language, for :mod:`.programs`: interpreters (``python
-c``, ``perl -e``, code on standard input), ``awk`` programs and ``sed`` scripts; and the check of
programs the policy does not model (:func:`generic`)."""

from __future__ import annotations

import re

from . import shellmodel as model
from .commands import Walker, Word
from .shellmodel import Grammar, parse_options

RISKY_AWK = re.compile(r"system|\||>|getline|@|ENVIRON\s*\[")
STDIN_PATHS = ("-", "/dev/stdin")


def generic(w: Walker, name: str, words: list[Word], text: str) -> None:
    """A program the policy does not model: run-time arguments need a person, paths it is given
    are mentions (the engine asks when one is outside the workspace)."""
    if flag_dynamic(w, name, words, text):
        return
    for word in words[1:]:
        value = word.text.split("=", 1)[1] if word.text.startswith("-") and "=" in word.text else word.text
        if value and not value.startswith("-") and ("/" in value or value.startswith("~") or value == ".."):
            w.add_write(Word(value, False, word.glob), text, mention=True)


def flag_dynamic(w: Walker, name: str, words: list[Word], text: str) -> bool:
    if any(x.dynamic for x in words[1:]):
        w.concern(text, f"gives `{name}` an argument known only at run time, which may be an option or a path")
        return True
    return False


def interpreter(w: Walker, name: str, words: list[Word], text: str) -> None:
    values, flags = model.INTERPRETERS[name]
    i = 1
    while i < len(words):
        word = words[i].text
        if words[i].dynamic:
            w.concern(text, f"gives {name} an argument known only at run time")
            return
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        if word == "-m" or (name == "python" and word.startswith("-m")):
            module = word[2:] or (words[i + 1].text if i + 1 < len(words) else "")
            rest = words[i + 1:] if word[2:] else words[i + 2:]
            if name == "python" and module == "pip":
                from .launchers import installer

                installer(w, "pip", [Word("pip"), *rest], text)
                return
            generic(w, name, words, text)  # runs a module from disk, like a script: decided by the patterns
            return
        if word in values:
            i += 2
        elif word in flags or (name == "python" and all(f"-{c}" in flags for c in word[1:])):
            i += 1
        elif any(word.startswith(v) and len(v) == 2 for v in values):
            i += 1
        else:
            w.concern(text, f"`{name} {word}` runs code given on the command line, or an option the policy "
                            "does not model")
            return
    if i >= len(words) or words[i].text in STDIN_PATHS or words[i].text.startswith(("/dev/fd/", "/proc/")):
        w.concern(text, f"{name} runs code read from its standard input, which the policy cannot read")
    elif name in ("deno", "bun") and words[i].text in ("eval", "repl", "x"):
        w.concern(text, f"`{name} {words[i].text}` runs code the policy cannot read")


def awk(w: Walker, words: list[Word], text: str) -> None:
    texts = [x.text for x in words]
    programs: list[str] = []
    from_file, i = False, 1
    while i < len(texts):
        word = texts[i]
        if words[i].dynamic:
            w.concern(text, "gives awk an argument known only at run time")
            return
        if word == "--":
            i += 1
            break
        if word in ("-l", "--load") or word.startswith("-l"):
            w.concern(text, "loads an awk extension")
            return
        if word in ("-f", "--file", "-E", "--exec", "-i", "--include"):
            from_file, i = True, i + 2
        elif word in ("-e", "--source"):
            programs.append(texts[i + 1] if i + 1 < len(texts) else "")
            i += 2
        elif word in ("-F", "-v", "--field-separator", "--assign"):
            i += 2
        elif word.startswith("-f"):
            from_file, i = True, i + 1
        elif word.startswith("-") and word != "-":
            i += 1
        else:
            break
    if not from_file and not programs and i < len(texts):
        programs.append(texts[i])
    if any(RISKY_AWK.search(p) for p in programs):
        w.concern(text, "the awk program may run commands or write files (system, |, >, getline)")


def sed(w: Walker, name: str, words: list[Word], text: str) -> None:
    texts = [x.text for x in words]
    grammar = Grammar("efl", frozenset({"--expression", "--file", "--line-length"}), frozenset({
        "--in-place", "--quiet", "--silent", "--regexp-extended", "--separate", "--null-data", "--unbuffered",
        "--posix", "--debug", "--sandbox", "--follow-symlinks", "--zero-terminated"}))
    in_place = any(t.startswith("-i") or (t.startswith("-") and not t.startswith("--") and "i" in t.split("e")[0]
                                          and "f" not in t) or t.startswith("--in") for t in texts[1:])
    cleaned = [("-n" if t.startswith("-i") or t.startswith("--in") else t) for t in texts]
    parsed = parse_options(cleaned, grammar)
    scripts = [v for v, _ in parsed.values("-e", "--expression")]
    files = [at for at, _ in parsed.positional]
    if not scripts and not parsed.values("-f", "--file") and files:
        scripts.append(texts[files[0]])
        files = files[1:]
    if flag_dynamic(w, name, words, text):
        return
    if any(_sed_risky(s) for s in scripts):
        w.concern(text, "the sed script may run commands or write files (e, w)")
    if in_place:
        for at in files:
            w.add_write(words[at], text)


def _sed_risky(script: str) -> bool:
    rest, i = [], 0
    while i < len(script):
        ch = script[i]
        if ch in "sy" and i + 1 < len(script) and script[i + 1] not in "\n;} \t":
            delim, j, parts = script[i + 1], i + 2, 0
            while j < len(script) and parts < 2:
                if script[j] == "\\":
                    j += 2
                    continue
                parts += script[j] == delim
                j += 1
            flags = re.match(r"[a-zA-Z0-9]*", script[j:]).group(0)  # type: ignore[union-attr]
            if ch == "s" and ("e" in flags or "w" in flags):
                return True
            i = j + len(flags)
        elif ch == "/":
            j = i + 1
            while j < len(script) and script[j] != "/":
                j += 2 if script[j] == "\\" else 1
            i = j + 1
        else:
            rest.append(ch)
            i += 1
    return any(ch in "ewW" for ch in rest)
