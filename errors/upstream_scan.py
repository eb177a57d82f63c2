"""Error texts of upstream code, read from its source: C++ ``TORCH_CHECK`` and Python ``raise`` /
``assert``.

Users paste upstream's messages (sglang, FlashAttention, ring-flash-attention, yunchang), so the
catalog keeps them as data (``errors/upstream/<source>.json``, written by ``python -m errors scan
--upstream``). This module reads a checkout, never imports or compiles it.

C++ (``*.cpp``, ``*.cu``, ``*.h``, ``*.hpp``, ``*.cuh``), as PyTorch prints each check's message:

* ``TORCH_CHECK(cond, a, b, ...)``: the message arguments streamed one after the other (PyTorch's
  ``c10::str``): string literals are text (adjacent literals join), anything else is a placeholder
  named after its expression (``head_size`` -> ``{head_size}``). A check without a message is
  skipped: its text is PyTorch's, not upstream's.
* ``CHECK_SHAPE(x, d0, d1, ...)``: ``x must have shape (d0, d1, ...)`` (the macro stringizes its
  arguments: names, not numbers, whitespace runs folded to one space);
  ``CHECK_DEVICE(x)``: ``x must be on CUDA``; ``CHECK_CONTIGUOUS(x)``: ``x must be contiguous``.
  These are FlashAttention's macros (``#x " must be on CUDA"`` and so on).

Python: every ``raise T(message)`` (any exception type) and ``assert cond, message``; the message
template comes from :mod:`errors.scan` (f-strings, ``%``, ``.format``, a name bound earlier; a name
bound to a call of a module function counts each string literal that function returns). A
bare ``raise T`` says nothing a user could paste, and is skipped. A bare ``assert cond`` (read only
where asked: ``bare_asserts``) raises an ``AssertionError`` without a message, and the traceback's
last code line is all a user has: it is recorded by its source text, kind ``bare assert``, template
``assert <cond>`` (as :func:`ast.unparse` writes it) and a regex that matches the statement or its
condition alone (Python 3.11 prints the condition's line of a multi-line assert) however it is
spaced or broken over lines (:func:`bare_assert_regex`).

Each message records its path, enclosing function (``Class.method`` in Python), exception type
(``RuntimeError`` for C++ checks, ``AssertionError`` for asserts), the kind of statement, the
template and the anchored regex (:class:`errors.scan.Message`; a placeholder matches any non-empty
text).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

from .scan import (
    Message,
    Placeholder,
    _annotations,
    _assignments,
    _exception_name,
    _MessageReader,
    module_constants,
    placeholder_name,
    read_source,
)

CPP_SUFFIXES = (".cpp", ".cu", ".h", ".hpp", ".cuh", ".cc")
#: The kind of an ``assert cond`` without a message.
BARE = "bare assert"
#: The message of each FlashAttention check macro, from its stringized arguments.
SHAPE, DEVICE, CONTIGUOUS = "CHECK_SHAPE", "CHECK_DEVICE", "CHECK_CONTIGUOUS"
_MACROS = ("TORCH_CHECK", SHAPE, DEVICE, CONTIGUOUS)
_CALL = re.compile(r"\b(" + "|".join(_MACROS) + r")\s*\(")
_NON_EMPTY = r".+?"


@dataclass
class UpstreamMessage:
    """One error text of upstream code."""

    path: str
    function: str
    kind: str  # TORCH_CHECK, CHECK_SHAPE, CHECK_DEVICE, CHECK_CONTIGUOUS, raise, assert or BARE
    exception: str
    message: Message  # or, for a bare assert, its AssertSource

    def as_json(self) -> dict:
        return {
            "path": self.path,
            "function": self.function,
            "kind": self.kind,
            "exception": self.exception,
            "template": self.message.template,
            "regex": self.message.regex,
        }


# --------------------------------------------------------------------------------------------------
# C++
# --------------------------------------------------------------------------------------------------


def _blank_comments(text: str) -> str:
    """``text`` with comments replaced by spaces (newlines kept), string and char literals
    untouched."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = _literal_end(text, i)
            out.append(text[i:j])
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _literal_end(text: str, start: int) -> int:
    """Index just past the string or char literal opening at ``start``."""
    quote, i = text[start], start + 1
    while i < len(text) and text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _arguments(text: str, open_paren: int) -> tuple[list[str], int]:
    """The top-level comma-separated arguments of the call whose ``(`` is at ``open_paren``, and the
    index past its ``)``."""
    args, depth, i, start = [], 0, open_paren, open_paren + 1
    while i < len(text):
        c = text[i]
        if c in "\"'":
            i = _literal_end(text, i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append(text[start:i])
                return [a.strip() for a in args], i + 1
        elif c == "," and depth == 1:
            args.append(text[start:i])
            start = i + 1
        i += 1
    raise ValueError(f"unbalanced parentheses after offset {open_paren}")


_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "'": "'", "\\": "\\", "0": "\0"}


