// The search index (search/search_index.json, 1.2 MB) is fetched when a reader first uses the
// search box -- a click or tap on it, focus, or the keys material binds to search (/, s, f) --
// not by every page as it opens. Material's bundle asks for the index as soon as it starts, with
// an XMLHttpRequest; this script, loaded just before the bundle (docs/hooks/minispec_site.py),
// holds that one request back and sends it on the first use. Search then works as before: the
// results come once the index is in, a moment later on the first query.
(function () {
  "use strict";
  var INDEX = /\/search\/search_index\.json(?:[?#]|$)/;
  var held = [];
  var wanted = false;
  var open = XMLHttpRequest.prototype.open;
  var send = XMLHttpRequest.prototype.send;

  XMLHttpRequest.prototype.open = function (method, url) {
    this.minispecIndex = INDEX.test(String(url));
    return open.apply(this, arguments);
  };
  XMLHttpRequest.prototype.send = function () {
    if (this.minispecIndex && !wanted) {
      held.push([this, arguments]);
      return undefined;
    }
    return send.apply(this, arguments);
  };

  function want() {
    if (wanted) return;
    wanted = true;
    held.splice(0).forEach(function (call) { send.apply(call[0], call[1]); });
  }
  window.minispecSearchIndex = { load: want, loaded: function () { return wanted; } };

  document.addEventListener("focusin", function (e) {
    if (e.target && e.target.matches && e.target.matches("input[data-md-component=search-query]")) {
      want();
    }
  });
  document.addEventListener("click", function (e) {
    if (e.target && e.target.closest && e.target.closest("label[for=__search], .md-search")) want();
  });
  document.addEventListener("keydown", function (e) {
    var tag = (e.target && e.target.tagName) || "";
    if (/^(INPUT|TEXTAREA|SELECT)$/.test(tag) || e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.key === "/" || e.key === "s" || e.key === "f" || e.key === "S" || e.key === "F") want();
  });
})();
