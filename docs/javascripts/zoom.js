// Click-to-zoom for figures: every plot in a lesson (and every image in a page's article) that is
// drawn smaller than its natural size can be clicked to see it full size; a click or Escape closes
// it. Runs after each page load, including material's instant navigation (document$).
(function () {
  function close() {
    document.querySelectorAll(".minispec-zoom").forEach(function (el) { el.remove(); });
  }
  function open(img) {
    close();
    var overlay = document.createElement("div");
    overlay.className = "minispec-zoom";
    overlay.setAttribute("role", "dialog");
    overlay.setAttribute("aria-label", img.alt || "figure");
    var big = document.createElement("img");
    big.src = img.src;
    big.alt = img.alt;
    overlay.appendChild(big);
    overlay.addEventListener("click", close);
    document.body.appendChild(overlay);
  }
  function setup() {
    var images = document.querySelectorAll(
      "article .jp-OutputArea-output img, article .jp-RenderedImage img, article p > img");
    images.forEach(function (img) {
      if (img.classList.contains("minispec-zoomable")) return;
      img.classList.add("minispec-zoomable");
      img.setAttribute("tabindex", "0");
      img.title = "Click to see the figure full size";
      img.addEventListener("click", function () { open(img); });
      img.addEventListener("keydown", function (e) {
        if (e.key === "Enter") open(img);
      });
    });
  }
  document.addEventListener("keydown", function (e) { if (e.key === "Escape") close(); });
  if (window.document$) {
    document$.subscribe(setup);
  } else {
    document.addEventListener("DOMContentLoaded", setup);
  }
})();
