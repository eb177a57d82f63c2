// A pasted error message leads to its catalog entry first.
//
// The site search (Material's lunr index) ranks pages by words, so a message with its numbers filled
// in ("cache_seqlens (8) + new tokens (1) ...") finds its page late or not at all. This script reads
// the catalog's message regexes from api/errors/index.json, and those of upstream's messages (sglang,
// FlashAttention, ring-flash-attention, yunchang; each row names its entry), and, as `errors.lookup`
// does, matches the query against them in full: the whole query, each of its lines, and each line
// without a "ValueError: " style prefix. The best match (removed last, then the template with the
// most literal text, then the pasted exception type) is put at the top of the search results, above
// the free-text results.
(function () {
  "use strict";

  const config = JSON.parse(document.getElementById("__config").textContent);
  const base = new URL(config.base.endsWith("/") ? config.base : config.base + "/", location.href);
  const TYPE_PREFIX = /^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception|Warning)):\s?/;
  const TYPE_ANYWHERE = /(?:[\w.]+\.)?\w+(?:Error|Exception|Warning):\s?/g;
  const CPP_CONTEXT = /\s*Exception raised from /;
  let entries = null;

  // Python's regex dialect (the catalog's) -> JavaScript's: (?s) is the "s" flag, \A and \Z anchor,
  // (?P<name>...) is (?<name>...) and the back-reference (?P=name) is \k<name>. A regex that still
  // does not compile is left out (null), the others still match.
  function jsRegex(python) {
    const body = python.replace(/^\(\?s\)/, "").replace(/\\A/g, "^").replace(/\\Z/g, "$")
      .replace(/\(\?P</g, "(?<").replace(/\(\?P=(\w+)\)/g, "\\k<$1>");
    try {
      return new RegExp(body, "s");
    } catch (error) {
      return null;
    }
  }

  function literalLength(template) {
    return template.replace(/\{[^{}]*\}/g, "").length;
  }

  function load() {
    if (entries === null) {
      entries = fetch(new URL("api/errors/index.json", base))
        .then((response) => response.json())
        .then((index) => {
          const own = index.errors.filter((e) => e.template && literalLength(e.template) > 0);
          const byId = Object.fromEntries(index.errors.map((e) => [e.id, e]));
          // An upstream wording matches as its entry (its own type: RuntimeError, AssertionError...).
          const upstream = (index.upstream || []).filter((u) => byId[u.entry])
            .map((u) => ({...byId[u.entry], type: u.type, template: u.template, regex: u.regex}));
          return [...own, ...upstream]
            .map((e) => ({...e, pattern: jsRegex(e.regex), literal: literalLength(e.template)}))
            .filter((e) => e.pattern !== null);
        })
        .catch(() => []);
    }
    return entries;
  }

  // The messages a query may hold: itself, its lines, and each without an exception-type prefix. The
  // search box is one line (a pasted traceback arrives with its line breaks removed), so the text
  // after each "SomeError: " and before PyTorch's "Exception raised from ..." context counts too.
  function candidates(query) {
    const texts = [query.trim(), ...query.split(/\r?\n/).map((line) => line.trim())].filter(Boolean);
    const tails = texts.flatMap((text) => [...text.matchAll(TYPE_ANYWHERE)]
      .map((m) => text.slice(m.index + m[0].length)));
    return [...new Set([...texts, ...tails].flatMap((text) => [text, text.replace(TYPE_PREFIX, "")])
      .map((text) => text.split(CPP_CONTEXT)[0].trim()).filter(Boolean))];
  }

  function best(all, query) {
    const typed = (query.trim().split(/\r?\n/).map((l) => l.match(TYPE_PREFIX)).filter(Boolean).pop() || [])[1];
    const found = all.filter((e) => candidates(query).some((text) => e.pattern.test(text)));
    const rank = (e) => [e.status === "removed", -e.literal, typed !== undefined && e.type !== typed];
    found.sort((a, b) => {
      const [x, y] = [rank(a), rank(b)];
      for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
      return a.id < b.id ? -1 : 1;
    });
    return found[0];
  }

  function item(entry) {
    const li = document.createElement("li");
    li.className = "md-search-result__item error-search-match";
    const a = document.createElement("a");
    a.className = "md-search-result__link";
    a.href = new URL(`errors/${entry.slug}/`, base).href;  // the entry page (errors/<id>/ redirects there)
    const article = document.createElement("article");
    article.className = "md-search-result__article md-typeset";
    const title = document.createElement("h1");
    title.textContent = entry.summary;
    const meta = document.createElement("p");
    meta.textContent = `Error catalog: ${entry.type}, ${entry.slug} (id ${entry.id}): the message matches this entry.`;
    article.append(title, meta);
    a.append(article);
    li.append(a);
    return li;
  }

  // For the docs tests: the entries this page can match (every entry with literal text in its template).
  window.attnRefErrorSearch = {load};

  const input = document.querySelector("input.md-search__input");
  const list = document.querySelector(".md-search-result__list");
  if (!input || !list) return;
  let current = null;  // the item shown for the current query, or null

  function place() {
    if (current && list.firstChild !== current) list.prepend(current);
  }

  async function update() {
    const query = input.value;
    const entry = query.trim() ? best(await load(), query) : undefined;
    if (input.value !== query) return;  // a newer query is being handled
    if (current) current.remove();
    current = entry ? item(entry) : null;
    place();
  }

  // Material re-renders the result list after each query: keep the catalog match first.
  new MutationObserver(place).observe(list, {childList: true});
  input.addEventListener("input", update);
  input.addEventListener("focus", load, {once: true});
})();
