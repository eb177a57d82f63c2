"""Exception notes: the catalog id and docs link on errors raised through the public API (PEP 678).

Public entry points are decorated with :func:`catalogued`. When a catalogued exception leaves them,
one note is appended. Like ``rustc --explain``, it names a command that works offline, then the
page::

    ValueError: q can only be None when only_qv=True
    attn-ref error 12a7...: kvcache/q-none-...; run `python -m errors explain 12a7...` or see
    https://.../errors/12a7.../

``str(exc)`` is unchanged, so code that matches messages keeps working. The entry is found by where
the exception was raised (the innermost traceback frame inside the package must lie on an entry's
recorded raise statement, and the message must match that entry's regex), so exceptions from
PyTorch, Triton or user callbacks get no note.

Settings: ``ATTN_REF_ERROR_NOTES=0`` turns notes off; ``ATTN_REF_DOCS_URL`` sets the docs site the
note links to (a local build or a mirror; empty: no link, only the command), default the published
site. Looking the entry up never raises: when the catalog cannot be read, is corrupt, or anything
else goes wrong, the exception simply leaves without a note and is never replaced.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Callable, Optional, TypeVar

from . import catalog as cat
from .pasted import NOTE_PREFIX

#: Environment variable that turns the notes off when set to 0, false, no or off.
ENV_VAR = "ATTN_REF_ERROR_NOTES"
#: The command that prints an entry offline (the note names it with the entry's id).
EXPLAIN_COMMAND = "python -m errors explain"

F = TypeVar("F", bound=Callable)


def notes_enabled() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def note_for(exc: BaseException) -> Optional[str]:
    """The note for ``exc``, or None when it was not raised by a catalogued raise statement."""
    try:
        catalog = cat.load()
    except cat.CatalogError:
        return None
    location = cat.raise_location(exc)
    entry = cat.at_location(*location, catalog=catalog) if location else None
    if entry is None or entry["exception"]["type"] != type(exc).__name__:
        return None
    if not re.fullmatch(entry["message"]["regex"], str(exc)):
        return None
    link = cat.reader_docs_url(entry, catalog)
    return f"{NOTE_PREFIX}{entry['id']}: {entry['slug']}; run `{EXPLAIN_COMMAND} {entry['id']}`" + (
        f" or see {link}" if link else ""
    )


def add_catalog_note(exc: BaseException) -> None:
    """Append the catalog note to ``exc`` once (nothing when notes are off or no entry fits).

    Never raises: the exception being noted is the one the caller must see.
    """
    try:
        if not notes_enabled() or any(
            str(n).startswith(NOTE_PREFIX) for n in getattr(exc, "__notes__", [])
        ):
            return
        note = note_for(exc)
        if note is not None:
            exc.add_note(note)
    # a corrupt catalog, a regex or recursion problem: the real exception goes on unnoted
    except Exception:
        return


def catalogued(func: F) -> F:
    """Decorator for public entry points: catalogued exceptions leave with their catalog note."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (ValueError, TypeError, NotImplementedError) as exc:
            add_catalog_note(exc)
            raise

    return wrapper
