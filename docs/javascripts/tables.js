// Wide tables scroll sideways inside their own box (material's .md-typeset__scrollwrap, or a
// lesson's output area), so rows stay rows and can be compared column by column on a phone too.
// This script only marks a box that does scroll (data-ms-scrolls, for the edge shadows of
// extra.css) and makes it reachable from the keyboard; it never touches a table's own class
// attribute: material styles exactly the tables that have none (table:not([class])), and a table
// left with class="" would lose its borders. Runs after each page load (material's instant
// navigation too), once the math is typeset (it changes widths), and when the window is resized.
(function () {
  var BOXES = "article .md-typeset__scrollwrap, article .jp-OutputArea-output";

  function fit() {
    document.querySelectorAll(BOXES).forEach(function (box) {
      if (!box.querySelector("table")) return;
      var scrolls = box.scrollWidth > box.clientWidth + 1;
      if (scrolls) {
        box.setAttribute("data-ms-scrolls", "true");
        box.setAttribute("tabindex", "0");
        box.setAttribute("aria-label", "table: scroll sideways to see every column");
      } else if (box.hasAttribute("data-ms-scrolls")) {
        box.removeAttribute("data-ms-scrolls");
        box.removeAttribute("tabindex");
        box.removeAttribute("aria-label");
      }
    });
  }

  function setup() {
    fit();
    new MutationObserver(fit).observe(document.body, {attributes: true,
                                                      attributeFilter: ["data-math"]});
  }

  window.addEventListener("resize", fit);
  if (typeof document$ !== "undefined") {
    document$.subscribe(setup);
  } else {
    document.addEventListener("DOMContentLoaded", setup);
  }
})();
