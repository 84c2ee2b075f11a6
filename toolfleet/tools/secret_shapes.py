"""What a secret looks like in text, and masking it there: the value goes, the text around stays.

:func:`mask_secrets` replaces each secret it recognises with ``***`` and leaves every other
character where it was (``--password=***``, ``redis://:***@host``, ``Authorization: Bearer ***``).
It recognises, in this order:

1. values the caller knows are secret (``known``: e.g. the arguments of a call named ``password``),
   wherever they appear;
2. private key blocks (PEM and PGP: the body between ``BEGIN``/``END`` lines, or to the end of a
   truncated text);
3. token shapes, whatever surrounds them: OpenAI/Anthropic ``sk-…``, Stripe ``sk_live_…``, GitHub
   ``ghp_…``/``github_pat_…``, GitLab ``glpat-…``, Slack ``xox?-…`` and webhook paths, AWS key ids
   ``AKIA…``/``ASIA…``, Google ``AIza…``/``ya29.…``, JWTs ``eyJ….eyJ….…``, npm, PyPI, Hugging Face,
   SendGrid, DigitalOcean and Shopify tokens, HashiCorp Vault ``hvs.…``/``hvb.…``, Slack ``xapp-…``,
   age ``AGE-SECRET-KEY-1…``; webhook URLs whose path is the credential (Discord
   ``/api/webhooks/<id>/***``, Teams ``/IncomingWebhook/***``, Telegram ``/bot<id>:***``);
4. credentials in URLs (``scheme://user:***@host``, also with an empty user), ``sig=`` in query strings;
5. ``Authorization``/``Proxy-Authorization`` header values (the scheme word kept), ``Cookie``/``Set-Cookie``
   values (the cookie names kept);
6. secret arguments of well-known programs (:mod:`.secret_programs`): ``mysql -p***``, ``sshpass -p ***``,
   ``redis-cli -a ***``,
   ``mongosh -p ***``, ``ldapsearch -w ***``, ``docker login -p ***``, ``az login -p ***``,
   ``-u user:***`` (curl and others),
   ``smbclient -U user%***``, ``openssl -passin pass:***``, ``openssl enc -k ***``, ``sqlcmd -P ***``
   (``bcp``, ``osql``, ``isql``), ``zip -P ***``, ``7z -p***``, ``ssh-keygen -N ***``,
   ``htpasswd -b file user ***``, ``sqlplus user/***@db``, ``lftp -u user,***``; a value echoed or
   here-string'ed into a program that reads a password from its input (``echo *** | docker login
   --password-stdin``, ``| sudo -S``, ``| chpasswd``, ``| passwd --stdin``, ``gh auth login
   --with-token <<< ***``);
7. options and assignments whose name is a secret (:func:`is_secret_name`): ``--password=***``,
   ``--password ***``, ``-storepass ***``, ``PGPASSWORD=***``, ``export SECRET_KEY=***``,
   ``"password": "***"``, ``'token': '***'``, ``api_key: ***``, ``X-Api-Key: ***``, ``?access_token=***&``;
   and, without a separator, ``aws_secret_access_key ***`` when the value looks like a credential
   (6+ characters with a digit, an inner capital or a symbol: so ``token count`` stays prose);
8. ``Bearer``/``Basic`` followed by a credential-looking value anywhere.

Quoted values are masked to their closing quote (spaces and all); unquoted ones end at white space,
a quote, ``& ; , < > ( ) [ ] { }`` or a backslash. Known limits: a password with a ``/`` in a URL
(not valid there: RFC 3986 wants it percent-encoded), a bare ``password word`` without a digit,
capital or symbol, and secrets of no known shape under no secret name are not recognised.

Patterns follow the rules of gitleaks and detect-secrets (which we do not depend on: their scanners
are built to find secrets in files, with entropy rules that would mask every commit hash here).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any
from urllib.parse import quote, quote_plus

from .secret_programs import MASK, mask_program_secrets

_SECRET_PARTS = frozenset(
    {"password", "passwd", "passphrase", "pass", "pwd", "pw", "secret", "secrets", "token", "apikey", "credential",
     "credentials", "authorization", "auth", "cookie", "privatekey", "accesskey", "secretkey", "sessionid", "otp",
     "signature", "bearer", "storepass", "keypass", "srcstorepass", "deststorepass", "srckeypass", "destkeypass",
     "passin", "passout", "apitoken", "privkey", "sshpass"}
)
# a name part ending in one of these is a secret too: PGPASSWORD, csrftoken, clientsecret, dbpasswd
_SECRET_SUFFIXES = ("password", "passwd", "passphrase", "secret", "token", "apikey", "privatekey", "secretkey",
                    "accesskey")
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key"),
                           ("session", "id"), ("client", "secret"), ("account", "key"), ("signing", "key"),
                           ("encryption", "key"), ("master", "key"), ("shared", "key"), ("session", "key"),
                           ("subscription", "key")})  # Azure's Ocp-Apim-Subscription-Key
# ...unless the name ends in a word that says the value is not the secret itself: password_file, token_count
_NOT_SECRET_LAST = frozenset({"file", "path", "dir", "stdin", "env", "count", "length", "len", "type", "mode",
                              "name", "field", "expiry", "expires", "ttl", "url", "uri", "endpoint", "prompt",
                              "policy", "hint", "min", "max", "limit", "size", "required", "set", "enabled",
                              "cmd", "command", "helper", "var", "header", "format", "reset"})
_NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD"})  # the shell's working directories
_HEADER_NAMES = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})  # masked as headers
_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
# a name that may be a secret's (the cheap test; is_secret_name decides), bounded so no text is slow
_HINT_WORDS = "pass|pw|secret|token|key|auth|cookie|credential|otp|signature|bearer|session|priv"
_NAME = r"(?=[\w.-]{0,255}?(?i:" + _HINT_WORDS + "))"


def is_secret_name(name: object) -> bool:
    """True when a parameter, option, header or variable called ``name`` holds a credential, by
    whole name parts: ``password``, ``pass``, ``api_key``, ``apiKey``, ``X-Auth-Token``,
    ``PGPASSWORD``, ``aws_secret_access_key``, upper-case ``*_KEY`` are; ``max_tokens``, ``keyboard``,
    ``author``, ``bypass``, ``password_file``, ``PWD`` are not. Names of up to 256 characters are
    decided once per process (the same keys come with every call)."""
    if not isinstance(name, str):
        return False
    return _is_secret_short(name) if len(name) <= 256 else _is_secret_str(name)


@lru_cache(maxsize=8192)
def _is_secret_short(name: str) -> bool:
    return _is_secret_str(name)


def _is_secret_str(name: str) -> bool:
    if name in _NOT_SECRET_NAMES:
        return False
    parts = [p.lower() for p in _SPLIT.split(name) if p]
    if not parts:
        return False
    if len(parts) > 1 and parts[-1] in _NOT_SECRET_LAST:
        return False
    if any(p in _SECRET_PARTS or p.endswith(_SECRET_SUFFIXES) for p in parts) or "".join(parts) in _SECRET_PARTS:
        return True
    if any(pair in _SECRET_PAIRS for pair in zip(parts, parts[1:], strict=False)):
        return True
    return len(parts) > 1 and parts[-1] == "key" and name.isupper()  # env style: STRIPE_KEY=


def looks_like_credential(value: str) -> bool:
    """A word that could be a password or key rather than prose: 6+ characters with a digit, a
    capital after the first character, or a symbol (``hunter2``, ``wJalrXUtn/K7MDENG``; not ``count``)."""
    if len(value) < 6 or value == MASK:
        return False
    return (any(c.isdigit() for c in value) or any(c.isupper() for c in value[1:])
            or any(not c.isalnum() for c in value))


_PRIVATE_KEY = re.compile(  # the white space before END is the body's (kept by _private_key): a
    # "\s*" there was tried again at every character of the body, quadratic in a run of spaces
    r"(-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----\s*)([\s\S]*?)"
    r"(-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)"
)
_TOKENS = re.compile(  # a token's prefix may follow "_" or "-" (``tool_ghp_...``, ``backup_AKIA...``:
    # glued to a word, a breaker's find), never a letter or digit; a bare ``sk-`` only a separator
    # (``disk-usage-report-for-2024`` is no key)
    r"(?=[sgrpxAyenhSd])(?<![A-Za-z0-9])(?:"  # the look-ahead: a fast no at most places
    r"(?<![_-])sk-[A-Za-z0-9_-]{16,}"
    r"|sk-(?:proj-|svcacct-|admin-|live-|test-|ant-(?:api|admin)\d\d-|ant-)[A-Za-z0-9_-]{16,}"
    r"|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{10,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[abposre]-[A-Za-z0-9-]{10,}"
    r"|(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ABIA|ACCA)[0-9A-Z]{16}(?![0-9A-Za-z])"
    r"|AIza[0-9A-Za-z_-]{35}"
    r"|ya29\.[0-9A-Za-z_-]{20,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"
    r"|npm_[A-Za-z0-9]{36}"
    r"|pypi-AgE[A-Za-z0-9_-]{50,}"
    r"|hf_[A-Za-z0-9]{30,}"
    r"|SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"
    r"|dop_v1_[a-f0-9]{64}"
    r"|shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}"
    r"|hv[sbr]\.[A-Za-z0-9_-]{24,}"  # HashiCorp Vault service, batch and recovery tokens
    r"|xapp-\d-[A-Za-z0-9-]{10,}"  # Slack app-level tokens
    r"|AGE-SECRET-KEY-1[0-9A-Z]{20,}"  # age private keys
    r")"
)
_SLACK_WEBHOOK = re.compile(r"(hooks\.slack\.com/(?:services|workflows)/)[A-Za-z0-9/_-]+")
# webhook URLs whose path is the credential: Discord's (and look-alikes') /api/webhooks/<id>/<token>,
# Microsoft Teams' /IncomingWebhook/<id>/<id>, a Telegram bot's /bot<id>:<token>
_WEBHOOKS = (("webhooks/", "IncomingWebhook/", "/bot"), re.compile(
    r"(/api/webhooks/\d+/)[A-Za-z0-9_-]+|(/IncomingWebhook/)[A-Za-z0-9/_-]+|(/bot\d{5,12}:)[A-Za-z0-9_-]{20,}"))
# RFC 3986 userinfo: no "/", "?", "#" or "@" in it; the user may be empty (redis://:pw@host)
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,31}://[^\s:/?#@\"'<>\\]*:)([^\s/?#@\"'<>\\]+)(@)")
_QUERY_SIG = re.compile(r"([?&](?:sig|code_verifier)=)([^&\s\"'#<>\\]+)")
_AUTH_HEADER = re.compile(
    r"(?i)(\b(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?"
    r"(?:(?:bearer|basic|token|digest|negotiate|ntlm|bot|apikey|jwt|oauth|key|aws4-hmac-sha256|sso-key|ssws)\s+)?)"
    r"([^\r\n\"'\\]+)"
)
_COOKIE_HEADER = re.compile(r"(?i)(\b(?:set-)?cookie[\"']?[ \t]*[:=][ \t]*[\"']?)([^\r\n\"'\\]+)")
_COOKIE_VALUE = re.compile(r"(=\s*)[^;,\s]+")
# "password": "value" inside JSON that is itself inside a JSON string (a logged repr)
_ESCAPED_PAIR = re.compile(
    r'(\\"(?P<name>' + _NAME + r'[A-Za-z_][\w.-]{0,255})\\"\s*:\s*\\")((?:[^"\\]|\\[^"])*)(\\"|$)'
)
_BEARER = re.compile(r"(?i)(\b(?:bearer|basic)\s+)([A-Za-z0-9._~+/=-]{8,})")

_HINT = re.compile(_HINT_WORDS)  # in ASCII-lowered text: a line without one of these names no secret
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")  # keeps every index
_QUOTED = r"""(?P<q>["'])(?P<qv>(?:\\.|(?!(?P=q))[^\\\n])*)(?P<qe>(?P=q))?"""
_UNQUOTED = r"""(?P<v>[^\s"'&;,<>()\[\]{}\\]+)"""
# The patterns below match a name and what follows it (the head); its value (_VALUE_AT) is read
# after the head only when the name is a secret's (_mask_values), so a name that is no secret's
# consumes only itself, a secret assignment inside its would-be value (``x: PGPASSWORD=1``) is
# still found, and no value is scanned for every name inside it (``key=key=...`` was quadratic).
_VALUE_AT = re.compile(_QUOTED + "|" + _UNQUOTED)
_VALUE_GROUPS = frozenset({"q", "qv", "qe", "v"})
# a name/value pair written out: {"name": "X-Api-Key", "value": "..."} (HAR, Kubernetes env, a
# logged repr), and ("X-Api-Key", "...") / ["X-Api-Key", "..."] (requests' header tuples)
_PAIR_TEXT = re.compile(
    r"""(?i)(?<![\w-])((?P<k>["']?)\b(?:name|key|header|field)(?P=k)[ \t]*[:=][ \t]*"""
    r"""(?P<nq>["'])(?P<name>[^"'\n]{1,256})(?P=nq)[ \t]*,[ \t]*(?P<vk>["']?)value(?P=vk)[ \t]*[:=][ \t]*)""" + _QUOTED
)
_PAIR_ITEMS = re.compile(  # the value's closing quote and bracket required (possessive: no retries)
    r"""([\[(][ \t]*(?P<nq>["'])(?P<name>[^"'\n]{1,256})(?P=nq)[ \t]*,[ \t]*)"""
    r"""(?P<q>["'])(?P<qv>(?:\\.|(?!(?P=q))[^\\\n])*+)(?P<qe>(?P=q))(?=[ \t]*[\])])"""
)
# --name=value, --name value, -name value
_OPTION = re.compile(
    r"(?<![\w.-])(?P<head>--?(?P<name>" + _NAME + r"[A-Za-z][\w.-]{0,255})(?P<sep>=|[ \t]+))"
)
# name=value, name: value, "name": "value", 'name'='value', ?name=value&
_ASSIGNMENT = re.compile(
    r"(?<![\w.$/-])(?P<head>(?P<nq>[\"']?)(?P<name>" + _NAME + r"[A-Za-z_][\w.-]{0,255})(?P=nq)"
    r"[ \t]*(?P<sep>[=:])[ \t]*)"
)
# name value (no separator): only a credential-looking value, or a quoted one
_BARE = re.compile(r"(?<![\w.$/-])(?P<head>(?P<name>" + _NAME + r"[A-Za-z_][\w.-]{0,255})[ \t]+)")


class _Named:
    """A head match and its value match, read as one match (``group``, ``start``, ``end``)."""

    __slots__ = ("head", "value")

    def __init__(self, head: re.Match[str], value: re.Match[str]) -> None:
        self.head, self.value = head, value

    def group(self, name: str) -> Any:
        return (self.value if name in _VALUE_GROUPS else self.head).group(name)

    def start(self, name: str) -> int:
        return (self.value if name in _VALUE_GROUPS else self.head).start(name)

    def end(self, name: str) -> int:
        return (self.value if name in _VALUE_GROUPS else self.head).end(name)


def _value_span(match: re.Match[str]) -> tuple[int, int]:
    """Where the value to mask is: inside its quotes, or the unquoted word."""
    if match.group("q") is not None:
        return match.start("qv"), match.end("qv")
    return match.start("v"), match.end("v")


def _mask_values(pattern: re.Pattern[str], secret: Callable[[Any], bool], text: str) -> str:
    """``text`` with the value of each ``pattern`` match (a head, then :data:`_VALUE_AT`) that
    ``secret`` accepts replaced by the mask. Linear: a value is read only after a secret's name."""
    out: list[str] = []
    done = 0  # text[:done] is in ``out``
    pos = 0
    while (head := pattern.search(text, pos)) is not None:
        pos = head.end()
        name = head.group("name")
        if name.lower() in _HEADER_NAMES or not is_secret_name(name):
            continue
        value = _VALUE_AT.match(text, pos)
        if value is None:
            continue
        match = _Named(head, value)
        if not secret(match):
            continue
        start, end = _value_span(match)
        out.append(text[done:start])
        out.append(MASK)
        done = pos = max(end, pos)  # from the masked value's end: not once per name inside it
    out.append(text[done:])
    return "".join(out)


def _value(match: re.Match[str]) -> str:
    return match.group("qv") if match.group("q") is not None else match.group("v")


def _maskable(match: re.Match[str]) -> bool:
    """A secret-named value not masked already (headers have their own rule)."""
    if match.group("name").lower() in _HEADER_NAMES:
        return False
    value = _value(match)
    return bool(value) and set(value) != {"*"} and is_secret_name(match.group("name"))


def _option(match: re.Match[str]) -> bool:
    if match.group("q") is None and match.group("sep") != "=" and match.group("v").startswith("-"):
        return False  # --token --next: the option has no value here
    return _maskable(match)


def _assignment(match: re.Match[str]) -> bool:
    if match.group("sep") == ":" and match.group("q") is None and len(match.group("v")) < 3:
        return False  # "password: is required" is prose
    return _maskable(match)


def _bare(match: re.Match[str]) -> bool:
    if match.group("q") is None and (match.group("v").startswith("-") or not looks_like_credential(match.group("v"))):
        return False  # passwd --stdin: an option follows the name, not its value
    return _maskable(match)


def _cookie(match: re.Match[str]) -> str:
    value = match.group(2)
    masked = _COOKIE_VALUE.sub(r"\1" + MASK, value) if "=" in value else MASK
    return match.group(1) + masked


def _bearer(match: re.Match[str]) -> str:
    return match.group(1) + MASK if looks_like_credential(match.group(2)) else match.group(0)


def _pair_value(match: re.Match[str]) -> str:
    """A written-out name/value pair with its value masked when the name is a secret's."""
    value = match.group("qv")
    if not value or set(value) == {"*"} or not is_secret_name(match.group("name")):
        return match.group(0)
    return match.group(1) + match.group("q") + MASK + (match.group("qe") or "")


def _pair_items(match: re.Match[str]) -> str:
    """``("X-Api-Key", "...")``: masked only when the value looks like a credential (so a list of
    words such as ``["token", "count"]`` stays)."""
    return _pair_value(match) if looks_like_credential(match.group("qv")) else match.group(0)


def _escaped_pair(match: re.Match[str]) -> str:
    return match.group(1) + MASK + match.group(4) if is_secret_name(match.group("name")) else match.group(0)


def _private_key(match: re.Match[str]) -> str:
    body = match.group(2)
    return f"{match.group(1)}{MASK}{body[len(body.rstrip()):]}{match.group(3)}"


def _lowered(text: str) -> str:
    """``text`` in lower case, each character still at its index (``str.lower`` lengthens a few)."""
    lower = text.lower()
    return lower if len(lower) == len(text) else text.translate(_ASCII_LOWER)


def _mask_named(text: str, lower: str) -> str:
    """The name-based rules, applied only to the lines where a secret's name may be (found with
    one search of ``lower``, the ASCII-lowered ``text``): they never look past a line's end."""
    out: list[str] = []
    done = 0
    for hit in _HINT.finditer(lower):
        if hit.start() < done:
            continue
        start = text.rfind("\n", 0, hit.start()) + 1
        end = text.find("\n", hit.end())
        end = len(text) if end < 0 else end
        out.append(text[done:start])
        out.append(_named_values(text[start:end]))
        done = end
    out.append(text[done:])
    return "".join(out)


def _named_values(line: str) -> str:
    """One line with the values of secret-named options and assignments masked."""
    line = _mask_values(_OPTION, _option, line)
    line = _mask_values(_ASSIGNMENT, _assignment, line)
    line = _ESCAPED_PAIR.sub(_escaped_pair, line)
    if "value" in line.lower():
        line = _PAIR_TEXT.sub(_pair_value, line)
    if "," in line:
        line = _PAIR_ITEMS.sub(_pair_items, line)
    return _mask_values(_BARE, _bare, line)


def quoted_forms(value: str) -> set[str]:
    """``value`` and the forms a tool quotes it in: inside a JSON string (``json.dumps``, ASCII or
    not), a Python ``repr`` (a backslash doubled, ``\n`` escaped, ``ä`` as ``\u00e4``) and percent-encoded
    (``quote``, ``quote_plus``: a URL's query, a form body): a tool's
    ``raise ValueError(f"refused {args!r}")`` showed a sensitive value so escaped, which the exact
    value did not match (a breaker's find)."""
    forms = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], repr(value)[1:-1],
             # percent-encoded, as a URL or form body a tool built and quotes (requests' HTTPError)
             quote(value, errors="surrogatepass"), quote(value, safe="", errors="surrogatepass"),
             quote_plus(value, errors="surrogatepass")}
    return {form for form in forms if len(form) >= 3}


