// Wide tables scroll sideways inside their own box (a Markdown table scrolls itself, material's
// overflow: auto; a table a lesson prints scrolls in its output area), so rows stay rows and can be compared column by column on a phone too.
// This script only marks a box that does scroll (data-ms-scrolls, for the edge shadows of
// extra.css) and makes it reachable from the keyboard; it never touches a table's own class
// attribute: material styles exactly the tables that have none (table:not([class])), and a table
// left with class="" would lose its borders. Runs after each page load (material's instant
// navigation too), once the math is typeset (it changes widths), and when the window is resized.
(function () {
  // The box that scrolls a table: the table itself (material gives a Markdown table
  // overflow: auto), else the lesson's output area it is printed in.
  function boxOf(table) {
    if (/auto|scroll/.test(getComputedStyle(table).overflowX)) return table;
    return table.closest(".jp-OutputArea-output") || table;
  }

  function fit() {
    document.querySelectorAll("article table").forEach(function (table) {
      var box = boxOf(table);
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
