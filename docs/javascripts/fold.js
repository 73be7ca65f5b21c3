// Folded code: a lesson's code cell tagged "hide-input" (Jupyter Book's tag) keeps its output in
// view and folds its code under a "Show the code" toggle. Such cells are helpers a reader may
// skip (a drawing function, a timing loop, the paragraph a run writes about itself); every cell
// that states a claim and asserts it stays open. Without JavaScript the code simply shows.
(function () {
  function fold() {
    document.querySelectorAll(".jp-Cell.celltag_hide-input").forEach(function (cell) {
      var input = cell.querySelector(".jp-Cell-inputWrapper");
      if (!input || input.parentNode.tagName === "DETAILS") return;
      var code = input.querySelector("pre");
      var lines = code ? code.textContent.replace(/\n$/, "").split("\n").length : 0;
      var details = document.createElement("details");
      details.className = "ms-fold";
      var summary = document.createElement("summary");
      summary.textContent = "Show the code" + (lines ? " (" + lines + " lines)" : "");
      details.appendChild(summary);
      input.parentNode.insertBefore(details, input);
      details.appendChild(input);
    });
  }
  if (window.document$) {
    window.document$.subscribe(fold);
  } else {
    document.addEventListener("DOMContentLoaded", fold);
  }
})();
