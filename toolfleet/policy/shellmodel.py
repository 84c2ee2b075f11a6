"""What the command policy knows about programs: which only read, which write which arguments,
which run other commands, and how their options are spelled.

The policy is an allow-list (docs/policy.md, "What the policy can and cannot see"): a command it
does not find here is decided by the patterns only, and a construct that runs text the policy cannot
read (``eval``, ``python -c``, ``xargs``, an unknown wrapper, ...) always needs a person. Option
grammars follow GNU coreutils/findutils and bash 5 (their ``--help``); long options may be
abbreviated to any unique prefix, as ``getopt_long`` allows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh", "ash", "rbash", "yash", "posh"})
OTHER_SHELLS = frozenset({"fish", "csh", "tcsh", "nu", "elvish", "xonsh", "pwsh", "powershell"})
# programs whose arguments are only read: any arguments, even ones known only at run time, are fine
READERS = frozenset({
    "cat", "tac", "head", "tail", "wc", "ls", "dir", "vdir", "grep", "egrep", "fgrep", "echo", "printf", "pwd",
    "true", "false", ":", "test", "[", "basename", "dirname", "realpath", "readlink", "stat", "file", "du", "df",
    "id", "whoami", "uname", "date", "which", "type", "cut", "tr", "nl", "od", "hexdump", "cmp", "comm", "diff",
    "md5sum", "sha1sum", "sha224sum", "sha256sum", "sha384sum", "sha512sum", "b2sum", "cksum", "column", "fold",
    "fmt", "expand", "unexpand", "paste", "join", "rev", "seq", "printenv", "strings", "base64", "base32", "jq",
    "nproc", "sleep", "expr", "tty", "locale", "getconf", "whereis",
})
# builtins that evaluate text again or change how later commands run: always need a person
EVALUATORS = frozenset({
    "eval", "source", ".", "trap", "alias", "unalias", "shopt", "enable", "bind", "complete", "compgen", "fc",
    "history", "let", "mapfile", "readarray", "coproc", "hash", "ulimit", "umask", "disown", "builtin",
})
# builtins that set a variable named by an argument (a subscript in it is evaluated)
SETTERS = frozenset({"read", "declare", "typeset", "local", "export", "readonly", "unset", "printf", "getopts",
                     "test", "["})
# programs that run another command the policy does not model
RUNNERS = frozenset({
    "flock", "taskset", "script", "chroot", "nsenter", "unshare", "su", "runuser", "setpriv", "firejail",
    "systemd-run", "ssh", "busybox", "toybox", "strace", "ltrace", "valgrind", "perf", "gdb", "catchsegv", "numactl",
    "cgexec", "prlimit", "sg", "newgrp", "dbus-run-session", "xvfb-run", "fakeroot", "faketime", "proot", "schroot",
    "time", "watch", "parallel", "entr", "bwrap", "docker", "podman", "kubectl", "at", "batch", "crontab",
    "screen", "tmux", "expect", "sshpass", "pkexec", "capsh", "unbuffer", "rlwrap", "chrt", "vim", "vi", "nvim",
    "ex", "ed", "emacs", "less", "more", "man", "sqlite3", "psql", "mysql", "sftp", "ftp", "nc", "ncat", "socat",
    "telnet", "xdg-open", "open", "run-parts", "start-stop-daemon", "daemonize", "inotifywait",
    "setarch", "linux32", "linux64", "i386", "x86_64", "uname26", "ssh-agent", "dbus-send", "dbus-launch",
    "chpst", "softlimit", "envdir", "envuidgid", "setuidgid", "tini", "dumb-init", "torsocks", "proxychains",
    "proxychains4", "tsocks", "eatmydata", "fakechroot", "nocache", "cpulimit", "trickle", "ccache", "distcc",
    "systemd-nspawn", "machinectl", "apptainer", "singularity", "lxc-attach", "mpirun", "mpiexec", "srun",
    "ld.so", "ld-linux.so.2", "ld-linux-x86-64.so.2", "runcon", "sudoedit", "flatpak", "flatpak-spawn", "nix",
    "nix-shell", "ip", "systemctl", "launchctl", "keyctl", "chronic", "ifne", "vipe", "pee", "ts", "lckdo",
    "with-lock-ex", "caffeinate", "gtimeout", "gnice", "scl", "module", "sem", "nq", "tsp", "pueue", "ssh-add",
})
# environment managers whose run/exec subcommand runs the command named after it: the words are
# probed against the deny rules (``uv run rm x``) and the program itself is left to the patterns
ENV_RUNNERS = frozenset({"uv", "poetry", "pipenv", "pdm", "hatch", "rye", "conda", "mamba", "micromamba",
                         "direnv", "asdf", "mise", "rbenv", "pyenv", "nodenv", "goenv", "jenv", "sdk",
                         "dotenv", "fnm", "volta", "corepack", "pixi", "rustup", "bundle", "bundler", "opam",
                         "stack", "cabal", "nvm", "sdkman"})
# programs that write files their input or options name (archives, patches, remote copies)
EXTRACTORS = frozenset({"tar", "unzip", "cpio", "patch", "7z", "bsdtar", "rsync", "scp", "ar", "zip", "rclone",
                        "git-apply"})
# compressors replace each file argument (file -> file.gz) unless told to write to standard output
COMPRESSORS = frozenset({"gzip", "gunzip", "bzip2", "bunzip2", "xz", "unxz", "zstd", "unzstd", "lz4", "lzma",
                         "unlzma", "compress", "uncompress"})
COMPRESSOR_READ_ONLY = frozenset({"-c", "--stdout", "--to-stdout", "-t", "--test", "-l", "--list"})
# interpreters: (options that take a value, options that are plain flags); any other option (such as
# -c / -e code) makes the call need a person, and so does reading code from standard input
INTERPRETERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "python": (frozenset({"-W", "-X", "-m"}), frozenset({"-u", "-B", "-O", "-OO", "-E", "-s", "-S", "-I", "-b",
                                                          "-bb", "-q", "-v", "-P", "-R"})),
    "perl": (frozenset({"-I", "-M", "-m"}), frozenset({"-w", "-W", "-X", "-T", "-t", "-c", "-s"})),
    "ruby": (frozenset({"-I", "-r"}), frozenset({"-w", "-W", "-v", "-d"})),
    "node": (frozenset({"-r", "--require"}), frozenset({"--no-warnings", "--enable-source-maps", "--test"})),
    "nodejs": (frozenset({"-r", "--require"}), frozenset({"--no-warnings", "--test"})),
    "deno": (frozenset(), frozenset()),
    "bun": (frozenset(), frozenset()),
    "php": (frozenset({"-c", "-d"}), frozenset({"-n", "-l"})),
    "lua": (frozenset({"-l"}), frozenset({"-W"})),
    "luajit": (frozenset({"-l"}), frozenset()),
    "Rscript": (frozenset(), frozenset({"--vanilla"})),
    "R": (frozenset(), frozenset()),
    "tclsh": (frozenset(), frozenset()),
    "wish": (frozenset(), frozenset()),
    "julia": (frozenset(), frozenset()),
    "osascript": (frozenset(), frozenset()),
    "jshell": (frozenset(), frozenset()),
    "irb": (frozenset(), frozenset()),
    "guile": (frozenset(), frozenset()),
    "racket": (frozenset(), frozenset()),
}
_VERSIONED = re.compile(r"^(python|pypy|perl|ruby|lua|php|node)[0-9.]*$")
AWKS = frozenset({"awk", "gawk", "mawk", "nawk"})
# variables that change what later commands run or where they write: setting one needs a person
CODE_VARS = frozenset({
    "PATH", "BASH_ENV", "ENV", "PS0", "PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND", "IFS", "CDPATH", "HOME",
    "SHELLOPTS", "BASHOPTS", "POSIXLY_CORRECT", "GLOBIGNORE", "BASH_XTRACEFD", "EXECIGNORE", "HISTFILE", "PAGER",
    "MANPAGER", "EDITOR", "VISUAL", "LESSOPEN", "LESSCLOSE", "PERL5OPT", "PERL5LIB", "PERLLIB", "RUBYOPT",
    "RUBYLIB", "NODE_OPTIONS", "BROWSER", "SHELL", "TMPDIR", "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONHOME",
    "PYTHONUSERBASE", "OLDPWD", "PWD", "BASH_LOADABLES_PATH", "INPUTRC", "TERMINFO", "MAIL", "MAILPATH",
})
CODE_VAR_PREFIXES = ("LD_", "GIT_", "BASH_", "XDG_", "DYLD_", "NPM_CONFIG_", "PIP_", "PYTHONBREAK")


def base_name(word: str) -> str:
    """The program a command word names (``/usr/bin/python3.12`` -> ``python``)."""
    name = word.rsplit("/", 1)[-1]
    match = _VERSIONED.match(name)
    return match.group(1).replace("pypy", "python") if match else name


def is_code_var(name: str) -> bool:
    """True for a variable whose value changes what later commands run or where they write."""
    return name in CODE_VARS or name.startswith(CODE_VAR_PREFIXES)


# variables a command may set and export: they change formatting, language or time only (an
# allow-list: any other exported variable may change what a program runs, e.g. MAKEFLAGS,
# JAVA_TOOL_OPTIONS, GCONV_PATH, PYTHONPATH, PERL5OPT, NODE_OPTIONS, GIT_*, LESSOPEN, PAGER)
HARMLESS_VARS = frozenset({
    "LANG", "LANGUAGE", "TZ", "TERM", "COLORTERM", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "CLICOLOR",
    "CLICOLOR_FORCE", "CI", "DEBIAN_FRONTEND", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING",
    "PYTHONUTF8", "PYTHONHASHSEED", "PYTHONFAULTHANDLER", "SOURCE_DATE_EPOCH", "NODE_ENV", "RUST_BACKTRACE",
    "RUST_LOG", "TIMEFORMAT", "OMP_NUM_THREADS", "TQDM_DISABLE",
})


def harmless_var(name: str, exported: bool) -> bool:
    """True when setting ``name`` cannot change what a command runs or where it writes: an
    allow-listed name (:data:`HARMLESS_VARS`, ``LC_*``), or a lowercase shell variable that is not
    exported (programs never see it). Everything else is a concern: fail closed."""
    if name in HARMLESS_VARS or (name.startswith("LC_") and name[3:].isupper()):
        return True
    return not exported and bool(name) and name == name.lower() and not is_code_var(name)


def var_name(word: str) -> str:
    """The variable an assignment word sets (``PATH+=:/x`` -> ``PATH``, ``a[1]=x`` -> ``a``)."""
    match = re.match(r"[A-Za-z_][A-Za-z0-9_]*", word)
    return match.group(0) if match else ""


@dataclass(frozen=True)
class Grammar:
    """How a program's options are spelled: short letters taking a value, long options taking a
    value, and long flags. Short letters not in ``short_values`` are flags; when ``short_flags``
    is given, a letter in neither is unknown (:func:`option_span` says so)."""

    short_values: str = ""
    long_values: frozenset[str] = frozenset()
    long_flags: frozenset[str] = frozenset()
    short_flags: str | None = None


@dataclass
class Parsed:
    """``positional`` words (index, word) and ``options`` (name, value or None, index of the word
    holding the value) in order; ``unknown`` long options the grammar does not name."""

    positional: list[tuple[int, str]]
    options: list[tuple[str, str | None, int]]
    unknown: list[str]

    def has(self, *names: str) -> bool:
        """True when one of ``names`` was given."""
        return any(option in names for option, _, _ in self.options)

    def values(self, *names: str) -> list[tuple[str, int]]:
        """The values given to ``names`` and the index of the word holding each."""
        return [(value, at) for option, value, at in self.options if option in names and value is not None]


def parse_options(words: list[str], grammar: Grammar, start: int = 1, stop_at_positional: bool = False) -> Parsed:
    """Split ``words[start:]`` into options and positional words, GNU style (options anywhere
    unless ``stop_at_positional``, ``--`` ends them, clusters such as ``-at/x``)."""
    out = Parsed([], [], [])
    i, done = start, False
    while i < len(words):
        word = words[i]
        if done or word == "-" or not word.startswith("-"):
            out.positional.append((i, word))
            if stop_at_positional:
                done = True
        elif word == "--":
            done = True
        elif word.startswith("--"):
            name, eq, value = word.partition("=")
            full = _long(name, grammar)
            if full is None:
                out.unknown.append(name)
                out.options.append((name, value if eq else None, i))
            elif full in grammar.long_values and not eq:
                out.options.append((full, words[i + 1] if i + 1 < len(words) else "", i + 1))
                i += 1
            else:
                out.options.append((full, value if eq else None, i))
        else:
            for k in range(1, len(word)):
                letter = "-" + word[k]
                if word[k] in grammar.short_values:
                    if k + 1 < len(word):
                        out.options.append((letter, word[k + 1 :], i))
                    else:
                        out.options.append((letter, words[i + 1] if i + 1 < len(words) else "", i + 1))
                        i += 1
                    break
                out.options.append((letter, None, i))
        i += 1
    return out


def option_span(words: list[str], i: int, grammar: Grammar) -> tuple[int, list[str], bool]:
    """The option word ``words[i]``: how many words it takes (1 or 2), the option names in it,
    and whether the grammar knows them all."""
    word = words[i]
    if word.startswith("--"):
        name, eq, _ = word.partition("=")
        full = _long(name, grammar)
        if full is None:
            return 1, [name], False
        return (2 if full in grammar.long_values and not eq else 1), [full], True
    names = []
    for k in range(1, len(word)):
        names.append("-" + word[k])
        if word[k] in grammar.short_values:
            return (1 if k + 1 < len(word) else 2), names, True
        if grammar.short_flags is not None and word[k] not in grammar.short_flags:
            return 1, names, False
    return 1, names, True


def _long(name: str, grammar: Grammar) -> str | None:
    known = grammar.long_values | grammar.long_flags
    if name in known:
        return name
    matches = [option for option in known if option.startswith(name)]
    return matches[0] if len(matches) == 1 else None


_TARGET = frozenset({"--target-directory"})
_BACKUP = frozenset({"--backup", "--preserve", "--sparse", "--reflink", "--no-preserve", "--context"})
# file-writing programs: which arguments they write (see commands._Walker.writer_targets)
WRITERS: dict[str, Grammar] = {
    "tee": Grammar("", frozenset(), frozenset({"--append", "--ignore-interrupts", "--output-error"})),
    "touch": Grammar("dtr", frozenset({"--date", "--reference"}), frozenset({"--time", "--no-create",
                                                                             "--no-dereference"})),
    "mkdir": Grammar("m", frozenset({"--mode"}), frozenset({"--parents", "--verbose", "--context"})),
    "rm": Grammar("", frozenset(), frozenset({"--force", "--recursive", "--dir", "--verbose", "--interactive",
                                             "--one-file-system", "--no-preserve-root", "--preserve-root"})),
    "rmdir": Grammar("", frozenset(), frozenset({"--parents", "--verbose", "--ignore-fail-on-non-empty"})),
    "unlink": Grammar(),
    "truncate": Grammar("sr", frozenset({"--size", "--reference"}), frozenset({"--no-create", "--io-blocks"})),
    "shred": Grammar("ns", frozenset({"--iterations", "--size", "--random-source"}),
                     frozenset({"--remove", "--force", "--verbose", "--exact", "--zero"})),
    "chmod": Grammar("", frozenset({"--reference"}), frozenset({"--recursive", "--changes", "--silent", "--quiet",
                                                               "--verbose", "--preserve-root", "--no-preserve-root"})),
    "chown": Grammar("", frozenset({"--reference", "--from"}), frozenset({"--recursive", "--changes", "--silent",
                                                                         "--quiet", "--verbose", "--dereference",
                                                                         "--no-dereference"})),
    "chgrp": Grammar("", frozenset({"--reference"}), frozenset({"--recursive", "--changes", "--silent", "--quiet",
                                                               "--verbose", "--dereference", "--no-dereference"})),
    "cp": Grammar("tS", _TARGET | {"--suffix"}, _BACKUP | {"--no-target-directory", "--archive", "--recursive",
                                                           "--force", "--symbolic-link", "--link", "--no-dereference",
                                                           "--dereference", "--update", "--verbose", "--parents",
                                                           "--interactive", "--no-clobber", "--attributes-only",
                                                           "--remove-destination", "--strip-trailing-slashes",
                                                           "--one-file-system", "--debug"}),
    "mv": Grammar("tS", _TARGET | {"--suffix"}, _BACKUP | {"--no-target-directory", "--force", "--update",
                                                           "--verbose", "--interactive", "--no-clobber",
                                                           "--strip-trailing-slashes", "--exchange", "--debug"}),
    "install": Grammar("tSmog", _TARGET | {"--suffix", "--mode", "--owner", "--group", "--strip-program"},
                       _BACKUP | {"--directory", "--compare", "--preserve-timestamps", "--strip", "--verbose",
                                  "--no-target-directory", "--debug", "--preserve-context"}),
    "ln": Grammar("tS", _TARGET | {"--suffix"}, _BACKUP | {"--symbolic", "--force", "--no-dereference",
                                                           "--relative", "--logical", "--physical", "--verbose",
                                                           "--interactive", "--no-target-directory", "--directory"}),
    "sort": Grammar("oTSktz", frozenset({"--output", "--temporary-directory", "--buffer-size", "--key",
                                         "--field-separator", "--files0-from", "--batch-size", "--parallel",
                                         "--random-source", "--compress-program"}), frozenset()),
    "uniq": Grammar("fsw", frozenset({"--skip-fields", "--skip-chars", "--check-chars"}), frozenset()),
    "split": Grammar("abClnt", frozenset({"--suffix-length", "--bytes", "--line-bytes", "--lines", "--number",
                                          "--separator", "--additional-suffix", "--filter"}), frozenset()),
    "mkfifo": Grammar("m", frozenset({"--mode"}), frozenset()),
    "mknod": Grammar("m", frozenset({"--mode"}), frozenset()),
    "sponge": Grammar(),  # moreutils: soaks up standard input, then writes the file
}
# the writers that write every positional word (the rest are special cases in commands.py)
WRITES_ALL = frozenset({"tee", "touch", "mkdir", "rm", "rmdir", "unlink", "truncate", "shred", "chmod", "chown",
                        "chgrp", "mv", "mkfifo", "mknod", "sponge"})
WRAPPER_GRAMMARS: dict[str, tuple[Grammar, int]] = {
    # name -> (options, positional words before the command)
    # short_flags: the flag letters of GNU coreutils 9 / util-linux 2.39 (--help); others are unknown
    "env": (Grammar("uSC", frozenset({"--unset", "--split-string", "--chdir"}),
                    frozenset({"--ignore-environment", "--null", "--debug"}), "i0v"), 0),
    "nice": (Grammar("n", frozenset({"--adjustment"}), frozenset(), "0123456789"), 0),
    "timeout": (Grammar("sk", frozenset({"--signal", "--kill-after"}), frozenset({"--preserve-status",
                                                                                  "--foreground", "--verbose"}),
                        "v"), 1),
    "stdbuf": (Grammar("ioe", frozenset({"--input", "--output", "--error"}), frozenset(), ""), 0),
    "nohup": (Grammar(short_flags=""), 0),
    "setsid": (Grammar("", frozenset(), frozenset({"--ctty", "--fork", "--wait"}), "cfw"), 0),
    "command": (Grammar(short_flags="pvV"), 0),
    "sudo": (Grammar("ugCDhprtU", frozenset({"--user", "--group", "--chdir", "--host", "--prompt", "--role",
                                             "--type", "--other-user", "--close-from"}), frozenset()), 0),
    "doas": (Grammar("uC", short_flags="Lns"), 0),
    "exec": (Grammar("a", short_flags="cl"), 0),
    "xargs": (Grammar("InPLdEsa", frozenset({"--arg-file", "--max-args", "--max-procs", "--max-lines",
                                                "--delimiter", "--eof", "--replace", "--max-chars",
                                                "--process-slot-var"}), frozenset({"--null", "--no-run-if-empty",
                                                                                   "--verbose", "--interactive",
                                                                                   "--exit", "--open-tty"})), 0),
    "ionice": (Grammar("cnpPu", frozenset({"--class", "--classdata", "--pid", "--pgid", "--uid"}),
                       frozenset({"--ignore"}), "t"), 0),
}
# wrapper options after which the wrapped command is not what the words say
WRAPPER_OPAQUE_OPTIONS = {
    "env": frozenset({"-S", "--split-string", "-C", "--chdir"}),
    "command": frozenset({"-v", "-V"}),
    "ionice": frozenset({"-p", "-P", "-u", "--pid", "--pgid", "--uid"}),
    "sudo": frozenset({"-D", "--chdir", "-i", "-s", "--login", "--shell", "-e", "--edit"}),
}
