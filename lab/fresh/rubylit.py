"""Read the statements of a Vagrantfile without Ruby: the subset of Ruby that configuration is
written in.

A Vagrantfile is a Ruby program, but the part ``lab.freshcheck`` needs (the shell provisioners,
the forwarded ports, the provider's size) is plain data: method calls and assignments whose
values are literals. This module turns the source into a tree of such statements:

- ``Call``: a method chain (``config.vm.provision``), its arguments and keyword arguments, and
  the statements of a ``do |x| ... end`` or ``{ |x| ... }`` block given to it;
- ``Assign``: ``chain = value``;
- ``Opaque``: anything else (kept so a reader can say *what* it could not read).

Values are literals: strings (double- and single-quoted, with Ruby's escapes; adjacent literals
and ``+`` concatenate them, ``\\``-newline continues a line; heredocs ``<<ID``, ``<<-ID``,
``<<~ID``, quoted or not), numbers, symbols, ``true``/``false``/``nil``, arrays and hashes of
them. A value that is not a literal (a variable, a method call, string interpolation ``#{}``)
becomes an ``Opaque`` value: the caller decides whether that matters. Statements under ``if``,
``unless``, ``case`` and loops are marked ``conditional``.

Cost: one pass over the source to tokenise, one recursive descent over the tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# -- errors and values -------------------------------------------------------------------------


class RubySubsetError(ValueError):
    """The source is not Ruby this reader understands (the message names the line)."""


@dataclass(frozen=True)
class Sym:
    name: str


@dataclass(frozen=True)
class Opaque:
    """A value or statement that is not a literal; ``text`` is its source, for messages."""

    text: str
    line: int


Value = str | int | float | bool | None | Sym | Opaque | list | dict


@dataclass(frozen=True)
class Call:
    chain: tuple[str, ...]
    args: tuple[Value, ...]
    kwargs: dict[str, Value]
    block_params: tuple[str, ...]
    body: tuple[Stmt, ...]
    line: int
    conditional: bool = False


@dataclass(frozen=True)
class Assign:
    chain: tuple[str, ...]
    value: Value
    line: int
    conditional: bool = False


Stmt = Call | Assign | Opaque


# -- tokens ------------------------------------------------------------------------------------

STR, NUM, IDENT, LABEL, SYM, OP, NL, EOF = "str num ident label sym op nl eof".split()


@dataclass
class Token:
    kind: str
    value: object
    line: int
    # Whether whitespace precedes the token (Ruby's ``f (x)`` differs from ``f(x)``).
    spaced: bool = False
    text: str = field(default="", repr=False)


_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*[?!]?")
_NUM_RE = re.compile(r"[0-9][0-9_]*(\.[0-9][0-9_]*)?")
_HEREDOC_RE = re.compile(r"<<([~-]?)(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")
_SIMPLE_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "s": " ",
    "r": "\r",
    "0": "\0",
    "e": "\x1b",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
}
_OPS = ("=>", "==", "!=", "::", "&.", "||=", "+=", "&&", "||", "**")


def _unescape_double(body: str, line: int) -> str:
    """A double-quoted string's body as Ruby reads it; interpolation is an error."""
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "#" and i + 1 < len(body) and body[i + 1] in "{@$":
            raise RubySubsetError(
                f"line {line}: string interpolation ({body[i : i + 12]!r}...) cannot be read "
                "without running Ruby; use a plain string"
            )
        if c != "\\":
            out.append(c)
            i += 1
            continue
        i += 1
        if i >= len(body):
            out.append("\\")
            break
        e = body[i]
        if e == "\n":  # backslash-newline inside a double-quoted string: both vanish
            i += 1
        elif e in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[e])
            i += 1
        elif e == "x":
            m = re.match(r"[0-9A-Fa-f]{1,2}", body[i + 1 :])
            if not m:
                raise RubySubsetError(f"line {line}: invalid \\x escape")
            out.append(chr(int(m.group(), 16)))
            i += 1 + len(m.group())
        elif e == "u":
            if body[i + 1 : i + 2] == "{":
                end = body.find("}", i)
                if end < 0:
                    raise RubySubsetError(f"line {line}: unterminated \\u{{...}} escape")
                out.extend(chr(int(h, 16)) for h in body[i + 2 : end].split())
                i = end + 1
            else:
                m = re.match(r"[0-9A-Fa-f]{4}", body[i + 1 :])
                if not m:
                    raise RubySubsetError(f"line {line}: invalid \\u escape")
                out.append(chr(int(m.group(), 16)))
                i += 5
        elif e in "1234567":
            m = re.match(r"[0-7]{1,3}", body[i:])
            assert m is not None
            out.append(chr(int(m.group(), 8)))
            i += len(m.group())
        else:  # \\ \" \# \' and any other character stand for themselves
            out.append(e)
            i += 1
    return "".join(out)


