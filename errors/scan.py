"""Find every deliberate ``raise`` of a catalogued exception type in a Python tree, without
importing it.

A *raise site* is one ``raise T(...)`` statement where ``T`` is ``ValueError``, ``TypeError``,
``NotImplementedError`` or a class of the scanned tree that derives from one of them. For each site
the scan records where it is (path, lines, enclosing function) and what it says: the message
*template*, with every f-string expression replaced by a named placeholder, and a *regex* that
matches every message the site can render.

Template extraction (the message argument is the first positional argument of the call):

* f-string ``f"{name} must have dtype {dtype}, got {x.dtype}"`` -> ``{name} must have dtype {dtype},
  got {x_dtype}``. A placeholder is named after its expression: the identifier itself, else a slug
  of the expression source (``tuple(x.shape)`` -> ``tuple_x_shape``). Literal braces are doubled.
* plain literal ``"v_cache must be provided"``; ``"%s ..." % (a,)``; ``"{} ...".format(a)``.
* a name bound earlier in the same function (``msg = f"..."; raise ValueError(msg)``): the last
  assignment before the raise is followed; when that value is computed elsewhere, the template is
  the name itself (``raise NotImplementedError(reason)`` -> ``{reason}``).
* a module-level literal constant (``raise NotImplementedError(MESSAGE)``, or ``{MAX_SPLITS}``
  inside an f-string) is inlined as the text it renders to.
* anything else (a message computed elsewhere) is *dynamic*: the template is one placeholder.

A placeholder is named after its expression, cut to :data:`MAX_NAME` characters (plus a short hash
of the whole expression, so two long expressions keep distinct names).

Robustness: files that are not regular files, are binary, too large, not decodable or not parsable
(syntax errors, expressions nested too deeply) are reported as problems and skipped, never read
twice or waited on. The scan is linear in the size of the tree: each function's annotations and
assignments are collected once, however many raises it holds.

Regex: literal text escaped, each placeholder a lazy ``(?P<name>.*?)`` group (a value may render
empty) (a repeated expression becomes a back-reference), anchored ``\\A...\\Z`` with DOTALL. A
placeholder is narrowed when its type is evident from the code: a ``:d`` spec or an ``int``
annotation or ``len()`` -> an integer, a ``torch.dtype`` annotation or a ``.dtype`` attribute ->
``torch.<name>``, ``tuple(...)`` -> a parenthesised tuple, ``type(x).__name__`` -> an identifier.
Narrowing keeps the regexes of generic helper messages (``{name} must have dtype {dtype}``) from
matching specific ones. A parameter of a private helper for which every call passes a string literal
(the calls of its module and of the modules of the tree that import it by name) matches only those
literals (:func:`literal_arguments`): ``{name} must have contiguous last dimension`` is about
``k_cache``, ``v_cache``, ``qv`` and ``out``, not ``block_table``.
"""

from __future__ import annotations

import ast
import bisect
import hashlib
import io
import re
import stat
import string
import tokenize
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

#: Exception types whose deliberate raises are catalogued.
CATALOGUED_TYPES = ("ValueError", "TypeError", "NotImplementedError")
#: Folders never entered when scanning a tree.
SKIPPED_DIRS = {".git", ".venv", "venv", "__pycache__", "build", "dist", "site", "node_modules"}
#: Lines of context kept before and after the raise statement in an excerpt (clipped to the
#: function).
EXCERPT_BEFORE, EXCERPT_AFTER = 4, 2
#: Longest placeholder name taken from an expression (longer ones are cut and get a hash suffix).
MAX_NAME = 40
#: Largest source file scanned (bytes).
MAX_SOURCE_BYTES = 16 * 1024 * 1024

_INT = r"-?\d+"
_NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)"
_DTYPE = r"torch\.\w+"
_DEVICE = r"[\w:]+"
_TUPLE = r"\(.*?\)"
_IDENTIFIER = r"[\w.]+"
_ANY = r".*?"


@dataclass
class Placeholder:
    """One ``{...}`` field of a template: its name, the expression it renders and how."""

    name: str
    expr: str
    conversion: Optional[str] = None  # "r", "s" or "a"
    spec: Optional[str] = None  # format spec, e.g. "d" or ".3f"
    pattern: str = _ANY

    def as_json(self) -> dict:
        return {
            "name": self.name,
            "expr": self.expr,
            "conversion": self.conversion,
            "spec": self.spec,
            "pattern": self.pattern,
        }


