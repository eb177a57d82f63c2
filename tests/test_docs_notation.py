"""One notation on what the reader sees: the built site's pages, read as rendered.

docs/notation.md gives every quantity one symbol. This test builds the site and reads each page the
way a reader meets it, in parts: prose (Markdown and notebook text, tables, captions), the steps of
the side-by-side rows, code a page or tutorial writes itself (code cells, examples), the outputs
of the tutorials' cells, and the text of the SVG figures. It rejects the spellings the notation page
retired, each where it names a quantity (a pattern says in which parts it is looked for).

Allowed, as the notation page's translation table says: upstream argument names in code
(``max_seqlen_q``, ``page_size``, ``num_heads_k``...) and messages quoted as upstream or this
package raise them (every catalog template and upstream message is cut out of the text before
the search).
The package's own code, shown by the side-by-side cells and ``source(...)`` includes, keeps its
identifiers (``sq``, ``dv``...) and is searched only for the per-entry symbols (``C_i``, ``N_i``,
``L_i``, ``P0``, ``Sq_b``); its docstrings are held to the rest by ``tests/test_docs.py``.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[1]

#: The parts of a page a pattern is searched in.
PROSE, STEP, CODE, OUTPUT, FIGURE = "prose", "step", "code", "output", "figure"
SOURCE = "source"  # the package's own code, on the side-by-side and concept pages
READ = (PROSE, STEP, FIGURE)  # text read as notation
WRITTEN = (PROSE, STEP, FIGURE, CODE, OUTPUT)  # and the code the docs write themselves
EVERYWHERE = (*WRITTEN, SOURCE)  # and the package's comments and docstrings


@dataclass(frozen=True)
class Retired:
    pattern: str
    where: tuple[str, ...]
    use: str


#: The spellings docs/notation.md retired, where each is looked for, and what replaces it.
RETIRED = [
    Retired(
        r"\bp // P\b|\bp % P\b|\bnum_pages\W{1,3}P\b|\bP = page_size|pages? of `?P`? tokens|"
        r"page size `?P\b|\(num_pages, P,|\) / P\)|zeros\(\d+, P, |\* P\} tokens",
        WRITTEN,
        "page_size (P is the number of ranks)",
    ),
    Retired(
        r"\bfor h in\b|\bfor h, |[Qq]uery head `{0,2}h\b`{0,2}(?! ?=)|\bhead `{0,2}h`{0,2},"
        r"|\bhead \$h\$|σ_h\b",
        WRITTEN,
        "head, the index of a query head (h is the number of query heads)",
    ),
    Retired(
        r"\bh = (?:model|layer|block|hidden|self)\b|\bh\b[^.\n]{0,20}hidden state",
        WRITTEN,
        "hidden (h is the number of query heads)",
    ),
    Retired(r"\bN_i\b|\bs_new_i\b", EVERYWHERE, "s_new (the new tokens of a sequence)"),
    Retired(r"\bC_i\b", EVERYWHERE, "cache_seqlens[i]"),
    Retired(r"\bL_i\b", EVERYWHERE, "cache_leftpad[i]"),
    Retired(r"\bP0(?:_i)?\b", EVERYWHERE, "rotary_start, rotary_starts[i]"),
    Retired(r"\bS[qk]_[bi]\b", EVERYWHERE, "s_q, s_k (seqlens_q[i], seqlens_k[i])"),
    Retired(
        r"(?<![\\\w])n\b(?![\w'\"(])(?! =)|\(n,",
        READ,
        "s_new (new tokens), num_splits (splits, and stacked states)",
    ),
    Retired(
        r"(?:\(|, )dv\)|sqrt\(dv\)|\bd \+ dv\b|\bd / dv\b",
        READ,
        "d_v in shapes and formulas (dv is the gradient of v)",
    ),
    Retired(r"\(rows,|\brows × |\bROWS query rows", READ, "s_q (query rows)"),
    Retired(
        r"\bk_cache\[r, |\brow `{0,2}r\b`{0,2}|\br = cache_batch_idx",
        WRITTEN,
        "row, a row of the cache (r is a rank)",
    ),
    Retired(
        r"\bSk\b|\bSq\b|\bSq_b\b|\bDv\b|\[B, H\b|\[B, S\b", WRITTEN, "s_k, s_q, d_v, (b, h, s_q)"
    ),
    Retired(r"\bG\b", READ, "g, the group size h / h_k"),
    Retired(
        r"(?<![\w.])seqlen_[qk]\b(?!=)(?!\s+is\b)|(?<!num_)\bheads_k\b|\bmax_pages_per_seq\b|\bbatch_k\b",
        READ,
        "s_q, s_k, h_k, max_pages, b (upstream names only in code and quotes)",
    ),
    Retired(
        r"\bH_kv\b|\bHkv\b|H_\{kv\}|\bH_k\b|\bH_\{k\}|\(b_k, max_pages\)",
        WRITTEN,
        "h_k, (b, max_pages)",
    ),
]


#: The notation page itself, and its sections that list old and upstream names on purpose.
NOTATION_PAGE = "notation/index.html"
NOTATION_TABLES_OF_OLD_NAMES = ("upstream-names", "retired-spellings")


@dataclass(frozen=True)
class Part:
    page: str  # the page's path in the site (or the figure's)
    kind: str  # PROSE, STEP, CODE, OUTPUT or FIGURE
    text: str


def is_package_source(pre) -> bool:
    """A code block that shows the package's own code: a ``source(...)`` include (titled with its
    path) or a side-by-side cell."""
    if pre.find_parent(class_="sbs-cell"):
        return True
    box = pre.find_parent(class_="highlight")
    title = box.find(class_="filename") if box else None
    return title is not None and title.get_text().startswith(("attn_ref/", "kernels/"))


def without_highlighting(markup: str) -> str:
    """The markup with the highlighter's token spans and line anchors taken out (their text
    kept) and its line numbers dropped: the same text, a tenth of the tags to parse."""
    markup = re.sub(
        r'<span class="filename">(.*?)</span>', r'<div class="filename">\1</div>', markup
    )
    markup = re.sub(r'<span class="linenos"[^>]*>[^<]*</span>', "", markup)
    markup = re.sub(r"<a [^>]*(?:id|name)=\"__codelineno[^>]*></a>", "", markup)
    return re.sub(r"</?span\b[^>]*>", "", markup)


def page_parts(page: str, markup: str) -> list[Part]:
    """The parts of one built page's content (its article; navigation and search left out)."""
    start = markup.find('<article class="md-content__inner')
    if start < 0:
        return []
    # only the article is parsed: the navigation, the same on every page, is most of the markup
    article = markup[start : markup.find("</article>", start) + 10]
    soup = BeautifulSoup(without_highlighting(article), "html.parser")
    main = soup.select_one("article.md-content__inner")
    if main is None:
        return []
    for hidden in main.select("a.headerlink, .clipboard-copy-txt, script, style, .linenos"):
        hidden.decompose()
    if page == NOTATION_PAGE:
        for heading in main.find_all("h2", id=list(NOTATION_TABLES_OF_OLD_NAMES)):
            for sibling in list(heading.find_next_siblings()):
                if sibling.name == "h2":
                    break
                sibling.decompose()
    parts = []
    for step in main.select(".sbs-step"):
        parts.append(Part(page, STEP, step.get_text(" ")))
        step.decompose()
    for pre in main.select("pre"):
        if is_package_source(pre):
            kind = SOURCE
        else:
            kind = OUTPUT if pre.find_parent(class_="jp-OutputArea") else CODE
        parts.append(Part(page, kind, pre.get_text()))
        pre.decompose()
    parts.append(Part(page, PROSE, main.get_text(" ")))
    return parts


