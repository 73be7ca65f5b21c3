// Shared by the site's widgets (round.js, speedup.js, race.js): where the build put its data.
// mkdocs-material writes the site root, relative to the page, into every page's #__config; the
// widgets fetch assets/data/*.json from there, so they work on any page and with no network.
window.minispecData = function (path) {
  "use strict";
  var config = document.getElementById("__config");
  var base = ".";
  if (config) {
    try { base = JSON.parse(config.textContent).base || "."; } catch (e) { /* keep "." */ }
  }
  return new URL(path, new URL(base.replace(/\/?$/, "/"), document.baseURI));
};
