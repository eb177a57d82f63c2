"""Read what users paste into ``python -m errors explain`` or :func:`errors.lookup`.

A paste is one of, in the order tried:

* text with an attn-ref note line (``attn-ref error <id> ...``) after its last exception line: the
  note's id (the note was attached at the raise, so it is exact even where two sites share a
  message);
* a URL whose last path segment is a 16-hex id (``.../errors/<id>/``, ``.../api/errors/<id>.json``,
  or an external page's id): that id;
* a URL of an entry page (``.../errors/<area>/<name>/``, the ``docs_url`` the notes print): its
  slug;
* a traceback or a single exception line (``ValueError: <message>``, ``builtins.ValueError: ...``,
  ``attn_ref.integrations.transformers.UnsupportedAttention: ...``, ``KernelsNameTaken: ...``,
  pytest's ``E   ValueError: ...``, the type in any case): the **last** exception line's type and
  message. A message may continue over the next lines, so every prefix of those lines (up to the
  notes) is a candidate, longest first (a ``KeyError``'s message is the repr of its text: the text
  counts). An ``AssertionError`` without a message (what a bare
  ``assert`` raises) comes with the code lines of the frame above it (caret lines left out) and
  that frame's file, which :func:`errors.upstream.match_code` reads; so does a traceback pasted
  into one line that ends in a bare ``AssertionError``;
* ``ValueError('<message>')`` (a repr): its type and message;
* PyTorch's C++ context after a message (``Exception raised from mha_fwd at ...`` and ``frame #N``
  lines, or the same run into one line): the message before it;
* anything else: the whole text is the message.

ANSI colour codes (a coloured traceback saved to a file) are dropped first. :func:`loose_forms`
gives the spellings that loose matching tries when nothing matches exactly, and
:func:`not_text_reason` says why a paste is not text at all (binary data), so that it is reported,
not echoed.

Nothing here knows the catalog: :func:`read` returns what the text says, and
:func:`errors.catalog.lookup` decides what it matches.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional

#: The start of the note that :mod:`errors.notes` attaches; the id follows.
NOTE_PREFIX = "attn-ref error "
#: Longest paste read (characters); the end of a traceback is what counts, so the start is dropped.
MAX_CHARS = 200_000
#: Where PyTorch's C++ context starts after a message (``Exception raised from <fn> at <file>:<line>
#: ...``).
CPP_CONTEXT = "Exception raised from "
#: Lines after an exception line that may still belong to its message.
MAX_MESSAGE_LINES = 20
#: Longest candidate message (characters): catalogued messages are far shorter, and matching the
#: catalog's regexes against a longer text only costs time.
MAX_MESSAGE_CHARS = 20_000

_NOTE = re.compile(re.escape(NOTE_PREFIX) + r"([0-9a-f]{16})\b")
_URL_ID = re.compile(r"\Ahttps?://\S*?([0-9a-f]{16})(?:/|\.json|\.html)?(?:[?#]\S*)?\Z")
#: An exception class as a traceback prints it: a name ending in Error, Exception, Warning, Exit or
#: Interrupt (``ValueError``, ``builtins.ValueError``), any class named with its module
#: (``attn_ref.integrations.transformers.UnsupportedAttention``), or a CamelCase name of two words
#: or more (``KernelsNameTaken``; ``Note`` or ``HINT`` are not).
_TYPE = (
    r"(?:[A-Za-z_]\w*\.)*(?P<type>[A-Za-z_]\w*(?i:Error|Exception|Warning|Exit|Interrupt)"
    r"|(?<=\.)[A-Z]\w*|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+)"
)
_EXCEPTION_LINE = re.compile(
    r"\A(?P<indent>\s*(?:E\s+)?)" + _TYPE + r"(?::(?: (?P<message>.*)|\s*))?\Z"
)
_URL_SLUG = re.compile(
    r"\Ahttps?://\S*?/errors/([a-z0-9-]+/[a-z0-9-]+)/?(?:index\.html)?(?:[?#]\S*)?\Z"
)
_REPR = re.compile(r"\A" + _TYPE + r"\((?P<args>.*)\)\Z", re.DOTALL)
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_FILE_LINE = re.compile(r'\A\s*File "(?P<path>[^"]+)", line \d+')
_CARETS = re.compile(r"\A\s*[\^~]+\s*\Z")
#: A traceback that lost its line breaks (pasted into one line) and ends in a bare AssertionError:
#: the last frame's file and its code.
_BARE_ONE_LINE = re.compile(
    r'File "(?P<path>[^"]+)", line \d+(?:, in \S+)?\s+(?P<code>(?:(?!File ").)*?)\s*'
    r"(?:[\^~]+\s*)?(?:[A-Za-z_]\w*\.)*AssertionError\s*\Z",
    re.DOTALL | re.IGNORECASE,
)
#: Code lines of one frame, at most (Python 3.13 prints a multi-line statement whole).
MAX_CODE_LINES = 10
#: Control characters that text never holds (tab, line breaks and form feeds aside).
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
#: Typographic quotes and backticks, as the ASCII quote loose matching reads them as.
_QUOTES = str.maketrans(
    {"\u2018": "'", "\u2019": "'", "`": "'", "\u00b4": "'", "\u201c": '"', "\u201d": '"'}
)
_TRAILING_PUNCTUATION = ".!?;:, "


@dataclass
class Pasted:
    """What a paste says: an id (from a note or URL; a slug from a page URL), an exception type,
    candidate messages."""

    id: Optional[str] = None  # an id or slug: errors.catalog.get takes both
    exception_type: Optional[str] = None
    messages: list[str] = field(default_factory=list)  # most complete first
    code: Optional[str] = None  # an exception without a message: the code lines above it
    code_path: Optional[str] = None  # and the file of their frame, when the paste names it


def read(text: str) -> Pasted:
    """The id, exception type and candidate messages in ``text`` (see the module docstring)."""
    text = _ANSI.sub("", text[-MAX_CHARS:]).strip()
    url = _URL_ID.match(text)
    if url:
        return Pasted(id=url.group(1))
    page = _URL_SLUG.match(text)
    if page:
        return Pasted(id=page.group(1))
    as_repr = _REPR.match(text)
    if as_repr:
        message = _literal_str(as_repr.group("args"))
        if message is not None:
            return Pasted(exception_type=as_repr.group("type"), messages=_short([message]))
    lines = text.splitlines()
    last = max((i for i, line in enumerate(lines) if _EXCEPTION_LINE.match(line)), default=None)
    if last is None:
        note = _last_note(lines)
        said = Pasted(id=note, messages=_short([text]) if note is None else [])
        one_line = _BARE_ONE_LINE.search(text) if note is None else None
        if one_line and one_line.group("code").strip():
            said.code, said.code_path = one_line.group("code").strip(), one_line.group("path")
        return said
    line = _EXCEPTION_LINE.match(lines[last])
    said = Pasted(
        id=_last_note(lines[last + 1 :]),
        exception_type=line.group("type"),
        messages=_short(_messages(line, lines[last + 1 :])),
    )
    if said.exception_type.lower() == "keyerror":  # str(KeyError(text)) is repr(text)
        said.messages = [_literal_str(m) or m for m in said.messages]
    if (
        said.exception_type.lower() == "assertionerror"
        and not (line.group("message") or "").strip()
    ):
        said.code, said.code_path = _frame_code(lines[:last])
    return said


def _frame_code(before: list[str]) -> tuple[Optional[str], Optional[str]]:
    """The code lines just above an exception line (up to its frame's ``File "...", line N``
    line, caret lines left out), dedented, and that frame's file."""
    code: list[str] = []
    for line in reversed(before):
        frame = _FILE_LINE.match(line)
        if frame:
            return _dedented(code), frame.group("path")
        if not line.strip() or _EXCEPTION_LINE.match(line) or len(code) == MAX_CODE_LINES:
            break
        if not _CARETS.match(line):
            code.append(line)
    return _dedented(code), None


