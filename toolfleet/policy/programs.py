"""What each simple command does, for :mod:`.commands`: follow ``cd``, unwrap wrappers, walk
``bash -c`` strings, record writes, and raise a :class:`~.commands.Concern` for every construct
whose effect the text does not show:

- a command name known only at run time (``$X``, ``$(...)``, a pattern ``/bin/r?``, braces
  ``{rm,x}``); ``eval``, ``source``/``.``, ``trap``, ``alias``, ``shopt``, functions, ``exec``;
- shells reading a script file or standard input (``bash s.sh``, ``echo ... | bash``, ``sh <<<``),
  a ``-c`` string known only at run time, shell options the policy does not model;
- interpreters given code (``python -c``, ``perl -e``, ``node -e``, or code on standard input),
  ``awk`` programs that run commands or write files, ``sed`` scripts with ``e``/``w``;
- ``xargs``, ``find -exec``, ``parallel`` and wrappers the policy does not model (``flock``,
  ``taskset``, ``script -c``, ...), whose words are still probed for deny rules;
- wrapper options that hide the command (``env -S``, ``env -C``);
- variables that change what later commands run (``PATH``, ``BASH_ENV``, ``PS4``, ``LD_*``, ...);
- arguments known only at run time given to a program that is not a plain reader;
- patterns that may expand to options of a writing program (``cp * dir`` with a file ``-t..``).
"""

from __future__ import annotations

import posixpath

from . import launchers
from . import shellmodel as model
from .code_runners import STDIN_PATHS, awk, flag_dynamic, generic, interpreter, sed
from .command_types import MAX_PROBE_WORDS, MAX_PROBES
from .commands import Segment, Walker, Word
from .shellmodel import Grammar, option_span, parse_options

SYSTEM_DIRS = frozenset({"/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin", "/usr/local/sbin"})
SHELL_GRAMMAR = Grammar("oO", frozenset({"--rcfile", "--init-file"}), frozenset({
    "--norc", "--noprofile", "--login", "--posix", "--restricted", "--verbose", "--noediting", "--debugger",
    "--dump-strings", "--dump-po-strings", "--wordexp", "--protected", "--help", "--version"}))


def run(w: Walker, words: list[Word], text: str, assignments: tuple[str, ...] = (),
        wrapped_by: str | None = None, probe: bool = False) -> None:
    """Record the segment ``words`` and what its program does."""
    probe = probe or w.probe
    w.segment(Segment(tuple(x.text for x in words), text, assignments, tuple(x.dynamic for x in words),
                      wrapped_by, probe))
    first = words[0]
    if first.dynamic:
        w.concern(text, f"the command name `{first.text}` is known only at run time")
        return
    name = program(first.text)
    git_name = model.base_name(first.text)
    if git_name.startswith("git-") and len(git_name) > 4:  # /usr/lib/git-core/git-push is `git push`
        run(w, [Word("git"), Word(git_name[4:]), *words[1:]], text, (), wrapped_by=first.text, probe=probe)
        return
    if git_name == "git" and name != "git":  # /usr/lib/git-core/git: still git's options and subcommands
        name = "git"
    if name in ("cd", "pushd", "popd") and (probe or wrapped_by not in (None, "builtin", "command")):
        return  # run by another program (env cd, xargs cd): a process of its own, the shell stays
    handler = HANDLERS.get(name)
    if handler is not None:
        handler(w, name, words, text)
    elif name in model.SHELLS:
        shell(w, name, words, text)
    elif name in model.OTHER_SHELLS:
        w.concern(text, f"runs {name}, whose language the policy does not read")
        probe_words(w, name, words, text)
    elif name in model.INTERPRETERS:
        interpreter(w, name, words, text)
    elif name in model.AWKS:
        awk(w, words, text)
    elif name in model.WRAPPER_GRAMMARS:
        wrapper(w, name, words, text)
    elif name in model.RUNNERS:
        w.concern(text, f"runs `{name}`, which runs other commands in ways the policy does not model")
        probe_words(w, name, words, text)
    elif name in model.ENV_RUNNERS:
        probe_words(w, name, words, text)
        generic(w, name, words, text)
    elif name in model.EVALUATORS:
        evaluator(w, name, words, text)
    elif name in model.SETTERS and not (name in ("printf", "test", "[") and "-v" not in [x.text for x in words]):
        setter(w, name, words, text)
    elif name in model.EXTRACTORS:
        w.concern(text, f"`{name}` writes files named by its input or options, which the policy cannot see")
        generic(w, name, words, text)
    elif name in model.COMPRESSORS:
        parsed = parse_options([x.text for x in words], Grammar("S", frozenset({"--suffix"})))
        if not parsed.has(*model.COMPRESSOR_READ_ONLY):
            for at, _ in parsed.positional:
                w.add_write(words[at], text)
        flag_dynamic(w, name, words, text)
    elif name in model.WRITERS:
        writer(w, name, words, text)
    elif name not in model.READERS:
        generic(w, name, words, text)


