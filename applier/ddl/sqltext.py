"""Reading SQL text as PostgreSQL's lexer would, as far as DDL replay needs it.

No I/O and no parser: a tokenizer that knows where quoted strings
(``'...'``, ``E'...'`` with its backslash escapes), quoted identifiers
(``"..."``), dollar quotes (``$tag$...$tag$``) and comments (``--`` and nested
``/* */``) begin and end, so that a ``;`` or a keyword inside one of them is
never taken for structure. :func:`statements` splits a string where the server
would (a ``BEGIN ATOMIC ... END`` function body keeps its semicolons);
:func:`words` gives a statement's leading keywords; :func:`identity_parts`
reads PostgreSQL's quoted, dotted object identities.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DOLLAR = re.compile(r"\$([A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$")
_WORD = re.compile(r"[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_$\x80-\U0010ffff]*")
_NUMBER = re.compile(r"[0-9][0-9A-Za-z_.]*")


@dataclass(frozen=True, slots=True)
class Token:
    """One lexical token: ``kind`` is word, ident (quoted), string, op or semicolon."""

    kind: str
    text: str
    start: int
    end: int

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""


class Unterminated(ValueError):
    """A quote, dollar quote or comment that does not end."""


def tokens(text: str) -> list[Token]:
    """The tokens of ``text``, comments and white space left out."""
    out: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif text.startswith("--", i):
            nl = text.find("\n", i)
            i = n if nl < 0 else nl + 1
        elif text.startswith("/*", i):
            i = _comment_end(text, i)
        elif c in "eE" and text.startswith("'", i + 1):
            end = _quote_end(text, i + 1, "'", backslash=True)
            out.append(Token("string", text[i:end], i, end))
            i = end
        elif c == "'":
            end = _quote_end(text, i, "'", backslash=False)
            out.append(Token("string", text[i:end], i, end))
            i = end
        elif c == '"':
            end = _quote_end(text, i, '"', backslash=False)
            out.append(Token("ident", text[i:end], i, end))
            i = end
        elif c == "$" and (m := _DOLLAR.match(text, i)) is not None:
            close = text.find(m.group(0), m.end())
            if close < 0:
                raise Unterminated(f"a dollar quote {m.group(0)} that does not end")
            end = close + len(m.group(0))
            out.append(Token("string", text[i:end], i, end))
            i = end
        elif c == ";":
            out.append(Token("semicolon", c, i, i + 1))
            i += 1
        elif (m := _WORD.match(text, i)) is not None:
            out.append(Token("word", m.group(0), i, m.end()))
            i = m.end()
        elif (m := _NUMBER.match(text, i)) is not None:
            out.append(Token("op", m.group(0), i, m.end()))
            i = m.end()
        else:
            out.append(Token("op", c, i, i + 1))
            i += 1
    return out


def _comment_end(text: str, i: int) -> int:
    depth, i = 0, i
    while i < len(text):
        if text.startswith("/*", i):
            depth += 1
            i += 2
        elif text.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    raise Unterminated("a /* comment that does not end")


def _quote_end(text: str, i: int, q: str, *, backslash: bool) -> int:
    j = i + 1
    while j < len(text):
        c = text[j]
        if backslash and c == "\\":
            j += 2
            continue
        if c == q:
            if text.startswith(q, j + 1):  # a doubled quote stands for itself
                j += 2
                continue
            return j + 1
        j += 1
    raise Unterminated(f"a {q} quote that does not end")


def statements(text: str) -> list[list[Token]]:
    """The non-empty statements of ``text``, each as its tokens (no ``;``)."""
    out: list[list[Token]] = []
    current: list[Token] = []
    atomic = 0  # inside BEGIN ATOMIC ... END (CASE ... END nests in it)
    prev = ""
    for t in tokens(text):
        word = t.upper
        if atomic:
            if word in ("CASE", "ATOMIC"):
                atomic += 1
            elif word == "END":
                atomic -= 1
        elif word == "ATOMIC" and prev == "BEGIN":
            atomic = 1
        prev = word
        if t.kind == "semicolon" and not atomic:
            if current:
                out.append(current)
            current = []
        else:
            current.append(t)
    if current:
        out.append(current)
    return out


def words(stmt: list[Token], limit: int = 8) -> list[str]:
    """The statement's leading unquoted words, upper case, up to the first other token."""
    out: list[str] = []
    for t in stmt[:limit]:
        if t.kind != "word":
            break
        out.append(t.upper)
    return out


def identity_parts(identity: str) -> list[str]:
    """``"my schema".tbl.col`` -> ``['my schema', 'tbl', 'col']`` (as PostgreSQL quotes)."""
    parts: list[str] = []
    i, n = 0, len(identity)
    while i < n:
        if identity[i] == '"':
            end = _quote_end(identity, i, '"', backslash=False)
            parts.append(identity[i + 1 : end - 1].replace('""', '"'))
            i = end
        else:
            end = identity.find(".", i)
            end = n if end < 0 else end
            parts.append(identity[i:end])
            i = end
        if i < n and identity[i] == ".":
            i += 1
    return parts


def unquote(t: Token) -> str:
    """An identifier token's name: a quoted one as written, an unquoted one folded."""
    if t.kind == "ident":
        return t.text[1:-1].replace('""', '"')
    return t.text.lower()
