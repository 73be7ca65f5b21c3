// MathJax 3 configuration for the minispec site. MathJax itself is vendored in docs/assets/mathjax
// (see VENDORED.txt there) and loaded right after this file, so math renders with no network.
//
// Where math comes from:
//   * Markdown pages and docstrings: pymdownx.arithmatex (generic) wraps math in \( \) and \[ \]
//     inside elements of class "arithmatex";
//   * notebook markdown cells (mkdocs-jupyter): raw $...$ and $$...$$ in the page text.
// So all four delimiter pairs are accepted, and the whole page is scanned (code and pre blocks are
// skipped by MathJax; an element of class tex2jax_ignore opts out, tex2jax_process opts back in).
//
// Typesetting happens once per page inside material's document$ stream (which also fires after an
// instant-navigation page swap), not at MathJax startup.
//
// A page with no math does not load MathJax at all (docs/hooks/minispec_site.py leaves its script
// out, 1.1 MB saved); such a page is marked data-math="typeset" at once, so whatever waits for
// the math (tables.js, the browser test) goes on.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    // clipboard-copy-txt: the hidden source text behind mkdocs-jupyter's copy button, whose $...$
    // must stay as typed.
    ignoreHtmlClass: "tex2jax_ignore|clipboard-copy-txt",
    processHtmlClass: "tex2jax_process|arithmatex",
    // The context menu lazily loads accessibility components that are not vendored.
    enableMenu: false,
  },
  startup: {
    typeset: false,
    ready: function () {
      MathJax.startup.defaultReady();
      document$.subscribe(function () {
        window.minispecMathTypeset = MathJax.startup.promise
          .then(function () {
            MathJax.startup.output.clearCache();
            MathJax.typesetClear();
            MathJax.texReset();
            return MathJax.typesetPromise();
          })
          .then(function () {
            document.body.setAttribute("data-math", "typeset");
          })
          .catch(function (err) {
            document.body.setAttribute("data-math", "failed");
            console.error("MathJax typesetting failed:", err);
          });
      });
    },
  },
};

if (window.document$) {
  document$.subscribe(function () {
    // MathJax, when the page loads it, has replaced this configuration by itself (with a version)
    // by now: its script comes right after this one.
    if (!window.MathJax || !window.MathJax.version) {
      document.body.setAttribute("data-math", "typeset");
    }
  });
}
