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
  pytest's ``E   ValueError: ...``): the **last** exception line's type and message. A message may
  continue over the next lines, so every prefix of those lines (up to the notes) is a candidate,
  longest first;
* ``ValueError('<message>')`` (a repr): its type and message;
* PyTorch's C++ context after a message (``Exception raised from mha_fwd at ...`` and ``frame #N``
  lines, or the same run into one line): the message before it;
* anything else: the whole text is the message.

Nothing here knows the catalog: :func:`read` returns what the text says, and
:func:`errors.catalog.lookup` decides what it matches.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
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
_TYPE = r"(?:[A-Za-z_]\w*\.)*(?P<type>[A-Za-z_]\w*(?:Error|Exception|Warning|Exit|Interrupt))"
_EXCEPTION_LINE = re.compile(
    r"\A(?P<indent>\s*(?:E\s+)?)" + _TYPE + r"(?::(?: (?P<message>.*)|\s*))?\Z"
)
_URL_SLUG = re.compile(
    r"\Ahttps?://\S*?/errors/([a-z0-9-]+/[a-z0-9-]+)/?(?:index\.html)?(?:[?#]\S*)?\Z"
)
_REPR = re.compile(r"\A" + _TYPE + r"\((?P<args>.*)\)\Z", re.DOTALL)


@dataclass
class Pasted:
    """What a paste says: an id (from a note or URL; a slug from a page URL), an exception type,
    candidate messages."""

    id: Optional[str] = None  # an id or slug: errors.catalog.get takes both
    exception_type: Optional[str] = None
    messages: list[str] = field(default_factory=list)  # most complete first


def read(text: str) -> Pasted:
    """The id, exception type and candidate messages in ``text`` (see the module docstring)."""
    text = text[-MAX_CHARS:].strip()
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
        return Pasted(id=note, messages=_short([text]) if note is None else [])
    line = _EXCEPTION_LINE.match(lines[last])
    return Pasted(
        id=_last_note(lines[last + 1 :]),
        exception_type=line.group("type"),
        messages=_short(_messages(line, lines[last + 1 :])),
    )


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