def program(word: str) -> str:
    """The program a command word runs, as the tables name it; a path outside the system
    directories (``./cat``) is an unknown program."""
    directory = posixpath.dirname(word)
    if directory and posixpath.normpath(directory) not in SYSTEM_DIRS:
        return word
    return model.base_name(word)


def cd(w: Walker, name: str, words: list[Word], text: str) -> None:
    w.change_dir(name, words)


def shell(w: Walker, name: str, words: list[Word], text: str) -> None:
    texts = [x.text for x in words]
    i, seen = 1, set()
    while i < len(words):
        if words[i].dynamic:
            w.concern(text, f"gives {name} an option known only at run time")
            return
        word = texts[i]
        if word in ("--", "-"):
            i += 1
            break
        if word.startswith("+"):
            i += 2 if word in ("+o", "+O") else 1
            continue
        if not word.startswith("-"):
            break
        taken, names, known = option_span(texts, i, SHELL_GRAMMAR)
        if not known:
            w.concern(text, f"runs {name} with the option {word}, which the policy does not model")
            probe_words(w, name, words, text)
            return
        seen.update(names)
        i += taken
    rest = words[i:]
    if seen & {"-i", "--rcfile", "--init-file"}:
        w.concern(text, f"starts an interactive {name}, which reads start-up files and expands aliases")
    if "-c" in seen:
        if not rest:
            w.concern(text, f"`{name} -c` has no command string")
        elif rest[0].dynamic:
            w.concern(text, f"{name} runs a command string known only at run time")
        else:
            w.nested(rest[0].text, strict=True, leak=False)
    elif "-s" in seen or not rest or rest[0].text in STDIN_PATHS or rest[0].text.startswith(("/dev/fd/", "/proc/")):
        w.concern(text, f"{name} runs commands read from its standard input, which the policy cannot read")
    else:
        w.concern(text, f"{name} runs the script file `{rest[0].text}`; the policy does not read scripts")


def wrapper(w: Walker, name: str, words: list[Word], text: str) -> None:
    grammar, positionals = model.WRAPPER_GRAMMARS[name]
    texts = [x.text for x in words]
    hidden = model.WRAPPER_OPAQUE_OPTIONS.get(name, frozenset())
    i, given = 1, set()
    while i < len(words):
        word = texts[i]
        if words[i].dynamic:
            w.concern(text, f"gives `{name}` an option known only at run time")
            probe_words(w, name, words, text)
            return
        if word == "--":
            i += 1
            break
        if word == "-" and name == "env":
            i += 1
            continue
        if not word.startswith("-") or word == "-":
            break
        taken, names, known = option_span(texts, i, grammar)
        if not known:
            w.concern(text, f"runs `{name}` with the option {word}, which the policy does not model")
            probe_words(w, name, words, text)
            return
        given.update(names)
        i += taken
    while name == "env" and i < len(words) and "=" in texts[i] and model.var_name(texts[i]):
        w.assignment(texts[i], text, exported=True)
        i += 1
    i += positionals
    if given & hidden:
        if name == "command":
            return  # command -v / -V only prints what a name is
        w.concern(text, f"`{name} {' '.join(sorted(given & hidden))}` runs a command the policy cannot read")
        probe_words(w, name, words, text)
        return
    if name == "xargs":
        w.concern(text, "xargs runs its command with arguments read from its input")
    if i >= len(words):
        return
    if name in ("exec", "sudo", "doas"):
        w.concern(text, f"`{name}` runs its command in a way the policy does not model")
    run(w, list(words[i:]), text, (), wrapped_by=name)