def figure_parts(path: Path, page: str) -> list[Part]:
    """The text of an SVG figure, one part per ``<text>`` element."""
    texts = ET.parse(path).getroot().iter("{http://www.w3.org/2000/svg}text")
    return [Part(page, FIGURE, "".join(t.itertext())) for t in texts]


def site_parts(site: Path) -> list[Part]:
    """Every part of every page of the built site, and of its figures. The API reference
    (``reference/``, rendered docstrings) is left to ``tests/test_docs.py``'s docstring rule."""
    parts = []
    for path in sorted(site.rglob("*.html")):
        page = path.relative_to(site).as_posix()
        if not page.startswith("reference/"):
            parts += page_parts(page, path.read_text(encoding="utf-8"))
    for path in sorted((site / "figures").glob("*.svg")):
        parts += figure_parts(path, path.relative_to(site).as_posix())
    return parts


def quoted_messages() -> list[str]:
    """The fixed text of every message this package raises and of every upstream message the
    catalog records (placeholders cut out): quotes keep upstream's names."""
    templates = [
        e["message"]["template"]
        for e in json.loads((ROOT / "errors" / "catalog.json").read_text(encoding="utf-8"))[
            "errors"
        ]
    ]
    for path in sorted((ROOT / "errors" / "upstream").glob("*.json")):
        templates += [
            m["template"] for m in json.loads(path.read_text(encoding="utf-8"))["messages"]
        ]
    fragments = set(templates) | {
        fragment.strip()
        for template in templates
        for fragment in re.split(r"\{[^{}]*\}", template)
        if len(fragment.strip()) >= 8
    }
    return sorted(fragments, key=len, reverse=True)