@dataclass
class Message:
    """A message template: literal parts interleaved with placeholders."""

    kind: str  # "fstring", "literal", "percent", "format", "dynamic" or "none"
    parts: list = field(default_factory=list)  # str (literal text) or Placeholder

    @property
    def placeholders(self) -> list[Placeholder]:
        seen, result = set(), []
        for part in self.parts:
            if isinstance(part, Placeholder) and part.name not in seen:
                seen.add(part.name)
                result.append(part)
        return result

    @property
    def template(self) -> str:
        return "".join(
            p.replace("{", "{{").replace("}", "}}") if isinstance(p, str) else "{" + p.name + "}"
            for p in self.parts
        )

    @property
    def regex(self) -> str:
        pieces, seen = [], set()
        for part in self.parts:
            if isinstance(part, str):
                pieces.append(re.escape(part).replace("\\ ", " "))
            elif part.name in seen:
                pieces.append(f"(?P={part.name})")
            else:
                seen.add(part.name)
                pieces.append(f"(?P<{part.name}>{part.pattern})")
        return r"(?s)\A" + "".join(pieces) + r"\Z"


@dataclass
class RaiseSite:
    """One ``raise`` statement of a catalogued type. Lines are 1-based; ``path`` is relative,
    POSIX."""

    path: str
    line: int
    end_line: int
    function: str
    exception: str
    message: Message
    excerpt_start: int
    excerpt_text: str

    @property
    def excerpt_end(self) -> int:
        return self.excerpt_start + self.excerpt_text.count("\n")

    def source_json(self) -> dict:
        return {
            "path": self.path,
            "line": self.line,
            "end_line": self.end_line,
            "function": self.function,
            "excerpt": {
                "start_line": self.excerpt_start,
                "end_line": self.excerpt_end,
                "text": self.excerpt_text,
            },
        }

    def message_json(self) -> dict:
        return {
            "template": self.message.template,
            "kind": self.message.kind,
            "placeholders": [p.as_json() for p in self.message.placeholders],
            "regex": self.message.regex,
        }


class ScanError(Exception):
    """Nothing could be scanned: the path is empty, missing, not a file or folder, or holds no
    readable Python file."""


def placeholder_name(expr: ast.expr) -> str:
    """``x`` for a plain name, else a lower-case slug of the expression source (at most
    :data:`MAX_NAME` characters: a longer slug is cut and ends in 6 hex digits of its hash)."""
    if isinstance(expr, ast.Name):
        return expr.id
    source = ast.unparse(expr)
    slug = re.sub(r"[^0-9A-Za-z]+", "_", source).strip("_").lower() or "value"
    if len(slug) <= MAX_NAME:
        return slug
    digest = hashlib.sha256(source.encode("utf-8", "backslashreplace")).hexdigest()[:6]
    return f"{slug[: MAX_NAME - 7].rstrip('_')}_{digest}"


def _narrow(
    expr: ast.expr,
    spec: Optional[str],
    conversion: Optional[str],
    annotations: dict,
    choices: Optional[dict] = None,
) -> str:
    """The tightest pattern that the code makes evident for a rendered expression."""
    if (
        conversion is None
        and spec is None
        and isinstance(expr, ast.Name)
        and (choices or {}).get(expr.id)
    ):
        return "(?:" + "|".join(re.escape(c).replace("\\ ", " ") for c in choices[expr.id]) + ")"
    if spec:
        if spec[-1] in "dxob":
            return _INT
        if spec[-1] in "eEfFgG%":
            return _NUMBER
        return _ANY
    if conversion in ("r", "a"):
        return _ANY
    annotation = annotations.get(expr.id) if isinstance(expr, ast.Name) else None
    if annotation == "int":
        return _INT
    if annotation == "torch.dtype" or (isinstance(expr, ast.Attribute) and expr.attr == "dtype"):
        return _DTYPE
    if annotation == "torch.device" or (isinstance(expr, ast.Attribute) and expr.attr == "device"):
        return _DEVICE
    if isinstance(expr, ast.Attribute) and expr.attr == "__name__":
        return _IDENTIFIER
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
        if expr.func.id in ("len", "int"):
            return _INT
        if expr.func.id == "tuple":
            return _TUPLE
    return _ANY