def _unescape_single(body: str) -> str:
    return re.sub(r"\\([\\'])", r"\1", body)


def _dedent_squiggly(lines: list[str]) -> list[str]:
    """``<<~``: remove the smallest indentation of the non-blank lines from every line."""
    indents = [len(s) - len(s.lstrip(" \t")) for s in lines if s.strip()]
    cut = min(indents, default=0)
    return [s[cut:] if s.strip() else s.lstrip(" \t") for s in lines]


def tokenize(src: str) -> list[Token]:
    toks: list[Token] = []
    pending: list[tuple[Token, str, str, str]] = []  # (token, flavour, quote, terminator)
    i, line, n = 0, 1, len(src)
    spaced = False
    at_line_start = True

    def add(kind: str, value: object, text: str = "") -> None:
        nonlocal spaced
        toks.append(Token(kind, value, line, spaced, text))
        spaced = False

    def read_heredocs(pos: int) -> int:
        """Fill the pending heredocs from the lines starting at ``pos``; return the position
        after the last terminator."""
        nonlocal line
        for tok, flavour, quote, term in pending:
            body: list[str] = []
            start_line = line
            for _ in range(n + 1):  # one line per round; the source has fewer
                if pos >= n:
                    raise RubySubsetError(f"line {start_line}: heredoc {term} is not terminated")
                end = src.find("\n", pos)
                end = n if end < 0 else end
                text = src[pos:end]
                pos = end + 1
                line += 1
                if (text.strip() if flavour else text) == term:
                    break
                body.append(text)
            if flavour == "~":
                body = _dedent_squiggly(body)
            raw = "".join(s + "\n" for s in body)
            tok.value = raw if quote == "'" else _unescape_double(raw, tok.line)
        pending.clear()
        return pos

    while i < n:
        c = src[i]
        if at_line_start and src.startswith("=begin", i):
            end = src.find("\n=end", i)
            if end < 0:
                raise RubySubsetError(f"line {line}: =begin without =end")
            line += src.count("\n", i, end + 1)
            i = src.find("\n", end + 1)
            i = n if i < 0 else i
            continue
        at_line_start = False
        if c in " \t\r":
            spaced = True
            i += 1
        elif c == "\\" and src.startswith("\n", i + 1):
            i += 2
            line += 1
            spaced = True
        elif c == "\n":
            add(NL, None)
            line += 1
            i += 1
            if pending:
                i = read_heredocs(i)
            at_line_start = True
        elif c == "#":
            end = src.find("\n", i)
            i = n if end < 0 else end
        elif c in "\"'":
            j, start_line = i + 1, line
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            if j >= n:
                raise RubySubsetError(f"line {start_line}: unterminated string")
            body = src[i + 1 : j]
            value = _unescape_double(body, start_line) if c == '"' else _unescape_single(body)
            line += body.count("\n")
            i = j + 1
            # "key": value is a label too
            if src.startswith(":", i) and not src.startswith("::", i):
                i += 1
                add(LABEL, value)
            else:
                add(STR, value, src[i - len(body) - 2 : i])
        elif c == "<" and (m := _HEREDOC_RE.match(src, i)):
            add(STR, "", m.group())
            pending.append((toks[-1], m.group(1), m.group(2), m.group(3)))
            i = m.end()
        elif c == ":" and i + 1 < n and src[i + 1] == ":":
            add(OP, "::")
            i += 2
        elif c == ":" and i + 1 < n and (m := _IDENT_RE.match(src, i + 1)):
            add(SYM, m.group())
            i = m.end()
        elif c == ":" and i + 1 < n and src[i + 1] in "\"'":
            j = src.find(src[i + 1], i + 2)
            if j < 0:
                raise RubySubsetError(f"line {line}: unterminated symbol")
            add(SYM, src[i + 2 : j])
            i = j + 1
        elif m := _IDENT_RE.match(src, i):
            word = m.group()
            i = m.end()
            if src.startswith(":", i) and not src.startswith("::", i) and word[-1] not in "?!":
                i += 1
                add(LABEL, word)
            else:
                add(IDENT, word)
        elif m := _NUM_RE.match(src, i):
            text = m.group().replace("_", "")
            add(NUM, float(text) if "." in text else int(text), m.group())
            i = m.end()
        else:
            op = next((o for o in _OPS if src.startswith(o, i)), c)
            add(OP, op)
            i += len(op)
    if pending:
        raise RubySubsetError(f"line {line}: heredoc {pending[0][3]} is not terminated")
    add(NL, None)
    add(EOF, None)
    return toks


# -- statements --------------------------------------------------------------------------------