def _string_pieces(arg: str) -> Optional[str]:
    """The text of an argument made only of adjacent string literals, else None."""
    rest = arg.strip()
    pieces = []
    while rest:
        m = _STRING.match(rest)
        if not m:
            return None
        pieces.append(re.sub(r"\\(.)", lambda e: _ESCAPES.get(e.group(1), e.group(1)), m.group(1)))
        rest = rest[m.end() :].lstrip()
    return "".join(pieces) if pieces else None


_TO_STRING = re.compile(r"std::to_string\((.*)\)", re.DOTALL)


def _sum_terms(arg: str) -> list[str]:
    """``"a " + std::to_string(n)`` -> its terms, when the argument is a ``+`` of string literals
    and ``std::to_string`` calls (a ``std::string`` built in place); else the argument itself."""
    terms, depth, start, i = [], 0, 0, 0
    while i < len(arg):
        c = arg[i]
        if c in "\"'":
            i = _literal_end(arg, i)
            continue
        depth += c in "([{"
        depth -= c in ")]}"
        if c == "+" and depth == 0:
            terms.append(arg[start:i].strip())
            start = i + 1
        i += 1
    terms.append(arg[start:].strip())
    if len(terms) > 1 and all(
        _string_pieces(t) is not None or _TO_STRING.fullmatch(t) for t in terms
    ):
        return terms
    return [arg]


def _stringized(arg: str) -> str:
    """What the preprocessor's ``#arg`` gives: whitespace runs folded to one space."""
    return re.sub(r"\s+", " ", arg.strip())


_LITERAL = r'"(?:[^"\\]|\\.)*"'
_CHOICE = re.compile(
    rf"(?P<cond>[^?]+)\?\s*(?P<yes>{_LITERAL})\s*:\s*(?P<no>{_LITERAL})", re.DOTALL
)


def _cpp_placeholder(expr: str) -> Placeholder:
    """A streamed expression; ``cond ? "a" : "b"`` matches exactly ``a`` or ``b``."""
    choice = _CHOICE.fullmatch(expr)
    name = (
        re.sub(r"[^0-9A-Za-z]+", "_", choice.group("cond") if choice else expr).strip("_").lower()
        or "value"
    )
    if choice:
        options = sorted(
            {_string_pieces(choice.group("yes")), _string_pieces(choice.group("no"))},
            key=len,
            reverse=True,
        )
        return Placeholder(
            name[:40], expr, pattern="(?:" + "|".join(re.escape(o) for o in options) + ")"
        )
    return Placeholder(name[:40], expr, pattern=_NON_EMPTY)


def cpp_message(macro: str, args: list[str]) -> Optional[Message]:
    """The message a check prints, from the macro's arguments; None for a check without one."""
    if macro == DEVICE:
        return Message("literal", [f"{_stringized(args[0])} must be on CUDA"])
    if macro == CONTIGUOUS:
        return Message("literal", [f"{_stringized(args[0])} must be contiguous"])
    if macro == SHAPE:
        return Message(
            "literal",
            [f"{_stringized(args[0])} must have shape ({_stringized(', '.join(args[1:]))})"],
        )
    if len(args) < 2:
        return None
    parts: list = []
    for arg in args[1:]:
        for piece in _sum_terms(arg):
            text = _string_pieces(piece)
            to_string = _TO_STRING.fullmatch(piece)
            if text is None:
                parts.append(_cpp_placeholder(to_string.group(1).strip() if to_string else piece))
            elif parts and isinstance(parts[-1], str):
                parts[-1] += text
            elif text:
                parts.append(text)
    return Message("literal" if all(isinstance(p, str) for p in parts) else "format", parts)