def unquoted(text: str, quotes: list[str]) -> str:
    for quote in quotes:
        if quote in text:
            text = text.replace(quote, " ")
    return text


def removed_entry_pages() -> set[str]:
    """The pages of catalog entries whose raise is gone: their source excerpt is history."""
    catalog = json.loads((ROOT / "errors" / "catalog.json").read_text(encoding="utf-8"))
    return {f"errors/{e['slug']}/index.html" for e in catalog["errors"] if e["status"] == "removed"}


def findings(parts: list[Part], quotes: list[str]) -> list[str]:
    found = []
    history = removed_entry_pages()
    parts = [p for p in parts if not (p.kind == SOURCE and p.page in history)]
    compiled = [(re.compile(r.pattern), r) for r in RETIRED]
    for part in parts:
        text = unquoted(part.text, quotes)
        for line in text.splitlines():
            for pattern, retired in compiled:
                if part.kind in retired.where:
                    for match in pattern.finditer(line):
                        start = max(0, match.start() - 40)
                        found.append(
                            f"{part.page} [{part.kind}] {match.group()!r} in "
                            f"{line[start : match.end() + 40].strip()!r}: use {retired.use}"
                        )
    return found


def test_rendered_pages_use_the_notation_page_symbols(site):
    parts = site_parts(site)
    kinds = {part.kind for part in parts}
    assert kinds == {PROSE, STEP, CODE, OUTPUT, FIGURE, SOURCE}, kinds
    assert len({part.page for part in parts}) > 150
    found = findings(parts, quoted_messages())
    assert not found, f"{len(found)} retired symbols (docs/notation.md):\n" + "\n".join(found)


def test_retired_patterns_match_what_they_retire():
    """Each pattern against the spellings the site used (issue 35) and the ones that replace
    them."""
    retired = {
        READ: [
            "page_table[row][p // P]",
            "num_pages · P · h_k · d",
            "(num_pages, P, h_k, dim)",
            "for h in range(8)",
            "query head h reads",
            "( N_i  tokens)",
            "C_i, C_i + 1",
            "positions  < L_i",
            "P0 + i",
            "the number of splits  n  (the reference",
            "Stack them as  (n, ..., dim)",
            "(b_cache, s_cache, h_k, dv)",
            "1 / sqrt(dv)",
            "(rows, h_k, g, d)",
            "k_cache[r, p]",
            "ceil(Sk / n)",
            "past  Sq_b  rows",
            "the  G = h / h_k  heads",
            "(batch, max_pages_per_seq)",
            "(batch, seqlen, heads_k, head_dim)",
            "matrix of shape  (seqlen_q, seqlen_k)",
            "[B, H, Sq]",
            "sglang's  [B, S, H, D]",
            "H_kv",
        ],
        (CODE,): ["attention, h = layer.self_attn, layer.input_layernorm(x)", "for h in range(h):"],
    }
    fine = [
        "page_table[row][p // page_size]",
        "h % P == 0 and h_k % P == 0",
        "(r - t) % P",
        "for head in range(h)",
        "(b, s_new, h_k, d)",
        "cache_seqlens[i] + s_new - cache_leftpad[i]",
        "num_splits > 1",
        "dq, dk, dv of flash_attn_func",
        "(s_q, h_k, g, d)",
        "k_cache[row, p]",
        "max_seqlen_q=8",
        "seqlen_k= ( s_k )",
        "seqlen_q  is  q.shape[1]",
        "num_heads_k",
        "[b, S / P, h, d]",
        "\\n",
    ]
    for kinds, samples in retired.items():
        for sample in samples:
            assert any(
                re.search(r.pattern, sample) for r in RETIRED if set(kinds) & set(r.where)
            ), sample
    for sample in fine:
        assert not any(re.search(r.pattern, sample) for r in RETIRED), sample


