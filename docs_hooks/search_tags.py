"""MkDocs hook: search tags for the concept pages that own a term the page's words alone rank badly.

Material's search scores a match in a page's tags a thousand times a title match (``tags`` boost
1e6), so a tagged page comes first for its term, whatever the other pages' headings say. Without
Material's tags plugin the tags are not drawn on the page: they only steer the search.

* "ring": the API reference's section titles (``ring_attention``, ``ring_...``) are short and all
  start with the word, so they outranked the concept page's "Ring attention: rotate K/V blocks".
* "LSE": the split-KV page writes "log-sum-exp" in its titles; the word was in its text only.
* "all-to-all": the search splits it at the hyphens into "all", "to", "all", English stop words
  that the index drops, so only the prefix "all" is searched; the tag ``all_to_all`` (the
  collective's name, one token) carries it.
"""

from __future__ import annotations

#: Source page -> its search tags.
SEARCH_TAGS = {
    "concepts/sequence-parallel.md": ["ring", "all_to_all", "Ulysses"],
    "concepts/split-kv.md": ["LSE", "log-sum-exp"],
}


def on_page_markdown(markdown, page, config, files):
    tags = SEARCH_TAGS.get(page.file.src_uri)
    if tags:
        page.meta["tags"] = [*page.meta.get("tags", []), *tags]
    return markdown
