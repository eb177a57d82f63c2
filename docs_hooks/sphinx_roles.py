"""MkDocs hook: turn the Sphinx roles of the docstrings (``:func:`x```) into links.

The package's docstrings cross-reference with Sphinx roles (``:func:``, ``:class:``, ``:mod:``,
...), which mkdocstrings' Google-style parser leaves as text: ``:func:<code>x</code>``. This hook
rewrites each into an optional autorefs reference, so ``x`` becomes a link when the site documents
it and stays plain code when it does not (a private helper, a torch function).
"""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:func|meth|class|mod|data|attr|exc|obj):<code>~?(?P<target>[\w.]+)</code>")


def on_page_content(html, page, config, files):
    return ROLE.sub(
        lambda m: (
            f'<autoref identifier="{m["target"]}" optional><code>{m["target"]}</code></autoref>'
        ),
        html,
    )
