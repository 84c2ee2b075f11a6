"""Rule 6 of :mod:`.secret_shapes`: the secret arguments of well-known programs (``mysql -p***``,
``sshpass -p ***``, ``redis-cli -a ***``, ``docker login -p ***``, ``-u user:***``, ...) and a value
echoed into a program that reads a password from its input (``echo *** | sudo -S``).
:func:`mask_program_secrets` is linear in the text: a program and its option are looked for apart,
each once per simple command.
"""

from __future__ import annotations

import re

MASK = "***"
"""What a masked secret becomes (the text around it stays)."""

_ARG = r"(?![\"']?\*\*\*[\"']?(?![^\s\"'|;&]))"  # not a value masked already (so a repeated option is found)
_VALUE = r"(\"[^\"\n]*\"?|'[^'\n]*'?|[^\s\"'|;&-][^\s\"'|;&]*)"  # a word, quoted or not
_FILLED = r"(\"[^\"\n]+\"?|'[^'\n]+'?|[^\s\"'|;&-][^\s\"'|;&]*)"  # a word, quoted or not, not an empty ''
_ATTACHED = r"(\"[^\"\n]*\"?|'[^'\n]*'?|[^\s\"'|;&]+)"  # a value attached to its option: -pVALUE
_COMMAND_PART = re.compile(r"\"[^\"\n]*\"|'[^'\n]*'|[|;&\n]")  # a quoted string, or where a simple command ends
# (words one of which the text must hold, program, option): in a simple command that names the
# program, every value of the option after it is masked. The words skip an entry cheaply; the
# program and the option are looked for apart, each once per command, so the time is linear in the
# text (one pattern "program, any text, option" retried from each program name was quadratic:
# ``mysql `` 100,000 times took minutes).
_PROGRAM_OPTIONS = [
    # mysql's password is attached to -p (a separate word after -p is the database)
    (("mysql", "mariadb"), re.compile(
        r"\b(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlshow|mysqlcheck|mariadb|mariadb-dump|mariadb-admin)\b"),
     re.compile(r"(\s-p)" + _ARG + r"(\"[^\"\n]*\"?|'[^'\n]*'?|[^\s\"'|;&]+)")),  # -p'...' quoted too
    (("sshpass", "mongo"), re.compile(r"\b(?:sshpass|mongo|mongosh|mongodump|mongorestore|mongoexport|mongoimport)\b"),
     re.compile(r"(\s-p\s*)" + _ARG + _VALUE)),
    (("login",), re.compile(r"\b(?:docker|podman|nerdctl|helm|buildah|skopeo|az)\s+(?:registry\s+|acr\s+)?login\b"),
     re.compile(r"(\s-p\s*)" + _ARG + _VALUE)),
    (("redis-cli",), re.compile(r"\bredis-cli\b"), re.compile(r"(\s-a\s*)" + _ARG + _VALUE)),
    (("ldap",), re.compile(r"\bldap(?:search|modify|add|delete|whoami|passwd|compare|modrdn)\b"),
     re.compile(r"(\s-w\s*)" + _ARG + _VALUE)),
    (("smbclient",), re.compile(r"\bsmbclient\b"),
     re.compile(r"(\s(?:-U|--user)(?:\s+|=)?[\"']?[^\s\"'%]*%)" + _ARG + r"([^\s\"']+)")),
    # SQL Server's and Sybase's command-line tools: -P password
    (("sqlcmd", "bcp", "osql", "isql"), re.compile(r"\b(?:sqlcmd|bcp|osql|isql)\b"),
     re.compile(r"(\s-P\s*)" + _ARG + _VALUE)),
    # zip -P password (not a name ending in .zip)
    (("zip",), re.compile(r"(?<![\w.-])(?:zip|unzip|zipcloak)\b"), re.compile(r"(\s-P\s*)" + _ARG + _VALUE)),
    (("7z",), re.compile(r"(?<![\w.-])7z[ar]?\b"), re.compile(r"(\s-p)" + _ARG + _ATTACHED)),  # 7z -pSECRET
    # openssl enc -k passphrase (-kfile names a file; -pass pass:... is below)
    (("openssl",), re.compile(r"\bopenssl\b"), re.compile(r"(\s-k\s+)" + _ARG + _VALUE)),
    # ssh-keygen -N new_passphrase, -P old_passphrase (an empty '' is left as it is)
    (("ssh-keygen",), re.compile(r"\bssh-keygen\b"), re.compile(r"(\s-[NP]\s*)" + _ARG + _FILLED)),
    # sqlplus user/password@db
    (("sqlplus",), re.compile(r"\bsqlplus\b"), re.compile(r"(\s[\"']?[A-Za-z][\w$#]*/)" + _ARG + r"([^\s@\"'/|;&]+)")),
    (("lftp",), re.compile(r"\blftp\b"), re.compile(r"(\s-u\s+[\"']?[^\s,\"']*,)" + _ARG + r"([^\s\"']+)")),
    # a here-string into a program that reads a password or token from its input
    (("<<<",), re.compile(r"--password-stdin|--passphrase-stdin|--with-token|\b(?:ch)?passwd\b|\bsudo\s+-[A-Za-z]*S"),
     re.compile(r"(<<<[ \t]*)" + _ARG + _FILLED)),
]
_PROGRAM_SECRETS = [  # (words one of which the text must hold, pattern): the words skip a pattern cheaply
    # curl, wget and others: -u user:password (docker's -u uid:gid loses its gid: harmless)
    (("-u", "-U", "--user", "--proxy-user", "--http-user"), re.compile(
        r"((?<!\S)(?:-u|-U|--user|--proxy-user|--http-user)(?:[ \t]+|=)?[\"']?[^\s\"':/@]*:)(?!/)" + _ARG
        + r"([^\s\"']+)")),
    (("-pass",), re.compile(r"(\s-pass(?:in|out)?\s+[\"']?pass:)" + _ARG + r"([^\s\"']+)")),
]
# a password echoed into a program that reads it from standard input: the command after the pipe
# (group 3) is looked at by _reads_password
_ECHOED = (("-stdin", "sudo", "chpasswd", "--passphrase-fd", "--with-token"), re.compile(
    r"(\b(?:echo(?:[ \t]+-[neE]{1,3})?|printf(?:[ \t]+(?:'%s[^'\n]*'|\"%s[^\"\n]*\"|%s\S*))?)[ \t]+)"
    + _ARG + r"(\"[^\"\n]*+\"|\"[^\"\n|]*+|'[^'\n]*+'|'[^'\n|]*+|[^\s\"'|;&-][^\s\"'|;&]*+)"  # possessive: no
    + r"(?=[ \t]*\|([^|;&\n]*))"))  # retry of the look-ahead per character of a long value