def mask_secrets(text: str, known: Iterable[str] = ()) -> str:
    """``text`` with every secret recognised (see the module) replaced by ``***``; ``known``: exact
    values to mask wherever they appear (those shorter than 3 characters are ignored). Pure; may
    raise only on a bug in a pattern (callers catch: :func:`toolfleet.tools.redact.redact_text`)."""
    values = {form for k in known if isinstance(k, str) and len(k) >= 3 for form in quoted_forms(k)}
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, MASK)
    text = _PRIVATE_KEY.sub(_private_key, text)
    text = _TOKENS.sub(MASK, text)
    text = _SLACK_WEBHOOK.sub(r"\1" + MASK, text)
    if any(word in text for word in _WEBHOOKS[0]):
        text = _WEBHOOKS[1].sub(lambda m: (m.group(1) or m.group(2) or m.group(3)) + MASK, text)
    lower = _lowered(text)
    if "://" in text:
        text = _URL_PASSWORD.sub(r"\1" + MASK + r"\3", text)
    if "sig=" in text or "code_verifier=" in text:
        text = _QUERY_SIG.sub(r"\1" + MASK, text)
    if "authorization" in lower:
        text = _AUTH_HEADER.sub(lambda m: m.group(1) + MASK if m.group(2).strip("* ") else m.group(0), text)
    if "cookie" in lower:
        text = _COOKIE_HEADER.sub(_cookie, text)
    text = mask_program_secrets(text)
    text = _mask_named(text, _lowered(text))
    if "bearer" not in lower and "basic" not in lower:
        return text
    return _BEARER.sub(_bearer, text)