def test_quoted_messages_are_exempt():
    """Upstream's names inside a quoted message are upstream's: cut out before the search."""
    quotes = quoted_messages()
    quoted = "RuntimeError: q must have shape (batch_size, seqlen_q, num_heads, head_size)"
    assert any(q in quoted for q in quotes)
    assert not findings([Part("p", PROSE, quoted)], quotes)
    assert findings([Part("p", PROSE, "q is (batch, seqlen_q, h, d)")], quotes)


def test_parts_are_read_as_the_reader_sees_them():
    markup = """<article class="md-content__inner">
      <h1>T<a class="headerlink">¶</a></h1><p>prose for h in</p>
      <div class="sbs-row"><div class="sbs-step">step text</div>
        <div class="sbs-cell"><pre>package = code</pre></div></div>
      <div class="highlight"><span class="filename">attn_ref/x.py</span><pre>included</pre></div>
      <div class="highlight"><pre>written = code</pre></div>
      <div class="clipboard-copy-txt">written = code</div>
      <div class="jp-OutputArea"><pre>printed</pre></div></article>"""
    parts = {(p.kind, " ".join(p.text.split())) for p in page_parts("x.html", markup)}
    assert parts == {
        (SOURCE, "package = code"),
        (SOURCE, "included"),
        (STEP, "step text"),
        (CODE, "written = code"),
        (OUTPUT, "printed"),
        (PROSE, "T prose for h in attn_ref/x.py"),  # a code block's title is prose
    }, parts


# ---- pages that must agree with each other, their figures and the code (issue 35) ----

DOCS = ROOT / "docs"
#: ``symbol = number`` in a figure's text or a page's prose (backticks and ``$`` allowed around it).
ASSIGNMENT = re.compile(r"(?<!% )[`$]?\b(h_k|h|g|P|U|R|S|page_size)\s*=\s*(\d+)\b")


def figure_text(name: str) -> str:
    return " ".join(p.text for p in figure_parts(DOCS / "figures" / name, name))