_READS_PASSWORD = re.compile(r"--password-stdin|--passphrase-stdin|--passphrase-fd|--with-token|\bchpasswd\b")
_SUDO = re.compile(r"\bsudo\b")
_SUDO_STDIN = re.compile(r"\s(?:-[A-Za-z]*S[A-Za-z]*|--stdin)\b")  # -S, -kS, --stdin
_PASSWD = re.compile(r"\bpasswd\b")
_PASSWD_STDIN = re.compile(r"--stdin")


# htpasswd -b [-c -B ...] FILE USER PASSWORD, htpasswd -nb USER PASSWORD: the password is the
# command's last word (before a redirection)
_HTPASSWD = re.compile(r"\bhtpasswd\b")
_WORD = re.compile(r"\"[^\"\n]*\"?|'[^'\n]*'?|[^\s\"']+")
_REDIRECT = re.compile(r"\d*[<>]")


def mask_program_secrets(text: str) -> str:
    """``text`` with the secret arguments of the programs above masked. Pure."""
    for words, program, option in _PROGRAM_OPTIONS:
        if any(word in text for word in words):
            text = _mask_program_options(text, program, option)
    if "htpasswd" in text:
        text = _mask_htpasswd(text)
    for words, pattern in _PROGRAM_SECRETS:
        if any(word in text for word in words):
            text = pattern.sub(_program_value, text)
    if any(word in text for word in _ECHOED[0]):
        text = _ECHOED[1].sub(_echoed_value, text)
    return text


