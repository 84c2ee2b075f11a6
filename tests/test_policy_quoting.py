"""Quote removal of the command policy (shellwords.dequote) agrees with bash itself: random words
made of unquoted, '..', "..", $'..' and backslash pieces are printed by a real bash and compared.
A word the policy reads differently from bash could slip past a deny rule (`"r"'m'` did)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfleet.policy.shellwords import dequote

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

PLAIN = st.text(alphabet="abcrm0129._/-=:,+@%", min_size=1, max_size=4)
SINGLE = st.text(alphabet="abc rm$`\"\\*?;|&<>(){}!#", max_size=5).map(lambda t: f"'{t}'")
DQ_PIECE = st.sampled_from(["a", "r", "m", " ", "\\\"", "\\\\", "\\$", "\\`", "\\q", "'", "*", ";", "{x,y}", "~"])
DOUBLE = st.lists(DQ_PIECE, max_size=5).map(lambda ps: '"' + "".join(ps) + '"')
ANSI_PIECE = st.sampled_from(["a", "r", "m", " ", "\\x72", "\\x6d", "\\162", "\\155", "\\n", "\\t", "\\\\",
                              "\\'", "\\\"", "\\e", "\\cA", "\\u0072", "\\q", "$", "`", "\\x4", "\\0m"])
ANSI = st.lists(ANSI_PIECE, max_size=5).map(lambda ps: "$'" + "".join(ps) + "'")
ESCAPED = st.sampled_from(["\\r", "\\m", "\\ ", "\\'", '\\"', "\\$", "\\\\", "\\*", "\\;"])
WORD = st.lists(st.one_of(PLAIN, SINGLE, DOUBLE, ANSI, ESCAPED), min_size=1, max_size=5).map("".join)


def _bash_words(words: list[str]) -> list[bytes]:
    script = "set -f; printf '%s\\0' " + " ".join(words)  # set -f: no file-name expansion
    out = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True, timeout=30,
                         env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"}, check=True).stdout
    return out.split(b"\0")[:-1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(WORD, min_size=1, max_size=20))
def test_dequote_agrees_with_bash(words):
    expected = _bash_words(words)
    got = [dequote(w) for w in words]
    assert [g.encode("latin-1") if g is not None else None for g in got] == expected, words


@pytest.mark.parametrize("raw,expected", [
    ("\"r\"'m'", "rm"), ("$'\\x72m'", "rm"), ("\\r\\m", "rm"), ("$\"rm\"", "rm"), ("a$'x\\0y'b", "axb"),
    ("$x", None), ('"a$b"', None), ("`x`", None), ("$(x)", None), ("a$", "a$"), ("'$x'", "$x"),
])
def test_dequote_cases(raw, expected):
    assert dequote(raw) == expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(WORD, min_size=1, max_size=10))
def test_command_words_agree_with_bash(words):
    """The whole reading (bashlex splits the words, dequote removes quotes): a command either is
    refused as unreadable, or its words are bash's (a word known only at run time aside)."""
    from toolfleet.policy.commands import analyse

    analysis = analyse("printf '%s\\0' " + " ".join(words))
    if analysis.problem is not None:
        return  # refused: fail closed
    # bashlex reads backquotes inside $'..' as a command substitution (bash does not: $'`a`' is the
    # text `a`); the walk still checks that "command" as a segment of its own, which only errs on the
    # careful side, so the words compared are those of the printf segment
    segment = next(s for s in analysis.segments if s.words[:1] == ("printf",))
    expected = _bash_words(words)
    got = list(segment.words[2:])
    dynamic = list(segment.dynamic[2:])
    assert len(got) == len(expected), (words, got)
    for word, is_dynamic, bash_word in zip(got, dynamic, expected, strict=True):
        if not is_dynamic:
            assert word.encode("latin-1") == bash_word, (words, got)


def test_backquotes_inside_ansi_c_quotes_are_text_and_the_spurious_substitution_is_still_checked():
    """Found by the property above: ``$'`a`'`` is the word `` `a` `` for bash; bashlex sees a
    substitution running ``a``, which the walk checks too (an extra segment: careful, never lax)."""
    from toolfleet.policy.commands import analyse

    analysis = analyse("printf '%s\\0' $'`rm -rf x`'")
    assert analysis.problem is None
    printf = next(s for s in analysis.segments if s.words[:1] == ("printf",))
    assert printf.words[2:] == ("`rm -rf x`",) and printf.dynamic[2:] == (False,)
    assert any(s.words[:1] == ("rm",) for s in analysis.segments)  # still matched against deny rules