class _MessageReader:
    """Turns the message argument of a raise into a :class:`Message`."""

    def __init__(
        self, annotations: dict, assignments: dict, constants: dict, choices: Optional[dict] = None
    ):
        self.annotations = annotations  # parameter name -> annotation source
        # parameter name -> the string literals every call passes for it
        self.choices = choices or {}
        # variable name -> ([line, ...] sorted, [value node, ...]) in the function
        self.assignments = assignments
        self.constants = constants  # module-level NAME -> literal value (str, number, tuple, ...)

    def read(self, arg: Optional[ast.expr], line: int) -> Message:
        """The message of ``arg`` as evaluated at ``line``."""
        if arg is None:
            return Message("none", [])
        if isinstance(arg, ast.Name):
            lines, values = self.assignments.get(arg.id, ((), ()))
            before = bisect.bisect_left(lines, line)
            if before:  # follow the last assignment before this line, as evaluated at its own line
                followed = self.read(values[before - 1], lines[before - 1])
                return followed if followed.kind != "dynamic" else self._dynamic(arg)
            if isinstance(self.constants.get(arg.id), str):
                return Message("literal", [self.constants[arg.id]])
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return Message("literal", [arg.value] if arg.value else [])
        if isinstance(arg, ast.JoinedStr):
            return Message("fstring", self._fstring_parts(arg))
        if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mod) and _is_str(arg.left):
            values = arg.right.elts if isinstance(arg.right, ast.Tuple) else [arg.right]
            return self._printf(arg.left.value, values) or self._dynamic(arg)
        if (
            isinstance(arg, ast.Call)
            and isinstance(arg.func, ast.Attribute)
            and arg.func.attr == "format"
            and _is_str(arg.func.value)
        ):
            return self._format(arg.func.value.value, arg) or self._dynamic(arg)
        return self._dynamic(arg)

    def _placeholder(self, expr: ast.expr, conversion=None, spec=None) -> Placeholder:
        return Placeholder(
            placeholder_name(expr),
            ast.unparse(expr),
            conversion,
            spec,
            _narrow(expr, spec, conversion, self.annotations, self.choices),
        )

    def _dynamic(self, arg: ast.expr) -> Message:
        return Message("dynamic", [self._placeholder(arg)])

    def _fstring_parts(self, node: ast.JoinedStr) -> list:
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                _append_text(parts, value.value)
            else:
                conversion = chr(value.conversion) if value.conversion != -1 else None
                spec = None
                if value.format_spec is not None:
                    spec = "".join(
                        v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                        for v in value.format_spec.values
                    )
                constant = self._render_constant(value.value, conversion, spec)
                if constant is not None:
                    _append_text(parts, constant)
                else:
                    parts.append(self._placeholder(value.value, conversion, spec))
        return parts

    def _render_constant(
        self, expr: ast.expr, conversion: Optional[str], spec: Optional[str]
    ) -> Optional[str]:
        """The rendered text of a module-level literal constant (``{MAX_NUM_SPLITS}`` ->
        ``256``)."""
        if not isinstance(expr, ast.Name) or expr.id not in self.constants:
            return None
        value = self.constants[expr.id]
        value = {"r": repr, "a": ascii, "s": str}.get(conversion, lambda v: v)(value)
        try:
            return format(value, spec or "")
        except (TypeError, ValueError):
            return None

    def _printf(self, text: str, values: list) -> Optional[Message]:
        pieces = re.split(r"(%[-#0 +]*\d*(?:\.\d+)?[sdirfgex%])", text)
        parts, index = [], 0
        for piece in pieces:
            if not piece.startswith("%") or len(piece) < 2:
                _append_text(parts, piece)
            elif piece == "%%":
                _append_text(parts, "%")
            else:
                if index >= len(values):
                    return None
                conversion = "r" if piece[-1] == "r" else None
                spec = None if piece[-1] in "sr" else piece[-1]
                parts.append(self._placeholder(values[index], conversion, spec))
                index += 1
        return Message("percent", parts) if index == len(values) else None

    def _format(self, text: str, call: ast.Call) -> Optional[Message]:
        keywords = {k.arg: k.value for k in call.keywords if k.arg}
        parts, auto = [], 0
        for literal, field_name, spec, conversion in string.Formatter().parse(text):
            _append_text(parts, literal)
            if field_name is None:
                continue
            if field_name == "":
                field_name, auto = str(auto), auto + 1
            key = re.match(r"\w+", field_name).group(0)
            if key.isdigit():
                if int(key) >= len(call.args):
                    return None
                expr = call.args[int(key)]
            elif key in keywords:
                expr = keywords[key]
            else:
                return None
            parts.append(self._placeholder(expr, conversion, spec or None))
        return Message("format", parts)


