"""Programs whose options or subcommands run other programs, for :mod:`.programs`: ``git``
(global options, subcommands that talk to remotes or start programs), ``make`` (``--eval``,
variable overrides), ``sysctl`` (writes kernel settings), package runners (``npx``, ``npm exec``,
``pipx run``, ...), ``cargo --config`` and ``set -a``.

The line drawn (docs/policy.md, "Programs that run programs"): running a project's own code from
the workspace (``make``, ``npm test``, ``cargo run``, ``pip install .``, ``python script.py``) is
decided by the patterns, like any program, and contained by the sandbox; an option or subcommand
that runs a program or code *named on the command line* or *fetched from elsewhere* (a remote's
``--upload-pack``, ``make --eval``, ``npx pkg``), or that the policy cannot parse, is a concern.
Sources: git(1) and git-fetch/-clone/-ls-remote/-archive/-grep(1) of git 2.4x, GNU make 4.4
manual ("Overriding Variables", "Options Summary"), procps sysctl(8), npm-exec(1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .code_runners import generic
from .commands import Segment, Word

if TYPE_CHECKING:
    from .commands import Walker

# git(1) global options that change neither which repository is used nor what runs
GIT_SAFE_GLOBALS = frozenset({
    "--no-pager", "-P", "--no-replace-objects", "--literal-pathspecs", "--glob-pathspecs", "--noglob-pathspecs",
    "--icase-pathspecs", "--no-optional-locks", "--no-advice", "--no-lazy-fetch", "--version",
})
GIT_VALUED_GLOBALS = frozenset({"-c", "-C", "--config-env", "--git-dir", "--work-tree", "--namespace",
                                "--super-prefix", "--exec-path", "--list-cmds", "--attr-source"})
# subcommands that talk to another repository (its transport runs ssh, upload-pack, remote helpers,
# remote.*.uploadpack) or start programs by design
GIT_RUNS_PROGRAMS = frozenset({
    "fetch", "pull", "push", "clone", "ls-remote", "send-pack", "fetch-pack", "upload-pack", "receive-pack",
    "upload-archive", "http-fetch", "http-push", "daemon", "instaweb", "http-backend", "shell", "credential",
    "credential-store", "credential-cache", "web--browse", "imap-send", "send-email", "svn", "p4", "cvsimport",
    "cvsserver", "cvsexportcommit", "difftool", "mergetool", "filter-branch", "request-pull", "remote-ext",
    "remote-fd", "bundle", "maintenance", "gc", "fsmonitor--daemon",
})
# long options (any unique prefix is accepted by git's parse-options) that run a program
GIT_PROGRAM_OPTIONS = ("--upload-pack", "--receive-pack", "--exec", "--open-files-in-pager", "--template",
                       "--remote", "--config", "--extcmd", "--tool", "--separate-git-dir")
MAKES = frozenset({"make", "gmake", "bmake", "pmake", "remake"})
PACKAGE_RUNNERS = frozenset({"npx", "bunx", "pnpx", "uvx", "pipx"})
NODE_MANAGERS = frozenset({"npm", "pnpm", "yarn", "bun"})


def git(w: Walker, name: str, words: list[Word], text: str) -> None:
    """Parse away the safe global options, check the subcommand as git runs it (deny rules see
    ``git push`` in ``git --no-pager push``), and raise concerns for what runs programs."""
    from .programs import probe_words

    texts = [x.text for x in words]
    i, unsafe = 1, []
    while i < len(texts) and texts[i].startswith("-"):
        word = texts[i]
        if words[i].dynamic:
            unsafe.append(word)
            break
        if word not in GIT_SAFE_GLOBALS:
            unsafe.append(word)
        i += 2 if word in GIT_VALUED_GLOBALS else 1
    if unsafe:
        w.concern(text, f"runs git with the global option(s) {' '.join(unsafe)}, which change the repository, "
                        "configuration or programs git uses")
    if i >= len(texts):
        return
    sub, args = texts[i], texts[i + 1:]
    if i > 1:  # what git runs once its global options are set aside
        w.segment(Segment(("git", *texts[i:]), text, (), tuple(x.dynamic for x in [words[0], *words[i:]]),
                          "git", bool(unsafe) or w.probe))
    if words[i].dynamic:
        w.concern(text, "the git subcommand is known only at run time")
        probe_words(w, name, words, text)
        return
    _git_subcommand(w, sub, args, text)
    for k in range(i + 1, len(texts)):
        word = texts[k]
        if word.startswith("--output="):
            w.add_write(Word(word.split("=", 1)[1], words[k].dynamic), text)
        elif (word == "--output" or (word == "-o" and sub in ("format-patch", "archive"))) and k + 1 < len(texts):
            w.add_write(words[k + 1], text)
        elif word.startswith("-o") and not word.startswith("--") and len(word) > 2 and sub in ("format-patch",
                                                                                               "archive"):
            w.add_write(Word(word[2:], words[k].dynamic), text)
    if unsafe or sub in GIT_RUNS_PROGRAMS:
        probe_words(w, name, words, text)
    generic(w, name, words, text)


def _git_subcommand(w: Walker, sub: str, args: list[str], text: str) -> None:
    reads = {"--get", "--get-all", "--get-regexp", "--list", "-l", "--show-origin", "--get-urlmatch"}
    if sub == "config" and not reads & set(args):
        w.concern(text, "changes git configuration, which later git commands run (aliases, hooks, pagers)")
    if sub in GIT_RUNS_PROGRAMS:
        w.concern(text, f"`git {sub}` talks to another repository or starts programs (transports, helpers, "
                        "tools), which the policy does not follow")
    if sub == "remote" and args and args[0] not in ("-v", "--verbose", "get-url"):
        w.concern(text, "`git remote` changes or contacts remotes, which later git commands run")
    if sub == "submodule" and args and args[0] not in ("status", "summary"):
        w.concern(text, "`git submodule` fetches, checks out or runs commands (`foreach`, `update=!cmd`)")
    if sub in ("rebase", "bisect") and ({"run", "--exec"} & set(args) or any(
            a.startswith("-") and not a.startswith("--") and "x" in a for a in args)):
        w.concern(text, f"`git {sub}` runs commands given to it")
    if sub == "grep" and any(a.startswith("-") and not a.startswith("--") and "O" in a for a in args):
        w.concern(text, "`git grep -O` opens the matches with a program given to it")
    if sub == "help" and {"-w", "--web", "-i", "--info"} & set(args):
        w.concern(text, "`git help` starts a browser or viewer")
    for arg in args:
        option = arg.split("=", 1)[0]
        if len(option) > 3 and any(full.startswith(option) for full in GIT_PROGRAM_OPTIONS):
            w.concern(text, f"`git {sub} {option}` names a program, template or configuration git runs")
    if sub in ("checkout", "switch", "reset", "restore", "stash", "pull", "merge", "am", "apply", "clone",
               "cherry-pick", "rebase", "revert", "worktree", "read-tree", "checkout-index"):
        w.found.links.append((text, False))  # the work tree it writes may hold symbolic links


def make(w: Walker, name: str, words: list[Word], text: str) -> None:
    """``make --eval``/``-E`` adds makefile text; a ``VAR=value`` argument overrides any variable
    of the makefile (``SHELL``, ``MAKEFLAGS``, ``CC``: all are commands a recipe may run)."""
    from .programs import probe_words

    for word in words[1:]:
        t = word.text
        if t.startswith("--") and len(t.split("=", 1)[0]) > 3 and "--eval".startswith(t.split("=", 1)[0]):
            w.concern(text, f"`{name} --eval` runs makefile text given on the command line")
            probe_words(w, name, words, text)
        elif t.startswith("-") and not t.startswith("--") and "E" in t:
            w.concern(text, f"`{name} -E` runs makefile text given on the command line")
            probe_words(w, name, words, text)
        elif not t.startswith("-") and "=" in t and t.split("=", 1)[0].rstrip(":+?!").replace("_", "a").isalnum():
            w.concern(text, f"`{name} {t.split('=', 1)[0]}=` overrides a makefile variable, which can change "
                            "the commands its recipes run")
    generic(w, name, words, text)


def sysctl(w: Walker, name: str, words: list[Word], text: str) -> None:
    """``sysctl -w a.b=v`` or ``sysctl a.b=v`` writes ``/proc/sys/a/b``; ``-p``/``--system``
    load settings from files: writes outside the workspace."""
    for word in words[1:]:
        t = word.text
        if word.dynamic:
            w.add_write(Word("/proc/sys", True), text)
        elif t in ("-p", "--load", "--system") or t.startswith(("--load=", "-p")) or (
                t.startswith("-") and not t.startswith("--") and "p" in t):
            w.add_write(Word("/proc/sys"), text)
        elif "=" in t and not t.startswith("-"):
            w.add_write(Word("/proc/sys/" + t.split("=", 1)[0].replace(".", "/").lstrip("/")), text)


def package_runner(w: Walker, name: str, words: list[Word], text: str) -> None:
    """``npx pkg``, ``npm exec``, ``pnpm dlx``, ``pipx run``: run a package named on the command
    line, perhaps fetched, or a ``-c`` shell string; ``--script-shell``/``--node-options`` name
    programs. Project scripts (``npm test``, ``npm run build``) are left to the patterns."""
    from .programs import probe_words

    texts = [x.text for x in words]
    runs = name in PACKAGE_RUNNERS and (name != "pipx" or "run" in texts[1:2])
    if name in NODE_MANAGERS:
        subs = [t for t in texts[1:] if not t.startswith("-")]
        runs = bool(subs) and subs[0] in ("exec", "x", "dlx", "create", "init") or (name == "bun" and bool(subs)
                                                                                     and subs[0] == "x")
    if runs:
        w.concern(text, f"`{name}` runs a package named on the command line, which may be fetched and whose "
                        "code the policy cannot read")
    risky = ("-c", "--call", "--script-shell", "--node-options", "--shell", "--userconfig", "--globalconfig")
    if any(t.split("=", 1)[0] in risky for t in texts[1:]):
        w.concern(text, f"`{name}` is given a command string, shell or configuration that runs programs")
    if runs or any(t.split("=", 1)[0] in risky for t in texts[1:]):
        probe_words(w, name, words, text)
    generic(w, name, words, text)


def cargo(w: Walker, name: str, words: list[Word], text: str) -> None:
    """``cargo --config k=v`` can set ``target.*.runner`` or ``build.rustc-wrapper``: programs."""
    if any(x.text.split("=", 1)[0] in ("--config", "-Z") for x in words[1:]):
        w.concern(text, "`cargo --config` sets configuration that names programs cargo runs")
    generic(w, name, words, text)


def set_builtin(w: Walker, name: str, words: list[Word], text: str) -> None:
    """``set -a`` / ``-o allexport`` exports every later assignment; ``set -k`` takes assignments
    anywhere in a command: either hides which variables programs see."""
    texts = [x.text for x in words[1:]]
    if any(x.dynamic for x in words[1:]) or any(t.startswith("-") and not t.startswith("--") and ("a" in t or "k" in t)
                                                 for t in texts) or {"allexport", "keyword"} & set(texts):
        w.concern(text, "`set` exports later assignments or changes how the shell reads them")


HANDLERS = {"git": git, "sysctl": sysctl, "cargo": cargo, "set": set_builtin,
            **{m: make for m in MAKES}, **{p: package_runner for p in PACKAGE_RUNNERS | NODE_MANAGERS}}


# package installers: a package *named* on the command line is fetched and its build or install
# scripts run (setup.py, npm lifecycle scripts, build.rs); local paths (the project) are left
# to the patterns. name -> (subcommands that install, options that take a value)
INSTALLERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "pip": (frozenset({"install", "download", "wheel"}), frozenset({
        "-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url", "-f",
        "--find-links", "-t", "--target", "--prefix", "--root", "--src", "--platform", "--python-version",
        "--implementation", "--abi", "--progress-bar", "--upgrade-strategy", "--no-binary", "--only-binary", "--log",
        "--cache-dir", "--proxy", "--retries", "--timeout", "--exists-action", "--trusted-host", "--cert",
        "--client-cert", "--report", "--python", "-d", "--dest", "-w", "--wheel-dir", "-C", "--config-settings"})),
    "npm": (frozenset({"install", "i", "add", "isntall", "in", "ins", "inst", "insta", "instal", "update", "up"}),
            frozenset({"--prefix", "--registry", "--tag", "-w", "--workspace", "--omit", "--include"})),
    "pnpm": (frozenset({"add", "install", "i", "update", "up"}), frozenset({"--filter", "-F", "--dir", "-C"})),
    "yarn": (frozenset({"add", "global"}), frozenset({"--cwd"})),
    "bun": (frozenset({"add", "install", "i"}), frozenset({"--cwd"})),
    "cargo": (frozenset({"install"}), frozenset({"--version", "--root", "--path", "--git", "--branch", "--tag",
                                                  "--rev", "--bin", "--example", "--target", "-j", "--jobs",
                                                  "--features", "-F", "--profile", "--index", "--registry"})),
    "go": (frozenset({"install", "get", "run"}), frozenset({"-C", "-p", "-o", "-tags", "-ldflags", "-gcflags",
                                                           "-mod", "-modfile", "-pkgdir"})),
    "gem": (frozenset({"install", "i"}), frozenset({"-v", "--version", "-i", "--install-dir", "-s", "--source"})),
}


def named_packages(name: str, words: list[Word]) -> list[str]:
    """Packages ``words`` name for an installer (see :data:`INSTALLERS`): positional words after
    the install subcommand that are not local paths (``.``, ``./x``, ``../x``, ``/x``)."""
    key = "pip" if name in ("pip", "pip3") else name
    if key not in INSTALLERS:
        return []
    subs, valued = INSTALLERS[key]
    texts = [x.text for x in words]
    positional, i = [], 1
    while i < len(texts):
        t = texts[i]
        if t.startswith("-"):
            if t in valued:
                i += 1
        else:
            positional.append(t)
        i += 1
    if not positional or positional[0] not in subs:
        return []
    rest = positional[1:]
    if key == "cargo" and ("--git" in texts or "--index" in texts):
        rest = rest or ["(from --git)"]
    if key == "go":
        return [p for p in rest if "@" in p or (positional[0] == "get" and not p.startswith((".", "/")))]
    editable = [texts[k + 1] for k, t in enumerate(texts[:-1]) if t in ("-e", "--editable")]
    return [p for p in rest + editable if not (p in (".", "..") or p.startswith(("./", "../", "/")))]


def installer(w: Walker, name: str, words: list[Word], text: str) -> None:
    """``pip install requests``, ``npm i left-pad``, ``cargo install x``, ``go install x@v``:
    fetched code runs (build and install scripts): a concern. Installing the project itself
    (``pip install -e .``, ``npm install`` from its lock file) is left to the patterns."""
    names = named_packages(name, words)
    if names:
        w.concern(text, f"`{name}` fetches and builds {', '.join(names[:3])}, whose install scripts run code "
                        "the policy cannot read")
    if name == "go" and any(x.text.lstrip("-").split("=", 1)[0] in ("toolexec", "exec") for x in words[1:]):
        w.concern(text, "`go -toolexec`/`-exec` runs the program it is given")
    if name == "go" and len(words) > 2 and words[1].text == "env" and any(x.text == "-w" for x in words[2:]):
        w.concern(text, "`go env -w` changes settings (GOFLAGS) later go commands run")
    if name in ("npm", "pnpm", "yarn", "bun"):
        package_runner(w, name, words, text)
    elif name == "cargo":
        cargo(w, name, words, text)
    else:
        generic(w, name, words, text)


def maven(w: Walker, name: str, words: list[Word], text: str) -> None:
    """``mvn exec:exec`` runs ``-Dexec.executable``; ``gradle --init-script`` runs a script named
    on the command line."""
    texts = [x.text for x in words[1:]]
    if any(t.startswith("exec:") or t.startswith(("-Dexec.", "-I", "--init-script")) for t in texts):
        w.concern(text, f"`{name}` runs a program or script named on the command line")
    generic(w, name, words, text)


HANDLERS.update({name: installer for name in ("pip", "pip3", "npm", "pnpm", "yarn", "bun", "cargo", "go", "gem")})
HANDLERS.update({name: maven for name in ("mvn", "gradle")})


# programs that change the running system (kernel modules, mounts, power, swap, disks, clock,
# network, SELinux) rather than files: writes outside the workspace, like `sysctl -w`
SYSTEM_WRITERS = frozenset({
    "modprobe", "insmod", "rmmod", "kexec", "reboot", "shutdown", "poweroff", "halt", "telinit", "init",
    "swapon", "swapoff", "mkswap", "umount", "losetup", "dmsetup", "wipefs", "fdisk", "sfdisk", "parted",
    "setenforce", "iptables", "ip6tables", "nft", "tc", "setcap", "chattr", "mkfs", "mke2fs", "mkfs.ext4",
    "mkfs.xfs", "mkfs.vfat", "mkfs.btrfs", "blockdev", "hdparm", "pivot_root", "switch_root", "sysrq",
})
# ... only when given arguments or these options (without them they only print)
SYSTEM_WRITERS_WITH = {"mount": None, "hostname": None, "date": ("-s", "--set"), "hwclock": (
    "-w", "--systohc", "--set", "-s", "--hctosys"), "timedatectl": ("set-time", "set-timezone", "set-ntp"),
                       "dmesg": ("-c", "-C", "--clear", "--read-clear", "-n", "--console-level", "-D", "-E")}


def system_writer(w: Walker, name: str, words: list[Word], text: str) -> None:
    """A program that changes kernel or machine state: recorded as a write to ``/``, outside
    every workspace, so the engine denies it (the sandbox, without capabilities, refuses it too)."""
    texts = [x.text for x in words[1:]]
    spec = SYSTEM_WRITERS_WITH.get(name, ())
    if name in SYSTEM_WRITERS or (
            spec is None and [t for t in texts if not t.startswith("-")]) or (
            spec and any(t.split("=", 1)[0] in spec or (t.startswith("-") and not t.startswith("--") and any(
                f"-{c}" in spec for c in t[1:])) for t in texts)):
        w.add_write(Word("/"), text)
    else:
        generic(w, name, words, text)


HANDLERS.update({name: system_writer for name in SYSTEM_WRITERS | set(SYSTEM_WRITERS_WITH)})
