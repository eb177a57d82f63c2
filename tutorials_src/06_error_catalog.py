# %% [markdown]
# # The error catalog: from an error message to its fix
#
# Every error that attn-ref raises on purpose (a `ValueError`, `TypeError` or `NotImplementedError`
# in `attn_ref/` or `kernels/`) has an entry in a machine-readable catalog, `errors/catalog.json`.
# Each entry has a stable 16-hex-digit **id**, a short slug, an explanation, numbered solutions,
# runnable examples and the exact place in the source that raises it. The tests check the catalog
# against the code, so it cannot drift.
#
# This notebook makes a typical mistake, catches the error, looks it up in the three ways the
# catalog offers in code (Python, the command line, the JSON file), and applies the fix. On this
# site there is a fourth: paste the error message into the search box, and its entry comes first.

# %%
import json
import os
import re
import subprocess
import sys

import torch

if not torch.cuda.is_available():
    # Triton kernels through the interpreter; set before importing them
    os.environ["TRITON_INTERPRET"] = "1"

from IPython.display import Markdown, display

import attn_ref
import errors
import kernels

_ = torch.manual_seed(0)

# %% [markdown]
# ## A mistake: decoding past the end of the cache
#
# A paged KV cache with pages of 4 tokens; the sequence got 2 pages, so it has room for 8 tokens. We
# decode one token per step (see tutorial 1) and forget to check the length.

# %%
page_size, h, d = 4, 2, 16
k_pages = torch.zeros(6, page_size, h, d)  # 6 physical pages of page_size tokens
v_pages = torch.zeros_like(k_pages)
page_table = torch.tensor([[3, 0]], dtype=torch.int32)  # this sequence owns pages 3 and 0


def decode(steps, page_table):
    """Append and attend one random token per step; returns the number of steps that ran."""
    for step in range(steps):
        q, k, v = torch.randn(1, 1, h, d), torch.randn(1, 1, h, d), torch.randn(1, 1, h, d)
        attn_ref.flash_attn_with_kvcache(
            q, k_pages, v_pages, k=k, v=v, cache_seqlens=step, page_table=page_table
        )
    return steps


try:
    decode(12, page_table)
except ValueError as error:
    caught = error
else:
    raise AssertionError("expected a ValueError")
print(caught)

# %% [markdown]
# The message says what was expected and what was given. Nothing was written for the failing step:
# every check runs before the cache is touched. The exception also carries a **note** (PEP 678) with
# its catalog id, the command that explains it offline, and a link to its page on the docs site
# (`ATTN_REF_DOCS_URL` points the link at another build, for instance a local `make serve`; empty
# drops it); Python prints the note under the traceback.

# %%
print(caught.__notes__[0])

# %% [markdown]
# ## 1. In Python: `errors.lookup`
#
# `errors.lookup` takes the exception (or just its message, pasted from a log) and returns the
# catalog entry, a plain dict.

# %%
entry = errors.lookup(caught)
assert entry is not None and entry["slug"] == "kv-cache/capacity-exceeded"
assert errors.lookup(str(caught)) == entry  # the message alone finds it too
print(entry["id"], entry["slug"], "-", entry["summary"])

# %% [markdown]
# The id is frozen when the entry is created (the first 64 bits of a SHA-256 of the exception type
# and the message template), so links and bookmarks keep working when the message is reworded later.
# The slug and the id both retrieve the entry:

# %%
assert errors.get(entry["id"]) == errors.get("kv-cache/capacity-exceeded") == entry
print("What it means:\n")
print(entry["what_it_means"])

# %% [markdown]
# The solutions, rendered as Markdown:

# %%
display(
    Markdown(
        "\n".join(f"{n}. **{s['title']}** {s['body']}" for n, s in enumerate(entry["solutions"], 1))
    )
)

# %% [markdown]
# The Triton kernels share the reference's argument checks, so the same mistake gives the same
# error, and the same entry:

# %%
try:
    kernels.flash_attn_with_kvcache(
        torch.randn(1, 1, h, d),
        k_pages,
        v_pages,
        k=torch.randn(1, 1, h, d),
        v=torch.randn(1, 1, h, d),
        cache_seqlens=8,
        page_table=page_table,
    )
except ValueError as error:
    assert errors.lookup(error)["id"] == entry["id"]
    print(error)