# Keywords that open a body closed by ``end`` when they start a statement.
_OPENERS = {"if", "unless", "while", "until", "case", "begin", "def", "class", "module", "for"}
_MIDDLES = {"else", "elsif", "when", "in", "rescue", "ensure", "then"}
# A token after which a newline does not end the statement.
_CONTINUES = {",", "+", "(", "[", "{", "=>", "=", "|", "\\", "&&", "||", "."}


class _Parser:
    def __init__(self, toks: list[Token]) -> None:
        self.t = toks
        self.i = 0

    def peek(self, k: int = 0) -> Token:
        return self.t[min(self.i + k, len(self.t) - 1)]

    def next(self) -> Token:
        tok = self.peek()
        self.i = min(self.i + 1, len(self.t) - 1)
        return tok

    def at(self, kind: str, value: object = None) -> bool:
        tok = self.peek()
        return tok.kind == kind and (value is None or tok.value == value)

    def skip_nl(self) -> None:
        while self.at(NL) or self.at(OP, ";"):
            self.next()

    # statements

    def body(self, closer: str, conditional: bool) -> list[Stmt]:
        """Statements up to ``closer`` (``end`` or ``}``), which is consumed."""
        out: list[Stmt] = []
        for _ in range(len(self.t)):  # each round consumes at least one token
            self.skip_nl()
            tok = self.peek()
            if tok.kind == EOF:
                if closer == "":
                    return out
                raise RubySubsetError(f"line {tok.line}: missing '{closer}' before end of file")
            if closer and tok.value == closer and tok.kind in (IDENT, OP):
                self.next()
                return out
            if tok.kind == IDENT and tok.value in _MIDDLES:
                self.rest_of_line()
                continue
            out.extend(self.statement(conditional))
        raise RubySubsetError("statements do not end")  # unreachable: tokens end with EOF

    def statement(self, conditional: bool) -> list[Stmt]:
        tok = self.peek()
        if tok.kind == IDENT and tok.value in _OPENERS:
            self.rest_of_line()
            return self.body("end", True)
        if tok.kind != IDENT:
            return self.opaque_line(tok.line)
        start = self.i
        chain = [str(self.next().value)]
        while self.at(OP, ".") or self.at(OP, "::") or self.at(OP, "&."):
            self.next()
            self.skip_nl()
            if not self.at(IDENT):
                self.i = start
                return self.opaque_line(tok.line)
            chain.append(str(self.next().value))
        if self.at(OP, "=") and len(chain) > 0:
            self.next()
            self.skip_nl()
            value = self.expr()
            return self.finish(Assign(tuple(chain), value, tok.line, conditional), start)
        args: list[Value] = []
        kwargs: dict[str, Value] = {}
        if self.at(OP, "(") and not self.peek().spaced:
            self.next()
            self.arguments(args, kwargs, closer=")")
        elif self.starts_value():
            self.arguments(args, kwargs, closer=None)
        params: tuple[str, ...] = ()
        body: list[Stmt] = []
        if self.at(IDENT, "do") or self.at(OP, "{"):
            closer = "end" if self.next().value == "do" else "}"
            params = self.block_params()
            body = self.body(closer, conditional)
        call = Call(tuple(chain), tuple(args), kwargs, params, tuple(body), tok.line, conditional)
        return self.finish(call, start)

    def finish(self, stmt: Stmt, start: int) -> list[Stmt]:
        """The statement if its line ends here; an opaque statement otherwise."""
        if self.at(NL) or self.at(OP, ";") or self.at(EOF):
            return [stmt]
        if self.at(IDENT, "end") or self.at(OP, "}"):
            return [stmt]
        self.i = start
        return self.opaque_line(self.peek().line)

    def opaque_line(self, line: int) -> list[Stmt]:
        start = self.i
        self.rest_of_line()
        if self.i == start:  # a stray closer: step over it so the caller's loop advances
            self.next()
        text = " ".join(str(t.value) for t in self.t[start : self.i] if t.kind != NL)
        return [Opaque(text, line)]

    def rest_of_line(self) -> None:
        """Skip to the end of the logical line, parsing any block it opens."""
        depth = 0
        prev: Token | None = None
        for _ in range(len(self.t)):
            tok = self.peek()
            if tok.kind == EOF:
                return
            if tok.kind == NL and depth == 0 and not (prev and prev.value in _CONTINUES):
                return
            if tok.kind == IDENT and tok.value == "do" and depth == 0:
                self.next()
                self.block_params()
                self.body("end", True)
                prev = None
                continue
            if tok.kind == OP and tok.value in ("(", "[", "{"):
                depth += 1
            elif tok.kind == OP and tok.value in (")", "]", "}"):
                if depth == 0:
                    return
                depth -= 1
            prev = tok if tok.kind != NL else prev
            self.next()

    def block_params(self) -> tuple[str, ...]:
        self.skip_nl()
        if not self.at(OP, "|"):
            return ()
        self.next()
        names = []
        while not self.at(OP, "|") and not self.at(EOF):
            tok = self.next()
            if tok.kind == IDENT:
                names.append(str(tok.value))
        self.next()
        return tuple(names)

    # values

    def starts_value(self) -> bool:
        tok = self.peek()
        if tok.kind in (STR, NUM, SYM, LABEL):
            return True
        if tok.kind == IDENT:
            return tok.value not in ("do", "end", "if", "unless", "while", "until", "rescue")
        return tok.kind == OP and tok.value in ("[", "-", "(") and tok.spaced

    def arguments(self, args: list[Value], kwargs: dict[str, Value], closer: str | None) -> None:
        for _ in range(len(self.t)):  # one argument per round
            if closer:
                self.skip_nl()
                if self.at(OP, closer):
                    self.next()
                    return
            tok = self.peek()
            if tok.kind == LABEL:
                self.next()
                self.skip_nl()
                kwargs[str(tok.value)] = self.expr()
            elif tok.kind in (SYM, STR) and self.peek(1).kind == OP and self.peek(1).value == "=>":
                self.next()
                self.next()
                self.skip_nl()
                kwargs[str(tok.value)] = self.expr()
            else:
                value = self.expr()
                if isinstance(value, dict) and closer is None:
                    kwargs.update({str(k): v for k, v in value.items()})
                else:
                    args.append(value)
            if self.at(OP, ","):
                self.next()
                self.skip_nl()
                continue
            if closer:
                self.skip_nl()
                if not self.at(OP, closer):
                    raise RubySubsetError(f"line {self.peek().line}: expected '{closer}'")
                self.next()
            return
        raise RubySubsetError("arguments do not end")  # unreachable: each round consumes

    def expr(self) -> Value:
        line = self.peek().line
        value = self.primary()
        for _ in range(len(self.t)):  # one operand per round
            if isinstance(value, str) and self.at(STR):
                value += str(self.next().value)  # adjacent literals: "a" "b"
            elif self.at(OP, "+"):
                self.next()
                self.skip_nl()
                rhs = self.primary()
                if isinstance(value, str) and isinstance(rhs, str):
                    value += rhs
                elif isinstance(value, int | float) and isinstance(rhs, int | float):
                    value += rhs
                else:
                    value = Opaque(f"{value!r} + {rhs!r}", line)
            else:
                return value
        return value

    def primary(self) -> Value:
        tok = self.peek()
        if tok.kind in (STR, NUM):
            self.next()
            return tok.value  # type: ignore[return-value]
        if tok.kind == SYM:
            self.next()
            return Sym(str(tok.value))
        if tok.kind == OP and tok.value == "-" and self.peek(1).kind == NUM:
            self.next()
            return -self.next().value  # type: ignore[operator]
        if tok.kind == OP and tok.value == "[":
            self.next()
            items: list[Value] = []
            self.arguments(items, {}, closer="]")
            return items
        if tok.kind == OP and tok.value == "{":
            self.next()
            hargs: list[Value] = []
            hkw: dict[str, Value] = {}
            self.arguments(hargs, hkw, closer="}")
            if hargs:
                return Opaque("{...}", tok.line)
            return hkw
        if tok.kind == IDENT and tok.value in ("true", "false", "nil"):
            self.next()
            return {"true": True, "false": False, "nil": None}[str(tok.value)]
        # Anything else (a variable, a call, an operator): consume one operand and call it opaque.
        start = self.i
        self.next()
        while self.at(OP, ".") or self.at(OP, "::"):
            self.next()
            self.next()
        if self.at(OP, "(") and not self.peek().spaced:
            self.rest_of_parens()
        text = " ".join(str(t.value) for t in self.t[start : self.i])
        return Opaque(text, tok.line)

    def rest_of_parens(self) -> None:
        depth = 0
        for _ in range(len(self.t)):
            tok = self.next()
            if tok.kind == EOF:
                return
            if tok.kind == OP and tok.value in ("(", "[", "{"):
                depth += 1
            elif tok.kind == OP and tok.value in (")", "]", "}"):
                depth -= 1
                if depth == 0:
                    return


def parse(src: str) -> list[Stmt]:
    """The top-level statements of ``src``."""
    return _Parser(tokenize(src)).body("", False)


def walk(stmts: list[Stmt] | tuple[Stmt, ...]):
    """Every statement, depth first, in source order (blocks' bodies after their call)."""
    for s in stmts:
        yield s
        if isinstance(s, Call):
            yield from walk(s.body)