def probe_words(w: Walker, name: str, words: list[Word], text: str) -> None:
    """Check what a program the policy does not model might run against the deny rules: every
    tail of its words, and every argument that reads like a command string."""
    if w.depth >= 3:
        return
    for k in range(1, len(words)):
        if w.found.probes >= MAX_PROBES or w.found.probe_words >= MAX_PROBE_WORDS:
            return
        w.found.probes += 1
        w.found.probe_words += len(words) - k
        word = words[k]
        if word.dynamic:
            continue
        if word.text.startswith("-"):
            value = word.text.partition("=")[2] or word.text[2:]
            if any(ch in value for ch in " ;|&$`\n"):
                w.nested(value, strict=False, leak=False, probe=True)
            continue
        run(w, list(words[k:]), text, (), wrapped_by=name, probe=True)
        if any(ch in word.text for ch in " ;|&$`\n"):
            w.nested(word.text, strict=False, leak=False, probe=True)


def evaluator(w: Walker, name: str, words: list[Word], text: str) -> None:
    why = {
        "eval": "eval runs text as a command",
        "source": f"{name} runs a script file in this shell; the policy does not read scripts",
        ".": "`.` runs a script file in this shell; the policy does not read scripts",
        "trap": "trap stores a command that runs later",
        "alias": "alias changes what later command names run",
        "builtin": "builtin runs a shell builtin the policy checks through it",
    }.get(name, f"`{name}` changes how the shell runs later commands")
    w.concern(text, why)
    static = [x.text for x in words[1:] if not x.dynamic]
    if name == "eval" and static:
        w.nested(" ".join(static), strict=False, leak=True)
    elif name == "trap" and static:
        w.nested(static[0 if static[0] != "--" else min(1, len(static) - 1)], strict=False, leak=False)
    elif name == "alias":
        for item in static:
            if "=" in item:
                w.nested(item.split("=", 1)[1], strict=False, leak=False)
    elif name == "builtin" and len(words) > 1:
        run(w, list(words[1:]), text, (), wrapped_by="builtin")


def setter(w: Walker, name: str, words: list[Word], text: str) -> None:
    export_flag = any(x.text.startswith("-") and "x" in x.text for x in words[1:])  # once, not per word
    for word in words[1:]:
        target = word.text.split("=", 1)[0]  # the name part: the value may be anything
        if word.dynamic and any(ch in target for ch in "$`"):
            w.concern(text, f"`{name}` sets a variable named at run time")
            return
        if "[" in target and any(ch in target for ch in "$`"):
            w.concern(text, f"`{name}` evaluates an array subscript, which can run commands")
            return
        if word.text.startswith("-") and name in ("declare", "typeset", "local", "export", "readonly") \
                and any(ch in word.text for ch in "fn"):
            w.concern(text, f"`{name} {word.text}` defines functions or name references")
            return
        variable = model.var_name(word.text)
        if variable and word.text.startswith(variable):
            exported = name == "export" or export_flag
            w.assignment(word.text, text, exported=exported or name not in ("read", "printf", "getopts", "test", "["))