def _is_str(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _append_text(parts: list, text: str) -> None:
    if not text:
        return
    if parts and isinstance(parts[-1], str):
        parts[-1] += text
    else:
        parts.append(text)


def _exception_name(node: ast.expr) -> Optional[str]:
    """``ValueError`` for ``raise ValueError(...)``, ``raise ValueError`` or ``raise
    mod.ValueError(...)``."""
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


def catalogued_classes(trees: dict[str, ast.Module]) -> set[str]:
    """The catalogued built-in types plus every class of the trees deriving from one
    (transitively)."""
    subclasses: dict = {}
    for module in trees.values():
        for node in ast.walk(module):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    subclasses.setdefault(_exception_name(base), []).append(node.name)
    known, todo = set(CATALOGUED_TYPES), deque(CATALOGUED_TYPES)
    while todo:
        for name in subclasses.get(todo.popleft(), []):
            if name not in known:
                known.add(name)
                todo.append(name)
    return known


class _SiteCollector(ast.NodeVisitor):
    """Walks one module, keeping the qualified name of the enclosing function or class."""

    def __init__(
        self,
        path: str,
        lines: list[str],
        types: set[str],
        constants: dict,
        choices: Optional[dict] = None,
    ):
        self.path, self.lines, self.types, self.constants = path, lines, types, constants
        # private function name -> {parameter: literal values of every call}
        self.choices = choices or {}
        self.scope: list[ast.AST] = []
        self.sites: list[RaiseSite] = []
        self._readers: dict = {}  # id(function node) -> its _MessageReader, built once per function

    def _enter(self, node):
        self.scope.append(node)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _enter

    def _function(self):
        return next(
            (
                n
                for n in reversed(self.scope)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            ),
            None,
        )

    def _reader(self, function) -> _MessageReader:
        key = id(function)
        if key not in self._readers:
            choices = (
                self.choices.get(function.name, {})
                if function is not None and len(self.scope) == 1
                else {}
            )
            self._readers[key] = _MessageReader(
                _annotations(function), _assignments(function), self.constants, choices
            )
        return self._readers[key]

    def visit_Raise(self, node: ast.Raise) -> None:
        name = _exception_name(node.exc) if node.exc is not None else None
        if name not in self.types:
            return
        function = self._function()
        call = node.exc if isinstance(node.exc, ast.Call) else None
        arg = call.args[0] if call is not None and call.args else None
        message = self._reader(function).read(arg, node.lineno)
        first = function.lineno if function is not None else 1
        last = function.end_lineno if function is not None else len(self.lines)
        start = max(first, node.lineno - EXCERPT_BEFORE)
        end = min(last, node.end_lineno + EXCERPT_AFTER)
        self.sites.append(
            RaiseSite(
                path=self.path,
                line=node.lineno,
                end_line=node.end_lineno,
                function=".".join(n.name for n in self.scope) or "<module>",
                exception=name,
                message=message,
                excerpt_start=start,
                excerpt_text="\n".join(self.lines[start - 1 : end]),
            )
        )


def module_constants(module: ast.Module) -> dict:
    """Module-level ``NAME = <literal>`` assignments (names in upper case, assigned once)."""
    found, seen = {}, set()
    for node in module.body:
        target = (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        )
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            target = node.target
        if not isinstance(target, ast.Name) or not target.id.isupper():
            continue
        if target.id in seen:
            found.pop(target.id, None)
            continue
        seen.add(target.id)
        try:
            found[target.id] = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
    return found


def literal_arguments(module: ast.Module, importers: tuple = ()) -> dict:
    """``name -> {parameter: (literal, ...)}`` for the module's private top-level functions
    (``_name``) whose every call passes a string literal for that parameter: every call in the
    module and in the ``importers``, ``(module, {local name: function name})`` pairs of the modules
    that import its functions with ``from ... import _name`` (:func:`private_importers` finds them).

    A message such as ``f"{name} must have contiguous last dimension"`` then matches only the names
    the code passes (``k_cache``, ``v_cache``...), not any argument of another library. A call with
    ``*args`` or ``**kwargs``, or a reference that is not a call, makes every parameter open; so
    does any use :func:`scan_files` cannot follow (an attribute ``module._name``, an import it
    cannot resolve to a scanned file).
    """
    functions = {
        n.name: n
        for n in module.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("_")
    }
    found: dict = {name: {} for name in functions}
    for tree, names in ((module, {name: name for name in functions}), *importers):
        # functions only
        names = {local: name for local, name in names.items() if name in functions}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Load):
                values = found[names[node.id]]
                values["<referenced>"] = values.get("<referenced>", 0) + 1
            called = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            if not (called and node.func.id in names):
                continue
            function = names[node.func.id]
            values = found[function]
            values["<referenced>"] = values.get("<referenced>", 0) - 1  # this reference is a call
            args = functions[function].args
            params = [a.arg for a in (*args.posonlyargs, *args.args)]
            open_call = any(isinstance(a, ast.Starred) for a in node.args) or any(
                k.arg is None for k in node.keywords
            )
            given = dict(zip(params, node.args))
            given.update({k.arg: k.value for k in node.keywords if k.arg})
            for param in params:
                arg = given.get(param)
                literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                if literal and not open_call and values.get(param, set()) is not None:
                    values.setdefault(param, set()).add(arg.value)
                else:
                    values[param] = None
    return {
        name: {p: tuple(sorted(v)) for p, v in values.items() if p != "<referenced>" and v}
        for name, values in found.items()
        if values and values.get("<referenced>", 0) == 0
    }


