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