def find(w: Walker, name: str, words: list[Word], text: str) -> None:
    texts = [x.text for x in words]
    i = 1
    while i < len(texts) and (texts[i] in ("-H", "-L", "-P") or texts[i].startswith(("-D", "-O"))):
        i += 2 if texts[i] == "-D" else 1
    starts: list[Word] = []
    while i < len(texts) and not (texts[i].startswith("-") or texts[i] in ("(", "!", ")", ",")):
        starts.append(words[i])
        i += 1
    starts = starts or [Word(".")]
    if any(x.dynamic for x in words[i:]):
        w.concern(text, "gives find an expression known only at run time, which may run or delete")
    k, deletes = i, False
    while k < len(texts):
        word = texts[k]
        if word in ("-exec", "-execdir", "-ok", "-okdir"):
            end = next((j for j in range(k + 1, len(texts)) if texts[j] in (";", "+")), len(texts))
            w.concern(text, f"`find {word}` runs a command for every file it finds")
            if end > k + 1:
                for start in starts[:8]:
                    inner = [Word(x.text.replace("{}", start.text + "/f"), x.dynamic or start.dynamic, x.glob)
                             for x in words[k + 1 : end]]
                    run(w, inner, text, (), wrapped_by="find")
            k = end + 1
            continue
        if word == "-delete" and not deletes:  # once: each start is written once however many -delete
            deletes = True
            for start in starts:
                w.add_write(start, text)
        elif word in ("-fprint", "-fprint0", "-fls", "-fprintf") and k + 1 < len(texts):
            w.add_write(words[k + 1], text)
            k += 1
        k += 1


def writer(w: Walker, name: str, words: list[Word], text: str) -> None:
    texts = [x.text for x in words]
    parsed = parse_options(texts, model.WRITERS[name])
    positional = [words[at] for at, _ in parsed.positional]
    if name not in model.WRITES_ALL and any(x.brace for x in positional):
        w.concern(text, f"braces expand to several arguments of `{name}`: which one is the target is not "
                        "what the text shows")
    if any(x.glob and x.text[:1] in "*?[" for x in positional):
        w.concern(text, f"a file-name pattern may expand to an option of `{name}` (a file named like -t..)")
    option_words = {at for _, _, at in parsed.options}
    if any(words[at].dynamic for at in option_words if at < len(words)) or any(
            x.dynamic and not x.text.startswith("/") for x in positional[:-1] if name not in model.WRITES_ALL):
        w.concern(text, f"gives `{name}` an argument known only at run time, which may be an option")
    target_dirs = [_value(words, v, at) for v, at in parsed.values("-t", "--target-directory")]
    targets: list[Word] = []
    if name in model.WRITES_ALL:
        targets = positional + target_dirs
    elif name in ("cp", "install", "ln"):
        if name == "install" and parsed.has("-d", "--directory"):
            targets = positional
        elif target_dirs:
            targets = target_dirs
        elif len(positional) >= 2:
            targets = [positional[-1]]
        elif name == "ln" and positional:
            targets = [Word(posixpath.basename(positional[0].text.rstrip("/")) or ".", positional[0].dynamic)]
        if name == "ln" and parsed.has("-s", "--symbolic"):
            w.found.links.append((text, True))
        elif name == "ln":
            targets = targets + positional[:-1] if len(positional) >= 2 else targets + positional
        if name == "cp" and parsed.has("-s", "--symbolic-link", "-d", "-P", "--no-dereference", "-a", "--archive",
                                       "-r", "-R", "--recursive", "-l", "--link"):
            w.found.links.append((text, parsed.has("-s", "--symbolic-link")))
        if name == "install" and parsed.has("--strip-program"):
            w.concern(text, "`install --strip-program` runs the program it is given")
    elif name == "sort":
        targets = [_value(words, v, at) for v, at in parsed.values("-o", "--output", "-T", "--temporary-directory")]
        if parsed.has("--compress-program"):
            w.concern(text, "`sort --compress-program` runs the program it is given")
    elif name == "uniq":
        targets = positional[1:2]
    elif name == "split":
        targets = positional[1:2] or [Word("x")]
        if parsed.has("--filter"):
            w.concern(text, "`split --filter` runs a shell command")
    for target in targets:
        w.add_write(target, text)


def dd(w: Walker, name: str, words: list[Word], text: str) -> None:
    if flag_dynamic(w, name, words, text):
        return
    for word in words[1:]:
        if word.text.startswith("of="):
            w.add_write(Word(word.text[3:], False, word.glob), text)


def _value(words: list[Word], value: str, at: int) -> Word:
    source = words[at] if at < len(words) else Word(value)
    return Word(value, source.dynamic, source.glob)


HANDLERS = {"cd": cd, "pushd": cd, "popd": cd, "find": find, "sed": sed, "dd": dd}
HANDLERS.update(launchers.HANDLERS)