def private_importers(trees: dict[str, ast.Module]) -> tuple[dict, set[str]]:
    """Who imports the private names of which scanned module: ``({path: ((module, {local name:
    name}), ...)}, unresolved)``, from every ``from ... import _name`` of a scanned file (named by
    its path from the root: ``from .checks import _x`` in ``pkg/a.py`` is ``pkg/checks.py``);
    ``unresolved``: the private names imported from elsewhere or used as attributes (``mod._name``),
    whose calls the scan cannot see."""
    importers: dict = {}
    unresolved: set[str] = set()
    for rel, module in trees.items():
        bound: dict = {}
        for node in ast.walk(module):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                unresolved.add(node.attr)
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _imported_file(rel, node, trees)
            for alias in node.names:
                if not alias.name.startswith("_"):
                    continue
                if source is None:
                    unresolved.add(alias.name)
                else:
                    bound.setdefault(source, {})[alias.asname or alias.name] = alias.name
        for source, names in bound.items():
            importers.setdefault(source, []).append((module, names))
    return {source: tuple(found) for source, found in importers.items()}, unresolved


def _imported_file(rel: str, node: ast.ImportFrom, trees: dict) -> Optional[str]:
    """The scanned file (path relative to the root) that ``from <module> import ...`` in ``rel``
    names, or None: a module ``a/b.py`` or a package ``a/b/__init__.py``."""
    folders = rel.split("/")[:-1]
    if node.level > len(folders) + 1:
        return None
    base = folders[: len(folders) - node.level + 1] if node.level else []
    dotted = "/".join(base + (node.module.split(".") if node.module else []))
    return next((path for path in (dotted + ".py", dotted + "/__init__.py") if path in trees), None)


def _annotations(function) -> dict:
    if function is None:
        return {}
    args = function.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    return {a.arg: ast.unparse(a.annotation) for a in every if a.annotation is not None}


def _assignments(function) -> dict:
    """``name -> ([line, ...], [value, ...])`` of the function's ``name = value`` statements, by
    line."""
    found: dict = {}
    if function is None:
        return found
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            found.setdefault(node.targets[0].id, []).append((node.lineno, node.value))
    return {
        name: ([at for at, _ in items], [value for _, value in items])
        for name, items in (
            (name, sorted(items, key=lambda item: item[0])) for name, items in found.items()
        )
    }


