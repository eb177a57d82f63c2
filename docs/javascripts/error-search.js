// A pasted error message, or a fragment of one, leads to its catalog entry first.
//
// The site search (Material's lunr index) ranks pages by words, so a message with its numbers filled
// in ("cache_seqlens (8) + new tokens (1) ...") finds its page late or not at all. This script reads
// the catalog's message regexes from api/errors/index.json, and those of upstream's messages (sglang,
// FlashAttention, ring-flash-attention, yunchang; each row names its entry), and, as `errors.lookup`
// does, matches the query against them in full: the whole query, each of its lines, and each line
// without a "ValueError: " style prefix. The best match (removed last, then the template with the
// most literal text, then the pasted exception type) is put at the top of the search results, above
// the free-text results. Where nothing matches exactly, the same texts are tried loosely, as
// `errors.pasted.loose_forms` spells them (white space runs as one space, typographic quotes and
// backticks as ASCII quotes, every quote as ' or ", without trailing punctuation) against the regexes
// in any case and with any trailing punctuation (`errors.pasted.compiled`). A traceback that ends in a bare "AssertionError" (an `assert` without a message)
// is matched by the code line above it against upstream's bare asserts (recorded by their source),
// those of the traceback's file first, as `errors.upstream.match_code` does; Python's order: exact
// messages, exact code, loose messages, loose code.
//
// A fragment of a message (what a user remembers or copies part of: "disagree on", "must have
// contiguous last dimension", "exceeds the cache capacity (8 tokens per sequence)") matches no regex in
// full. Where no entry matches in full, each template is read with its placeholders as wildcards and
// the query must be a piece of a message it prints: starting and ending anywhere (inside a word or a
// placeholder's value), every other character literal text of the template, in order (case and runs of
// white space aside). Its score is the number of characters matched as literal text; the entries with
// the best score (several where they share the fragment) are put at the top. Only text that reads as
// part of a sentence is taken for a fragment: two words or more, one of them a word like "must", "on"
// or "got", or a digit or sign of a message ("=", "(", ","), with MIN_LITERAL characters matched as
// literal text, so that concept words ("cache_seqlens", "ring attention", "sequence parallel") keep the
// site's own ranking.
(function () {
  "use strict";

  const config = JSON.parse(document.getElementById("__config").textContent);
  const base = new URL(config.base.endsWith("/") ? config.base : config.base + "/", location.href);
  const TYPE_PREFIX = /^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception|Warning)):\s?/i;
  const TYPE_ANYWHERE = /(?:[\w.]+\.)?\w+(?:Error|Exception|Warning):\s?/gi;
  const CPP_CONTEXT = /\s*Exception raised from /;
  const BARE = "bare assert";  // an upstream row's kind: an assert without a message, by its source
  const BARE_EXCEPTION = /^\s*(?:[\w.]+\.)?AssertionError\s*$/i;
  const FILE_LINE = /^\s*File "([^"]+)", line \d+/;
  const CARETS = /^\s*[\^~]+\s*$/;
  // One line (a paste whose line breaks were lost): the last frame's file, its code, a bare AssertionError.
  const BARE_ONE_LINE = /File "([^"]+)", line \d+(?:, in \S+)?\s+((?:(?!File ").)*?)\s*(?:[\^~]+\s*)?(?:[\w.]+\.)?AssertionError\s*$/si;
  const QUOTES = {"\u2018": "'", "\u2019": "'", "`": "'", "\u00b4": "'", "\u201c": '"', "\u201d": '"'};
  const WILD = -1;  // a placeholder, in a template read as characters
  const MIN_LITERAL = 10;  // characters of a fragment that must be the template's literal text
  const MAX_FRAGMENT = 400;  // longer text is no fragment (the longest template has 399 characters)
  const MAX_SHOWN = 5;  // entries that share a fragment, listed at most
  const SENTENCE_WORDS = new Set(("a an the of on in at to for with by from per and or not no is are be was " +
    "must should can cannot only has have does do need needs got than when but as into every each all same " +
    "supports requires expected").split(" "));
  const MESSAGE_SIGNS = /[0-9=<>(),;:'"[\]]/;
  let entries = null;

  // Python's regex dialect (the catalog's) -> JavaScript's: (?s) is the "s" flag, \A and \Z anchor,
  // (?P<name>...) is (?<name>...) and the back-reference (?P=name) is \k<name>. A regex that still
  // does not compile is left out (null), the others still match.
  function jsRegex(python, flags = "s") {
    const body = python.replace(/^\(\?s\)/, "").replace(/\\A/g, "^").replace(/\\Z/g, "$")
      .replace(/\(\?P</g, "(?<").replace(/\(\?P=(\w+)\)/g, "\\k<$1>");
    try {
      return new RegExp(body, flags);
    } catch (error) {
      return null;
    }
  }

  // The spellings loose matching tries, as loose_forms does.
  function looseForms(text) {
    const stem = text.replace(/[\u2018\u2019`\u00b4\u201c\u201d]/g, (c) => QUOTES[c])
      .split(/\s+/).filter(Boolean).join(" ").replace(/[.!?;:, ]+$/, "");
    return [...new Set([stem, stem.replace(/"/g, "'"), stem.replace(/'/g, '"')])];
  }

  // A regex (Python's dialect) that ends its message with any trailing punctuation, or none, and
  // reads a backtick as any quote (looseForms writes pasted backticks as quotes), as
  // errors.pasted.compiled does.
  function looseRegex(python) {
    return python.replace(/(?:\\[.?]|[!;:,])*\\Z$/, "[.!?;:,]*\\Z").replace(/`/g, "['\"`]");
  }

  // The code lines above a bare AssertionError that ends the query (caret lines left out), and the
  // file of their frame: what a traceback shows of an assert without a message.
  function bareCode(query) {
    const lines = query.trimEnd().split(/\r?\n/);
    if (lines.length > 1 && BARE_EXCEPTION.test(lines[lines.length - 1])) {
      const code = [];
      for (const line of lines.slice(0, -1).reverse()) {
        const frame = line.match(FILE_LINE);
        if (frame) return {code: code.reverse().join("\n").trim(), path: frame[1]};
        if (!line.trim() || code.length === 10) break;
        if (!CARETS.test(line)) code.push(line.trim());
      }
      return code.length ? {code: code.reverse().join("\n").trim(), path: null} : null;
    }
    const one = query.match(BARE_ONE_LINE);
    return one && one[2].trim() ? {code: one[2].trim(), path: one[1]} : null;
  }

  function sameFile(pasted, path) {
    if (!pasted) return false;
    const file = pasted.replace(/\\/g, "/");
    return file === path || file.endsWith("/" + path);
  }

  function literalLength(template) {
    return template.replace(/\{[^{}]*\}/g, "").length;
  }

  function fold(text) {
    return text.toLowerCase().replace(/\s+/g, " ");
  }

  // The template as character codes (folded) with WILD for each placeholder.
  function characters(template) {
    return template.split(/(\{[^{}]*\})/).flatMap((part, n) => (n % 2 ? [WILD]
      : [...fold(part)].map((c) => c.codePointAt(0))));
  }

  function readsAsFragment(text) {
    const words = text.split(" ").filter(Boolean);
    return text.length <= MAX_FRAGMENT && words.length >= 2
      && (MESSAGE_SIGNS.test(text) || words.some((w) => SENTENCE_WORDS.has(w)));
  }

  // The most characters of `text` (folded) that are literal text of the template when `text` is read
  // as a piece of one of its messages, or -1 where it is no such piece. `at` maps each position j of
  // the template where a reading of the text so far stops (before character j) to its best score: at
  // the start every position (a fragment starts anywhere); a placeholder takes any number of
  // characters, none included.
  function fragmentScore(template, text) {
    let at = new Map(template.map((_, j) => [j, 0]));
    const keep = (map, j, score) => map.set(j, Math.max(score, map.has(j) ? map.get(j) : -1));
    for (const c of text) {
      for (const [j, score] of at) if (template[j] === WILD) keep(at, j + 1, score);  // an empty placeholder
      const code = c.codePointAt(0), next = new Map();
      for (const [j, score] of at) {
        if (template[j] === WILD) keep(next, j, score);
        else if (template[j] === code) keep(next, j + 1, score + 1);
      }
      if (next.size === 0) return -1;
      at = next;
    }
    return Math.max(...at.values());
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
            .map((u) => ({...byId[u.entry], type: u.type, template: u.template, regex: u.regex,
                          kind: u.kind, path: u.path}));
          return [...own, ...upstream]
            .map((e) => ({...e, pattern: jsRegex(e.regex), loose: jsRegex(looseRegex(e.regex), "si"),
                          literal: literalLength(e.template), characters: characters(e.template)}))
            .filter((e) => e.pattern !== null && e.loose !== null);
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

  function byRank(rank) {
    return (a, b) => {
      const [x, y] = [rank(a), rank(b)];
      for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
      return a.id < b.id ? -1 : 1;
    };
  }

  function best(all, query) {
    const typed = (query.trim().split(/\r?\n/).map((l) => l.match(TYPE_PREFIX)).filter(Boolean).pop() || [])[1];
    const texts = candidates(query);
    const bare = bareCode(query);
    const bareRows = all.filter((e) => e.kind === BARE);
    for (const loose of [false, true]) {
      const forms = loose ? [...new Set(texts.flatMap(looseForms))] : texts;
      const found = all.filter((e) => forms.some((text) => (loose ? e.loose : e.pattern).test(text)));
      found.sort(byRank((e) => [e.status === "removed", -e.literal, typed !== undefined && e.type !== typed]));
      if (found.length) return found[0];
      if (bare) {
        const codes = loose ? looseForms(bare.code) : [bare.code];
        const rows = bareRows.filter((e) => codes.some((code) => (loose ? e.loose : e.pattern).test(code)));
        rows.sort(byRank((e) => [!sameFile(bare.path, e.path)]));
        if (rows.length) return rows[0];
      }
    }
    return undefined;
  }

  // The entries whose messages the query is a fragment of, with the best score: one entry each.
  function fragmentOf(all, query) {
    const texts = [...new Set(candidates(query).map(fold))].filter(readsAsFragment);
    const scores = new Map();  // entry id -> its best score over its templates (its own and upstream's)
    for (const e of all) {
      for (const text of texts) {
        const score = fragmentScore(e.characters, text);
        if (score >= MIN_LITERAL && score > (scores.get(e.id) || [-1])[0]) scores.set(e.id, [score, e]);
      }
    }
    const top = Math.max(...[...scores.values()].map(([score]) => score));
    return [...scores.values()].filter(([score]) => score === top).map(([, e]) => e)
      .sort(byRank((e) => [e.status === "removed"])).slice(0, MAX_SHOWN);
  }

  // What the search lists first: the entry the query matches in full, else those it is a fragment of.
  function matches(all, query) {
    if (!query.trim()) return {entries: [], how: null};
    const whole = best(all, query);
    return whole ? {entries: [whole], how: "the message matches this entry"}
      : {entries: fragmentOf(all, query), how: "part of this entry's message matches"};
  }

  function item(entry, how) {
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
    meta.textContent = `Error catalog: ${entry.type}, ${entry.slug} (id ${entry.id}): ${how}.`;
    article.append(title, meta);
    a.append(article);
    li.append(a);
    return li;
  }

  // For the docs tests: the entries this page can match (every entry with literal text in its
  // template, then every upstream wording), and the slugs it lists first for a query.
  window.attnRefErrorSearch = {
    load,
    matches: async (query) => matches(await load(), query).entries.map((e) => e.slug),
  };

  const input = document.querySelector("input.md-search__input");
  const list = document.querySelector(".md-search-result__list");
  if (!input || !list) return;
  let shown = [];  // the items listed for the current query

  function place() {
    if (shown.some((li, n) => list.children[n] !== li)) list.prepend(...shown);
  }

  async function update() {
    const query = input.value;
    const found = matches(await load(), query);
    if (input.value !== query) return;  // a newer query is being handled
    shown.forEach((li) => li.remove());
    shown = found.entries.map((entry) => item(entry, found.how));
    place();
  }

  // Material re-renders the result list after each query: keep the catalog's matches first.
  new MutationObserver(place).observe(list, {childList: true});
  input.addEventListener("input", update);
  input.addEventListener("focus", load, {once: true});
})();
