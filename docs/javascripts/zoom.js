// Click-to-zoom for figures: every plot in a lesson (and every image in a page's article) that is
// drawn smaller than its natural size can be clicked (or tapped) to see it full size; a click or
// Escape closes it. While a figure is shrunk -- every lesson figure on a phone -- a line under it
// says so, since a phone shows no tooltip: "Tap the figure to see it full size". On a phone the
// full-size figure scrolls inside the overlay (extra.css). Runs after each page load, including
// material's instant navigation (document$), and keeps the hints right when the window resizes.
(function () {
  var TOUCH = window.matchMedia("(hover: none), (max-width: 45em)");

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
  // Shrunk: shown narrower than its natural width (the figure's labels are smaller than drawn).
  function shrunk(img) {
    return img.naturalWidth > 0 && img.getBoundingClientRect().width < img.naturalWidth - 1;
  }
  function hint(img) {
    var next = img.nextElementSibling;
    var have = next && next.classList.contains("minispec-zoom-hint") ? next : null;
    if (!shrunk(img)) {
      if (have) have.remove();
      return;
    }
    if (!have) {
      have = document.createElement("span");
      have.className = "minispec-zoom-hint";
      img.insertAdjacentElement("afterend", have);
    }
    have.textContent = "\u2922 " + (TOUCH.matches ? "Tap" : "Click") +
      " the figure to see it full size";
  }
  function hints() {
    document.querySelectorAll("img.minispec-zoomable").forEach(hint);
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
      if (img.complete) hint(img);
      else img.addEventListener("load", function () { hint(img); });
    });
  }
  document.addEventListener("keydown", function (e) { if (e.key === "Escape") close(); });
  window.addEventListener("resize", hints);
  if (window.document$) {
    document$.subscribe(setup);
  } else {
    document.addEventListener("DOMContentLoaded", setup);
  }
})();