else:
    raise AssertionError("expected a ValueError")

# %% [markdown]
# ## 2. On the command line: `python -m errors`
#
# The same lookups from a shell: `explain` takes a message (with or without its `ValueError: `
# prefix), an id or a slug and prints the entry as Markdown; `explain -` reads a whole pasted
# traceback from stdin (the last exception line counts); `search` finds entries by words. For
# example:
#
# ```bash
# python -m errors explain "batch entry 0: cache_seqlens (8) + new tokens (1) exceeds the \
# cache capacity (8 tokens per sequence)"
# python -m errors explain 9a8439341d112b8b
# python -m errors explain - < traceback.txt
# python -m errors search capacity
# ```
#
# Here we run them from Python and show the beginning of the output.


# %%
def errors_cli(*args):
    """Run `python -m errors ARGS` with this kernel's Python; returns its standard output."""
    result = subprocess.run(
        [sys.executable, "-m", "errors", *args], capture_output=True, text=True, check=True
    )
    return result.stdout


explained = errors_cli("explain", str(caught))
assert entry["id"] in explained
print("\n".join(explained.splitlines()[:16]))

# %%
print(errors_cli("search", "capacity"))

# %% [markdown]
# ## 3. The JSON file
#
# The catalog is one JSON file shipped inside the package; any tool can read it without importing
# attn-ref. The docs site serves each entry at `/api/errors/<id>.json` (byte for byte the same
# object) and the whole index at `/api/errors/index.json`.

# %%
catalog_path = os.path.join(os.path.dirname(errors.__file__), "catalog.json")
with open(catalog_path, encoding="utf-8") as file:
    catalog = json.load(file)

from_json = next(e for e in catalog["errors"] if e["id"] == entry["id"])
assert from_json == entry
print(f"{len(catalog['errors'])} entries; this one is served at {entry['api_url']}")
print("fields:", ", ".join(entry))

# %% [markdown]
# Among the fields: the message template and a regular expression that matches every rendering of it
# (that is how a message pasted from a log is recognised), and the place in the source that raises
# it.

# %%
print("template:", entry["message"]["template"])
assert re.fullmatch(entry["message"]["regex"], str(caught))
source = entry["source"]
print(f"raised in {source['path']}, function {source['function']}, line {source['line']}")

# %% [markdown]
# Some entries share their message with sglang: a user who meets the error in sglang and searches
# for it lands on the same explanation. Those entries fill in the `upstream` field:

# %%
shared = [e for e in catalog["errors"] if e.get("upstream")]
example = errors.get("only-qv/q-none-without-only-qv")
print(f"{len(shared)} of {len(catalog['errors'])} entries are shared with sglang, e.g.")
print(
    f"  {example['message']['template']!r}: {example['upstream']['repository']}, "
    f"{example['upstream']['path']}"
)

# %% [markdown]
# ## Apply the fix
#
# The entry's solution for paged caches: *add pages*. Before a sequence crosses the end of its
# page-table row, give it another page. We append one free page to the row and decode all 12 steps.

# %%
free_pages = [p for p in range(k_pages.shape[0]) if p not in page_table[0].tolist()]
bigger_table = torch.cat([page_table, torch.tensor([free_pages[:1]], dtype=torch.int32)], dim=1)
print(
    "page table",
    page_table.tolist(),
    "->",
    bigger_table.tolist(),
    f"(room for {bigger_table.shape[1] * page_size} tokens)",
)
assert decode(12, bigger_table) == 12

# %% [markdown]
# ## Summary
#
# * **The exception note** under every traceback:
#   ``attn-ref error <id>: <slug>; run `python -m errors explain <id>` or see <docs link>``.
# * **The site's search box**: paste the error message into it; its entry comes first.
# * **`errors.lookup(exc_or_message)`**: the entry as a dict: meaning, solutions, examples, source.
# * **`python -m errors explain <message, traceback, id or slug>`** (`-` reads a pasted traceback
#   from stdin): the same entry as Markdown in a terminal.
# * **`errors/catalog.json`, `/api/errors/<id>.json`**: the raw data, for tools and other
#   languages.
#
# The other tutorials catch their errors the same way: the cells that make a mistake on purpose
# assert the error and resolve it to its catalog id.