_FUNCTION_HEAD = re.compile(
    r"(~?[A-Za-z_]\w*(?:::~?[A-Za-z_]\w*)*)\s*\([^;{}]*\)\s*(?:const\s*)?(?:->[^{;]*)?$", re.DOTALL
)


def _functions(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, name)`` of every function body (a ``{`` block whose head is ``name(...)``)
    that is not nested in another function."""
    found, depth, head_start, i, open_at, name = [], 0, 0, 0, None, None
    while i < len(text):
        c = text[i]
        if c in "\"'":
            i = _literal_end(text, i)
            continue
        if c == "{":
            if open_at is None:
                head = _FUNCTION_HEAD.search(text[head_start:i].rstrip())
                if head and head.group(1).split("::")[-1] not in (
                    "if",
                    "for",
                    "while",
                    "switch",
                    "catch",
                ):
                    open_at, name, depth = i, head.group(1).split("::")[-1], 0
            if open_at is not None:
                depth += 1
            else:
                head_start = i + 1
        elif c == "}":
            if open_at is not None:
                depth -= 1
                if depth == 0:
                    found.append((open_at, i, name))
                    open_at = None
            head_start = i + 1
        elif c == ";" and open_at is None:
            head_start = i + 1
        i += 1
    return found


def scan_cpp(text: str, path: str) -> list[UpstreamMessage]:
    """The check messages of one C++ file, in source order."""
    code = _blank_comments(text)
    functions = _functions(code)
    found = []
    for call in _CALL.finditer(code):
        line_start = code.rfind("\n", 0, call.start()) + 1
        if code[line_start : call.start()].lstrip().startswith("#"):  # the macros' own definitions
            continue
        args, _ = _arguments(code, call.end() - 1)
        message = cpp_message(call.group(1), args)
        if message is None:
            continue
        where = next(
            (name for start, end, name in functions if start < call.start() < end), "<file>"
        )
        found.append(UpstreamMessage(path, where, call.group(1), "RuntimeError", message))
    return found


# --------------------------------------------------------------------------------------------------
# Python
# --------------------------------------------------------------------------------------------------


def returned_strings(module: ast.Module) -> dict[str, list[str]]:
    """``name -> [text, ...]``: the string literals each module-level function returns (a function
    that computes a reason for its caller to raise)."""
    found = {}
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            texts = [
                r.value.value
                for r in ast.walk(node)
                if isinstance(r, ast.Return)
                and r.value is not None
                and isinstance(r.value, ast.Constant)
                and isinstance(r.value.value, str)
            ]
            if texts:
                found[node.name] = texts
    return found


@dataclass
class AssertSource:
    """What stands for the message of a bare ``assert``: its source text."""

    template: str  # "assert <cond>", as ast.unparse writes it
    regex: str


#: Tokens that only lay code out: a bare assert's regex allows any white space in their place.
_LAYOUT_TOKENS = {
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.COMMENT,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def bare_assert_regex(condition_source: str) -> str:
    """An anchored regex for the code line of a bare assert: the tokens of its condition (the
    source of ``node.test``, without the parentheses around it) with any white space between
    them, alone or as the whole statement, ``assert (...)`` too."""
    tokens = [
        t.string
        for t in tokenize.generate_tokens(io.StringIO(condition_source.strip()).readline)
        if t.type not in _LAYOUT_TOKENS
    ]
    body = r"\s*".join(re.escape(t) for t in tokens)
    return r"(?s)\A\s*(?:assert\b\s*)?(?:\(\s*" + body + r"\s*\)|" + body + r")\s*\Z"


class _PythonCollector(ast.NodeVisitor):
    def __init__(self, path: str, constants: dict, reasons: dict, text: str, bare_asserts: bool):
        self.path, self.constants, self.reasons = path, constants, reasons
        self.text, self.bare_asserts = text, bare_asserts
        self.scope: list = []
        self.found: list[UpstreamMessage] = []

    def _enter(self, node):
        self.scope.append(node)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _enter

    def _message(self, arg: ast.expr, line: int) -> Message:
        function = next(
            (
                n
                for n in reversed(self.scope)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            ),
            None,
        )
        message = _MessageReader(
            _annotations(function), _assignments(function), self.constants
        ).read(arg, line)
        for part in message.parts:  # a pasted value is never empty
            if isinstance(part, Placeholder) and part.pattern == ".*?":
                part.pattern = _NON_EMPTY
        return message

    def _add(self, kind: str, exception: str, arg: Optional[ast.expr], line: int) -> None:
        if arg is None:
            return
        where = ".".join(n.name for n in self.scope) or "<module>"
        message = self._message(arg, line)
        # reason = helper(...); raise T(reason): each text the helper returns
        if message.kind == "dynamic":
            for text in self._reasons(arg, line):
                self.found.append(
                    UpstreamMessage(self.path, where, kind, exception, Message("literal", [text]))
                )
        if message.kind in ("dynamic", "none") or not message.parts:
            return
        self.found.append(UpstreamMessage(self.path, where, kind, exception, message))

    def _reasons(self, arg: ast.expr, line: int) -> list[str]:
        """The texts a message variable can hold when its last assignment calls a module function
        that returns string literals."""
        function = next(
            (
                n
                for n in reversed(self.scope)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            ),
            None,
        )
        if not isinstance(arg, ast.Name) or function is None:
            return []
        lines, values = _assignments(function).get(arg.id, ((), ()))
        value = next((v for at, v in zip(reversed(lines), reversed(values)) if at < line), None)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            return self.reasons.get(value.func.id, [])
        return []

    def visit_Raise(self, node: ast.Raise) -> None:
        if isinstance(node.exc, ast.Call):
            name = _exception_name(node.exc)
            self._add(
                "raise",
                name or "Exception",
                node.exc.args[0] if node.exc.args else None,
                node.lineno,
            )

    def visit_Assert(self, node: ast.Assert) -> None:
        if node.msg is not None or not self.bare_asserts:
            self._add("assert", "AssertionError", node.msg, node.lineno)
            return
        condition = ast.get_source_segment(self.text, node.test)
        source = AssertSource(ast.unparse(node), bare_assert_regex(condition))
        where = ".".join(n.name for n in self.scope) or "<module>"
        self.found.append(UpstreamMessage(self.path, where, BARE, "AssertionError", source))


def scan_python(text: str, path: str, bare_asserts: bool = False) -> list[UpstreamMessage]:
    """The raise and assert messages of one Python file, in source order (with ``bare_asserts``,
    the asserts without a message too, by their source)."""
    module = ast.parse(text, filename=path)
    collector = _PythonCollector(
        path, module_constants(module), returned_strings(module), text, bare_asserts
    )
    collector.visit(module)
    return collector.found


# --------------------------------------------------------------------------------------------------
# Trees
# --------------------------------------------------------------------------------------------------


def source_files(root: Path, paths: Iterable[str]) -> Iterator[Path]:
    """The C++ and Python files named by ``paths`` (files or folders under ``root``), sorted."""
    for rel in paths:
        start = root / rel
        if start.is_file():
            yield start
            continue
        if not start.is_dir():
            raise FileNotFoundError(f"{start} does not exist")
        for path in sorted(start.rglob("*")):
            if path.is_file() and (path.suffix == ".py" or path.suffix in CPP_SUFFIXES):
                yield path


def scan_upstream(
    root: Path,
    paths: Iterable[str],
    functions: Optional[set[str]] = None,
    bare_asserts: bool = False,
) -> list[UpstreamMessage]:
    """Every message of the files under ``root`` named by ``paths``, optionally only those raised in
    ``functions`` (a name matches ``Class.method`` by its last part or the whole); with
    ``bare_asserts``, Python's asserts without a message too."""
    root = Path(root)
    found = []
    for path in source_files(root, paths):
        rel = path.relative_to(root).as_posix()
        text = read_source(path)
        found += (
            scan_python(text, rel, bare_asserts) if path.suffix == ".py" else scan_cpp(text, rel)
        )
    if functions:
        found = [
            m for m in found if m.function in functions or m.function.split(".")[-1] in functions
        ]
    return found


__all__ = [
    "BARE",
    "AssertSource",
    "UpstreamMessage",
    "bare_assert_regex",
    "cpp_message",
    "placeholder_name",
    "scan_cpp",
    "scan_python",
    "scan_upstream",
]
