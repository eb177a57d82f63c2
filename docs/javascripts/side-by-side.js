// Side-by-side pages: pointing at a line of one column highlights the lines of the other column
// that use the same names (identifiers of 3+ characters that are rare there: on at most MAX_LINES
// lines), so corresponding lines are found without reading both columns from the top.
(function () {
  "use strict";

  const MAX_LINES = 4;
  const COMMON = new Set(["self", "None", "True", "False", "return", "for", "range", "def", "else", "elif",
    "not", "and", "torch", "float", "int", "tl", "call", "mask", "other", "dtype", "device", "shape"]);

  function names(line) {
    return new Set((line.textContent.match(/[A-Za-z_]\w{2,}/g) || []).filter((n) => !COMMON.has(n)));
  }

  function connect(pair) {
    const columns = [...pair.querySelectorAll(":scope > .tabbed-set > .tabbed-content > .tabbed-block")];
    if (columns.length !== 2) return;
    const lines = columns.map((column) => [...column.querySelectorAll("code > span[id]")].map((el) => ({el, names: names(el)})));
    const counts = lines.map((column) => {
      const count = new Map();
      column.forEach((line) => line.names.forEach((n) => count.set(n, (count.get(n) || 0) + 1)));
      return count;
    });
    const marked = [];
    const clear = () => marked.splice(0).forEach((el) => el.classList.remove("sbs-line-hover", "sbs-line-match"));
    lines.forEach((column, side) => {
      const other = 1 - side;
      column.forEach((line) => {
        line.el.addEventListener("mouseenter", () => {
          clear();
          const wanted = [...line.names].filter((n) => (counts[other].get(n) || 0) <= MAX_LINES);
          line.el.classList.add("sbs-line-hover");
          marked.push(line.el);
          for (const candidate of lines[other]) {
            if (wanted.some((n) => candidate.names.has(n))) {
              candidate.el.classList.add("sbs-line-match");
              marked.push(candidate.el);
            }
          }
        });
        line.el.addEventListener("mouseleave", clear);
      });
    });
  }

  document.querySelectorAll(".side-by-side").forEach(connect);
})();