def _dedented(reversed_lines: list[str]) -> Optional[str]:
    return textwrap.dedent("\n".join(reversed(reversed_lines))).strip() or None


def loose_forms(text: str) -> list[str]:
    """The spellings of a pasted message that loose matching tries, with :func:`compiled`'s loose
    regexes: runs of white space as one space, typographic quotes and backticks as ASCII quotes,
    then every quote as ``'`` or as ``"``, without trailing punctuation."""
    stem = " ".join(text.translate(_QUOTES).split()).rstrip(_TRAILING_PUNCTUATION)
    forms: list[str] = []
    for form in (stem, stem.replace('"', "'"), stem.replace("'", '"')):
        if form not in forms:
            forms.append(form)
    return forms


#: The punctuation that ends a template, as its regex spells it (``re.escape``), before ``\Z``.
_REGEX_END = re.compile(r"(?:\\[.?]|[!;:,])*\\Z\Z")


@lru_cache(maxsize=4096)
def compiled(regex: str, loose: bool = False) -> re.Pattern:
    """A catalog or upstream regex, compiled once (there are more than ``re``'s cache holds);
    ``loose``: in any case, with any trailing punctuation (or none) at the end, and a backtick
    as any quote (:func:`loose_forms` writes the pasted backticks as quotes)."""
    if not loose:
        return re.compile(regex)
    regex = _REGEX_END.sub(lambda _: r"[.!?;:,]*\Z", regex).replace("`", "['\"`]")
    return re.compile(regex, re.IGNORECASE)


def not_text_reason(text: str) -> Optional[str]:
    """Why ``text`` is not a paste of text (NUL or other control characters, bytes that were not
    UTF-8), or None."""
    if "\0" in text:
        return "it holds NUL bytes (binary data)"
    if _SURROGATE.search(text):
        return "it holds bytes that are not UTF-8"
    control = _CONTROL.search(_ANSI.sub("", text))
    if control:
        return f"it holds the control character {control.group(0)!r} (binary data)"
    return None


def _short(messages: list[str]) -> list[str]:
    return [m for m in messages if len(m) <= MAX_MESSAGE_CHARS]


def _last_note(lines: list[str]) -> Optional[str]:
    ids = [m.group(1) for line in lines for m in [_NOTE.search(line)] if m]
    return ids[-1] if ids else None


def _messages(line: re.Match, following: list[str]) -> list[str]:
    """Candidate messages of an exception line: with n, n-1, ..., 0 continuation lines."""
    # pytest repeats "E   " on each line
    first, indent = line.group("message") or "", line.group("indent")
    rest = []
    for extra in following[:MAX_MESSAGE_LINES]:
        if _NOTE.search(extra):
            break
        rest.append(extra[len(indent) :] if indent and extra.startswith(indent) else extra)
    while rest and not rest[-1].strip():
        rest.pop()
    found = ["\n".join([first, *rest[:n]]) for n in range(len(rest), -1, -1)]
    # PyTorch's C++ context ("Exception raised from mha_fwd at .../flash_api.cpp:N ..."), also when
    # the paste lost its line breaks: the message is what comes before it.
    cut = [m.split(CPP_CONTEXT, 1)[0].rstrip() for m in found if CPP_CONTEXT in m]
    return found + [m for m in cut if m not in found]


def _literal_str(source: str) -> Optional[str]:
    """The string that ``source`` (a Python literal) spells, else None."""
    try:
        value = ast.literal_eval(source.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, str) else None