def test_figures_state_the_numbers_of_the_pages_that_show_them():
    """A figure drawn with ``h = 8`` beside prose that works ``h = 6`` reads as a contradiction:
    every ``symbol = number`` of a figure's text is one its page also states, where the page
    states that symbol at all."""
    checked = 0
    for page in sorted((DOCS / "concepts").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        stated: dict[str, set[str]] = {}
        prose = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", text)
        for symbol, value in ASSIGNMENT.findall(prose):
            stated.setdefault(symbol, set()).add(value)
        for name in re.findall(r"\(\.\./figures/([\w-]+\.svg)\)", text):
            for symbol, value in ASSIGNMENT.findall(figure_text(name)):
                if symbol in stated:
                    checked += 1
                    assert value in stated[symbol], (
                        f"{name} draws {symbol} = {value}, {page.name} says "
                        f"{symbol} = {sorted(stated[symbol])}"
                    )
    assert checked >= 2


def test_gqa_figure_groups_as_the_text_says():
    numbers = dict(ASSIGNMENT.findall(figure_text("gqa.svg")))
    h, h_k = int(numbers["h"]), int(numbers["h_k"])
    text = (DOCS / "concepts" / "gqa.md").read_text(encoding="utf-8")
    assert f"With `h = {h}` and `h_k = {h_k}`, so `g = {h // h_k}`" in text


#: A word written twice in a row ("query head head"), numbers and code aside.
REPEATED_WORD = re.compile(r"\b([A-Za-z]{2,})\s+\1\b", re.I)


def test_captions_and_figures_repeat_no_word():
    texts = [
        (f"figures/{path.name}", part.text)  # one text element: a label, a caption
        for path in sorted((DOCS / "figures").glob("*.svg"))
        for part in figure_parts(path, path.name)
    ]
    for page in sorted(DOCS.rglob("*.md")):
        for alt in re.findall(r"!\[([^\]]*)\]\(", page.read_text(encoding="utf-8")):
            texts.append((str(page.relative_to(ROOT)), alt))
    assert len(texts) > 20
    repeated = [(where, m.group()) for where, text in texts for m in REPEATED_WORD.finditer(text)]
    assert not repeated, repeated
    assert REPEATED_WORD.search("query head head reads") and not REPEATED_WORD.search("h = 8, 8")


def test_usp_divisibility_is_stated_as_the_code_checks_it():
    """USP's Ulysses groups split both head counts: the code checks ``h % U`` and ``h_k % U``,
    and every page that states the rule names both."""
    usp = (ROOT / "attn_ref" / "sequence_parallel" / "usp.py").read_text(encoding="utf-8")
    assert "check_usp_heads_split(q.shape[2]" in usp and "check_usp_heads_split(k.shape[2]" in usp
    rule = re.compile(r"% U\b|divisible by \$?U\$?")
    stated = 0
    for path in [
        *sorted((DOCS / "concepts").glob("*.md")),
        *sorted((ROOT / "tutorials_src").glob("*.py")),
    ]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if rule.search(line) and "U = 2" not in line:
                stated += 1
                assert "h_k" in line and re.search(r"`h %|\$h\$|\bh % U", line), (
                    f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                )
    assert stated >= 3


def test_split_kv_page_says_how_the_ring_merges():
    """The ring folds one state per step with ``merge`` (pairwise); it stacks nothing for
    ``combine_attention_states``."""
    ring = (ROOT / "attn_ref" / "sequence_parallel" / "ring.py").read_text(encoding="utf-8")
    assert "backend.merge(" in ring and "combine_attention_states" not in ring
    for page in sorted(DOCS.rglob("*.md")):
        for sentence in re.split(r"(?<=\.)\s", page.read_text(encoding="utf-8")):
            assert not re.search(r"combine_attention_states[^.]*ring attention uses", sentence), (
                page.name,
                sentence,
            )


#: A term, the page (in the Concepts order) and anchor that introduce it.
INTRODUCED = {
    "sink": ("scores.md", "#attention-sinks"),
    "split-KV": ("split-kv.md", "#split-kv-flash-decoding"),
}


def concept_pages_in_order() -> list[str]:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    return re.findall(
        r"concepts/([\w-]+\.md)", nav.split("- Concepts:", 1)[1].split("- Side by side", 1)[0]
    )


def test_concepts_link_a_term_used_before_its_page():
    """A concept page that uses a term before the page that introduces it (in the reading order)
    links there at its first use, with the term's definition."""
    order = concept_pages_in_order()
    assert order[0] == "index.md" and "scores.md" in order and "split-kv.md" in order
    checked = 0
    for term, (home, anchor) in INTRODUCED.items():
        for name in order[1 : order.index(home)]:
            text = (DOCS / "concepts" / name).read_text(encoding="utf-8")
            paragraphs = [p for p in re.split(r"\n\s*\n", text) if term.lower() in p.lower()]
            if paragraphs:
                checked += 1
                assert f"]({home}{anchor})" in paragraphs[0], (name, term, paragraphs[0][:200])
    # and the introducing page, where it uses a later page's term before that page
    text = (DOCS / "concepts" / "scores.md").read_text(encoding="utf-8")
    first = next(p for p in re.split(r"\n\s*\n", text) if "split-KV" in p)
    assert "](split-kv.md#split-kv-flash-decoding)" in first, first
    assert checked >= 1


def test_split_kv_concept_shows_the_merge_itself():
    """The merge's reference is the function that computes it, not only its checked
    wrapper."""
    text = (DOCS / "concepts" / "split-kv.md").read_text(encoding="utf-8")
    assert '{{ source("attn_ref/merge.py", "_merge_pair") }}' in text
    merge = (ROOT / "attn_ref" / "merge.py").read_text(encoding="utf-8")
    assert "torch.log(total)" in merge.split("def _merge_pair", 1)[1]
