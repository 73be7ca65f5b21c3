// Phones: a table wider than the column is shown stacked -- each row a card, each cell headed by
// its column's name -- so that no column (the glossary's "in the code", a run's speedup) hides
// past the screen's edge behind a sideways scroll. Narrow tables stay tables. Runs after each
// page load (material's instant navigation too), once the math is typeset (it changes widths),
// and when the window is resized.
(function () {
  var PHONE = window.matchMedia("(max-width: 45em)");

  function label(table) {
    var header = table.querySelector("thead tr") || table.querySelector("tr");
    var names = header ? Array.prototype.map.call(header.children, function (cell) {
      return cell.textContent.trim();
    }) : [];
    table.querySelectorAll("tbody tr").forEach(function (row) {
      Array.prototype.forEach.call(row.children, function (cell, i) {
        cell.setAttribute("data-label", names[i] || "");
      });
    });
  }

  function fit() {
    var article = document.querySelector("article");
    document.querySelectorAll("article table").forEach(function (table) {
      table.classList.remove("minispec-stacked");
      if (!PHONE.matches || !table.querySelector("tbody tr")) return;
      // material's tables scroll inside themselves: wider than they show, or past the column
      if (table.scrollWidth > table.clientWidth + 1 ||
          table.getBoundingClientRect().right > article.getBoundingClientRect().right + 1) {
        label(table);
        table.classList.add("minispec-stacked");
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
