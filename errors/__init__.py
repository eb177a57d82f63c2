"""errors: the catalog of every exception attn-ref raises on purpose, checked against the code.

``errors/catalog.json`` holds one entry per ``raise`` statement of ``ValueError``, ``TypeError`` or
``NotImplementedError`` in ``attn_ref/`` and ``kernels/`` (format: ``errors/README.md``). This
package reads and checks it without importing :mod:`attn_ref`:

* :func:`get` (id, slug, alias or external alias id), :func:`lookup` (an exception, or what users
  paste: a traceback, a ``Type: message`` line, a note, a URL, a message), :func:`explain`
  (markdown), :func:`match` (every entry a message fits);
* :func:`catalogued`: the decorator that adds the id, the ``explain`` command and the docs link to
  exceptions as a note;
* ``python -m errors explain|search|list|check|sync|scan``.
"""

from .catalog import CatalogError, explain, get, load, lookup, match
from .notes import catalogued

__all__ = ["CatalogError", "catalogued", "explain", "get", "load", "lookup", "match"]