def _program_value(match: re.Match[str]) -> str:
    value = match.group(2)
    quote = value[0] if value[0] in "\"'" else ""
    return f"{match.group(1)}{quote}{MASK}{quote if value.endswith(quote) and len(value) > 1 else ''}"


def _mask_program_options(text: str, program: re.Pattern[str], option: re.Pattern[str]) -> str:
    """``text`` with each ``option`` value that follows ``program`` in one simple command masked.
    Linear: each command is searched from its first program name on, once."""
    out: list[str] = []
    done = 0  # text[:done] is in ``out``
    pos = 0
    while (named := program.search(text, pos)) is not None:
        command_end = _command_end(text, named.end())
        at = named.end()
        while (found := option.search(text, at, command_end)) is not None:
            found = option.match(text, found.start())  # again without the end: a quoted value may hold "|;&"
            if found is None:  # cannot be: the option matched with less text
                break
            out.append(text[done:found.start()])
            out.append(_program_value(found))
            done = at = found.end()
            if at > command_end:  # an unclosed quoted value held "|;&": the command goes on after it
                command_end = _command_end(text, at)
        pos = max(command_end, at)
    out.append(text[done:])
    return "".join(out)


def _mask_htpasswd(text: str) -> str:
    """``text`` with the password of each ``htpasswd -b`` masked: the last word of its command
    that is not a redirection. Linear: each command is read once."""
    out: list[str] = []
    done = pos = 0
    while (named := _HTPASSWD.search(text, pos)) is not None:
        end = _command_end(text, named.end())
        pos = max(end, named.end())
        words = list(_WORD.finditer(text, named.end(), end))
        flags = [w.group() for w in words if w.group().startswith("-")]
        if not any("b" in flag[1:] and not flag.startswith("--") for flag in flags):
            continue
        while words and (_REDIRECT.match(words[-1].group())
                         or (len(words) > 1 and _REDIRECT.fullmatch(words[-2].group()))):
            words.pop()  # "> out", "2>/dev/null"
        if len(words) < 3 or words[-1].group().startswith("-") or words[-1].group() == MASK:
            continue
        last = words[-1]
        value = last.group()
        quote = value[0] if value[0] in "\"'" else ""
        out.append(text[done:last.start()])
        out.append(f"{quote}{MASK}{quote if value.endswith(quote) and len(value) > 1 else ''}")
        done = last.end()
    out.append(text[done:])
    return "".join(out)


def _command_end(text: str, start: int) -> int:
    """Where the simple command going on at ``start`` ends: the first ``| ; &`` or new line outside
    quotes (``mysql -e "a; b" -pX`` is one command), or the text's end."""
    for part in _COMMAND_PART.finditer(text, start):
        if part.group()[0] not in "\"'":
            return part.start()
    return len(text)


def _echoed_value(match: re.Match[str]) -> str:
    """The echoed value masked when the command after the pipe reads a password from its input."""
    consumer = match.group(3)
    reads = _READS_PASSWORD.search(consumer) is not None
    if not reads and (sudo := _SUDO.search(consumer)) is not None:
        reads = _SUDO_STDIN.search(consumer, sudo.end()) is not None
    if not reads and (passwd := _PASSWD.search(consumer)) is not None:
        reads = _PASSWD_STDIN.search(consumer, passwd.end()) is not None
    return _program_value(match) if reads else match.group(0)