def python_files(root: Path, folders: Optional[list[str]] = None) -> Iterator[Path]:
    """``*.py`` paths under ``root`` (or the given sub-folders or files), sorted, skipping build
    folders.

    Every path found is yielded, also one that is not a regular file: :func:`scan` reports those.
    """
    starts = [root / f for f in folders] if folders else [root]
    for start in starts:
        if not start.is_dir():
            yield start
            continue
        for path in sorted(start.rglob("*.py")):
            if not SKIPPED_DIRS & set(path.relative_to(root).parts[:-1]):
                yield path


def read_source(path: Path) -> str:
    """The decoded text of a Python file (PEP 263 encoding, default UTF-8).

    ``ValueError`` with a readable reason for anything but a regular, text, decodable file of at
    most
    :data:`MAX_SOURCE_BYTES`; a FIFO or device is never opened.
    """
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > MAX_SOURCE_BYTES:
            raise ValueError(f"{info.st_size} bytes, more than {MAX_SOURCE_BYTES}")
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(exc.strerror or str(exc)) from None
    if b"\0" in data:
        raise ValueError("a binary file, with NUL bytes")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
        raise ValueError(f"not decodable as Python source ({type(exc).__name__}: {exc})") from None


def _parse(path: Path) -> tuple[ast.Module, str]:
    """The module and its text; ``ValueError`` with the reason it cannot be scanned."""
    text = read_source(path)
    try:
        return ast.parse(text, filename=str(path)), text
    except SyntaxError as exc:
        raise ValueError(f"SyntaxError: {exc}") from None
    except (RecursionError, MemoryError):
        raise ValueError("an expression is nested too deeply to parse") from None


def scan(root: Path, folders: Optional[list[str]] = None) -> tuple[list[RaiseSite], list[str]]:
    """All raise sites under ``root`` (optionally only in ``folders``), sorted by path and line.

    Returns ``(sites, problems)``; ``problems`` names files that could not be read or parsed.
    """
    return scan_files(Path(root), list(python_files(Path(root), folders)))


def scan_files(root: Path, paths: list[Path]) -> tuple[list[RaiseSite], list[str]]:
    """:func:`scan` of the given files (paths under ``root``)."""
    trees, sources, problems = {}, {}, []
    for path in paths:
        rel = path.relative_to(root).as_posix() if path != root else path.name
        try:
            trees[rel], text = _parse(path)
        except ValueError as exc:
            problems.append(f"{rel}: not scanned ({exc})")
            continue
        sources[rel] = text.splitlines()
    types = catalogued_classes(trees)
    importers, unresolved = private_importers(trees)
    sites = []
    for rel, module in trees.items():
        narrowed = literal_arguments(module, importers.get(rel, ()))
        choices = {name: params for name, params in narrowed.items() if name not in unresolved}
        collector = _SiteCollector(rel, sources[rel], types, module_constants(module), choices)
        try:
            collector.visit(module)
        except RecursionError:
            problems.append(f"{rel}: not scanned (an expression is nested too deeply to read)")
            continue
        sites.extend(collector.sites)
    sites.sort(key=lambda s: (s.path, s.line))
    return sites, problems


def scan_path(path_text: str) -> tuple[list[RaiseSite], list[str]]:
    """:func:`scan` of a file or folder named on the command line (paths relative to it, or to the
    file's folder). ``ScanError`` when nothing could be scanned: the path is empty, missing, neither
    a regular file nor a folder, holds no ``*.py`` file, or none of its files could be read or
    parsed."""
    if not path_text.strip():
        raise ScanError("the path is empty: give a Python file or a folder")
    path = Path(path_text)
    if path.is_dir():
        root, paths = path, list(python_files(path))
        if not paths:
            raise ScanError(f"no Python files under {path_text}")
    elif path.is_file():
        root, paths = path.parent, [path]
    elif path.exists() or path.is_symlink():
        raise ScanError(f"{path_text} is neither a regular file nor a folder")
    else:
        raise ScanError(f"{path_text} does not exist")
    sites, problems = scan_files(root, paths)
    if len(problems) == len(paths):
        raise ScanError(
            f"nothing could be scanned: {problems[0]}"
            if len(paths) == 1
            else f"nothing could be scanned: none of the {len(paths)} files could be read "
            f"({problems[0]}; ...)"
        )
    return sites, problems
