// A speculative round you can step through: real rounds of the shipped pair, recorded when the
// site was built (docs/hooks/widgets.py -> assets/data/rounds.json, made by
// minispec.tools.viz.record_rounds). Every element <div class="ms-round"> becomes one widget;
// <div class="ms-round" data-source="smollm2"> shows assets/data/rounds-smollm2.json instead
// (SmolLM2-135M-Instruct drafted by prompt lookup: a one-hot q, and rounds with no draft at all
// when the text has nothing to copy).
//
// Each round is shown in steps: the draft proposes k tokens (with q), the target scores them in
// one forward (p), each draft is tested in turn (u < p/q), and the round ends with a correction
// from the residual or a bonus token. Colours as Figure 1 of Leviathan et al.: accepted green,
// rejected red, correction blue, bonus purple (each with a cue besides colour, extra.css).
// Plain JS and SVG; no network.
(function () {
  "use strict";

  // The palette of docs/stylesheets/extra.css and minispec.tools.viz (WCAG AA on white).
  var COLORS = {
    accepted: "#1b7a1b", rejected: "#c62828", correction: "#1565c0", bonus: "#6a3d9a",
    untested: "#616161", excess: "#c62828", residual: "#1565c0",
  };
  var SVG = "http://www.w3.org/2000/svg";


  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (key) {
      if (key === "text") node.textContent = attrs[key];
      else if (key === "cls") node.className = attrs[key];
      else node.setAttribute(key, attrs[key]);
    });
    (children || []).forEach(function (child) { if (child) node.appendChild(child); });
    return node;
  }

  function svg(tag, attrs) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs || {}).forEach(function (key) { node.setAttribute(key, attrs[key]); });
    return node;
  }

  // A token as a label: visible spaces and newlines.
  function show(text) {
    return text.replace(/\n/g, "\u23ce").replace(/ /g, "\u2423") || "\u2205";
  }

  function fmt(x, digits) { return x.toFixed(digits === undefined ? 3 : digits); }

  // The steps of one round: draft, score, one test per tested draft, emit.
  function stepsOf(round) {
    var steps = [{ kind: "draft" }, { kind: "score" }];
    var tested = Math.min(round.num_accepted + 1, round.drafts.length);
    for (var i = 0; i < tested; i++) steps.push({ kind: "test", index: i });
    steps.push({ kind: "emit" });
    return steps;
  }

  function Widget(root, data, uid) {
    this.uid = uid;
    this.root = root;
    this.data = data;
    this.steps = [];
    var self = this;
    data.rounds.forEach(function (round, r) {
      stepsOf(round).forEach(function (step) {
        step.round = r;
        self.steps.push(step);
      });
    });
    this.at = 0;
    this.timer = null;
    this.build();
    this.render();
  }

  Widget.prototype.build = function () {
    var self = this;
    var k = this.data.settings.k;
    this.root.innerHTML = "";
    this.root.classList.add("ms-widget");
    var button = function (act, label, title) {
      var b = el("button", { type: "button", cls: "md-button ms-round__btn", "data-act": act,
        title: title, text: label });
      b.addEventListener("click", function () { self.act(act); });
      return b;
    };
    this.where = el("span", { cls: "ms-round__where", "aria-live": "polite" });
    this.playButton = button("play", "\u25b6 Play", "Step automatically");
    var bar = el("div", { cls: "ms-round__bar" }, [
      button("first", "\u00ab First", "Back to the first round"),
      button("prev", "\u25c0 Back", "Previous step"),
      button("next", "Next \u25b6", "Next step"),
      this.playButton,
      button("round", "Next round \u00bb", "Skip to the next round"),
      this.where,
    ]);
    this.say = el("p", { cls: "ms-round__say" });
    this.text = el("div", { cls: "ms-round__text", "aria-label": "text so far" });
    this.cards = el("div", { cls: "ms-round__cards" });
    this.chartBox = el("div", { cls: "ms-round__chart" });
    this.cache = el("p", { cls: "ms-round__cache" });
    var legend = el("p", { cls: "ms-round__legend" });
    [["accepted", "accepted draft"], ["rejected", "rejected draft"],
     ["correction", "correction (residual)"], ["bonus", "bonus token"]].forEach(function (pair) {
      legend.appendChild(el("span", { cls: "ms-tok ms-tok--" + pair[0], text: pair[1] }));
    });
    var settings = this.data.settings;
    var source = el("p", { cls: "ms-round__source", text:
      this.data.models.target + " checks up to " + k + " drafts of " + this.data.models.draft +
      " per round; temperature " + settings.temperature + ", seed " + settings.seed +
      "; recorded when this site was built." });
    this.root.appendChild(bar);
    this.root.appendChild(this.say);
    this.root.appendChild(this.text);
    this.root.appendChild(legend);
    this.root.appendChild(this.cards);
    this.root.appendChild(this.chartBox);
    this.root.appendChild(this.cache);
    this.root.appendChild(source);
    this.root.tabIndex = 0;
    var width = this.root.clientWidth;
    window.addEventListener("resize", function () {
      if (self.root.clientWidth !== width) { width = self.root.clientWidth; self.render(); }
    });
    this.root.addEventListener("keydown", function (e) {
      if (e.key === "ArrowRight") { self.act("next"); e.preventDefault(); }
      if (e.key === "ArrowLeft") { self.act("prev"); e.preventDefault(); }
    });
  };

  Widget.prototype.act = function (act) {
    if (act !== "play") this.stop();
    if (act === "first") this.at = 0;
    else if (act === "prev") this.at = Math.max(0, this.at - 1);
    else if (act === "next") this.at = Math.min(this.steps.length - 1, this.at + 1);
    else if (act === "round") {
      var r = this.steps[this.at].round;
      while (this.at < this.steps.length - 1 && this.steps[this.at].round === r) this.at++;
    } else if (act === "play") {
      if (this.timer) { this.stop(); return; }
      if (this.at === this.steps.length - 1) this.at = 0;
      var self = this;
      this.playButton.textContent = "\u23f8 Pause";
      this.timer = window.setInterval(function () {
        if (self.at >= self.steps.length - 1) { self.stop(); return; }
        self.at++;
        self.render();
      }, 1100);
    }
    this.render();
  };

  Widget.prototype.stop = function () {
    if (this.timer) window.clearInterval(this.timer);
    this.timer = null;
    this.playButton.textContent = "\u25b6 Play";
  };

  // The text so far: the prompt, earlier rounds in Figure-1 colours, this round as far as shown.
  Widget.prototype.renderText = function (step) {
    var self = this;
    this.text.innerHTML = "";
    this.text.appendChild(el("span", { cls: "ms-tok ms-tok--prompt", text: this.data.prompt }));
    this.data.rounds.forEach(function (round, r) {
      if (r > step.round) return;
      var current = r === step.round;
      var last = current && step.kind !== "emit";
      round.drafts.forEach(function (d, i) {
        var state = d.verdict;
        if (current) {
          if (step.kind === "draft" || step.kind === "score") state = "pending";
          else if (step.kind === "test" && i > step.index) state = "pending";
        }
        if (state === "untested" && !current) return;
        if (state === "untested") state = "discarded";
        var span = el("span", { cls: "ms-tok ms-tok--" + state, text: d.text });
        if (current && step.kind === "test" && i === step.index) span.classList.add("ms-tok--now");
        self.text.appendChild(span);
      });
      if (!last) {
        self.text.appendChild(el("span", { cls: "ms-tok ms-tok--" + round.final.kind,
          text: round.final.text }));
        self.text.appendChild(el("span", { cls: "ms-round__sep", text: "|" }));
      }
    });
    this.text.scrollTop = this.text.scrollHeight;        // the newest tokens in view
    // text above the box: its top line fades out instead of showing half cut
    this.text.classList.toggle("ms-round__text--more", this.text.scrollTop > 0);
  };

  Widget.prototype.renderCards = function (step, round) {
    this.cards.innerHTML = "";
    var scored = step.kind !== "draft";
    round.drafts.forEach(function (d, i) {
      var state = "pending";
      if (step.kind === "emit") state = d.verdict;
      else if (step.kind === "test" && i < step.index) state = d.verdict;
      else if (step.kind === "test" && i === step.index) state = d.verdict + " ms-card--now";
      var ratio = d.p / d.q;
      var rows = [
        el("div", { cls: "ms-card__tok", text: show(d.text) }),
        el("div", { text: "q(x) = " + fmt(d.q) }),
        el("div", { text: "p(x) = " + (scored ? fmt(d.p) : "?") }),
        el("div", { text: "min(1, p/q) = " + (scored ? fmt(Math.min(1, ratio)) : "?") }),
      ];
      var tested = (step.kind === "test" && i <= step.index) ||
        (step.kind === "emit" && d.verdict !== "untested");
      rows.push(el("div", { text: "u = " + (tested ? fmt(d.u) : "?") }));
      var verdict = { accepted: "\u2714 kept", rejected: "\u2718 rejected",
        untested: "not tested" }[d.verdict];
      rows.push(el("div", { cls: "ms-card__verdict", text: state === "pending" ? "draft " + (i + 1) : verdict }));
      this.cards.appendChild(el("div", { cls: "ms-card ms-card--" + state, "data-token": d.text }, rows));
    }, this);
    var f = round.final;
    var finalState = step.kind === "emit" ? f.kind : "pending";
    this.cards.appendChild(el("div", { cls: "ms-card ms-card--" + finalState + " ms-card--final" }, [
      el("div", { cls: "ms-card__tok", text: step.kind === "emit" ? show(f.text) : "?" }),
      el("div", { text: step.kind === "emit" ? (f.kind === "bonus" ? "bonus, from p" : "correction, from the residual") : "correction or bonus" }),
      el("div", { text: step.kind === "emit" ? "drawn with probability " + fmt(f.prob) : "" }),
    ]));
  };

  // The min(p, q) picture of one position, as in lesson 02 (minispec.tools.viz.plot_overlap):
  // green min(p, q) is kept, red max(0, q - p) is thrown away, hatched blue max(0, p - q) is
  // what the residual adds back; the black outline is p.
  Widget.prototype.renderChart = function (bars, highlight, title) {
    this.chartBox.innerHTML = "";
    if (!bars || !bars.length) return;
    // Drawn at the width it is shown at, so that its text stays legible on a phone.
    var W = Math.max(320, Math.min(640, this.chartBox.clientWidth || 640));
    var H = 230, left = 46, right = 8, top = 26, bottom = 46;
    var maxLabel = W < 500 ? 5 : 9;
    var hasQ = bars[0].q !== undefined;
    var ymax = 0;
    bars.forEach(function (b) { ymax = Math.max(ymax, b.p, hasQ ? b.q : 0); });
    ymax = ymax * 1.1 || 1;
    var plotW = W - left - right, plotH = H - top - bottom;
    var y = function (v) { return top + plotH * (1 - v / ymax); };
    var root = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", class: "ms-round__svg",
      "aria-label": title });
    var defs = svg("defs");
    var pattern = svg("pattern", { id: "ms-hatch-" + this.uid, width: 6, height: 6,
      patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" });
    pattern.appendChild(svg("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: COLORS.residual, "stroke-width": 2 }));
    defs.appendChild(pattern);
    root.appendChild(defs);
    var t = svg("text", { x: left, y: 16, class: "ms-svg-title" });
    t.textContent = title;
    root.appendChild(t);
    [0, 0.5, 1].forEach(function (f) {
      var v = ymax / 1.1 * f;
      var gy = y(v);
      root.appendChild(svg("line", { x1: left, x2: W - right, y1: gy, y2: gy, class: "ms-svg-grid" }));
      var label = svg("text", { x: left - 6, y: gy + 4, class: "ms-svg-axis", "text-anchor": "end" });
      label.textContent = v.toFixed(2);
      root.appendChild(label);
    });
    var slot = plotW / bars.length, bw = slot * 0.62;
    var self = this;
    bars.forEach(function (b, i) {
      var x = left + slot * i + (slot - bw) / 2;
      var rect = function (lo, hi, attrs) {
        if (hi - lo <= 0) return;
        var r = svg("rect", Object.assign({ x: x, width: bw, y: y(hi), height: y(lo) - y(hi) }, attrs));
        root.appendChild(r);
      };
      if (hasQ) {
        rect(0, b.min, { fill: COLORS.accepted });
        rect(b.min, b.q, { fill: COLORS.excess });
        rect(b.min, b.p, { fill: "url(#ms-hatch-" + self.uid + ")" });
      } else {
        rect(0, b.p, { fill: COLORS.bonus, "fill-opacity": 0.55 });
      }
      root.appendChild(svg("rect", { x: x - slot * 0.06, width: bw + slot * 0.12, y: y(b.p),
        height: y(0) - y(b.p), fill: "none", stroke: "#222", "stroke-width": 1.3 }));
      var label = svg("text", { x: x + bw / 2, y: H - bottom + 16, "text-anchor": "middle",
        class: "ms-svg-tick" + (b.token === highlight ? " ms-svg-tick--now" : "") });
      var name = show(b.text);
      label.textContent = name.length > maxLabel ? name.slice(0, maxLabel - 1) + "\u2026" : name;
      root.appendChild(label);
      if (b.token === highlight) {
        var mark = svg("text", { x: x + bw / 2, y: H - bottom + 34, "text-anchor": "middle",
          class: "ms-svg-tick ms-svg-tick--now" });
        mark.textContent = "\u25b2";
        root.appendChild(mark);
      }
    });
    root.appendChild(svg("line", { x1: left, x2: W - right, y1: y(0), y2: y(0), stroke: "#444" }));
    this.chartBox.appendChild(root);
    var key = el("p", { cls: "ms-round__legend" });
    var items = hasQ
      ? [["accepted", "kept: min(p, q)"], ["rejected", "thrown away: max(0, q \u2212 p)"],
         ["correction", "residual refill: max(0, p \u2212 q)"], ["outline", "target p (outline)"]]
      : [["bonus", "target p at position k + 1"]];
    items.forEach(function (pair) {
      key.appendChild(el("span", { cls: "ms-key ms-key--" + pair[0], text: pair[1] }));
    });
    this.chartBox.appendChild(key);
  };

  Widget.prototype.render = function () {
    var step = this.steps[this.at];
    var round = this.data.rounds[step.round];
    var k = round.drafts.length;
    var n = round.context_before, a = round.num_accepted;
    var inRound = this.steps.filter(function (s) { return s.round === step.round; });
    var index = inRound.indexOf(step);
    this.root.dataset.round = String(step.round + 1);
    this.root.dataset.step = step.kind;
    this.root.dataset.index = step.index === undefined ? "" : String(step.index);
    this.root.dataset.at = String(this.at);
    // the running count: tokens out and target forwards spent, up to this step
    var tokens = 0;
    this.data.rounds.slice(0, step.round).forEach(function (r) { tokens += r.emitted.length; });
    if (step.kind === "emit") tokens += round.emitted.length;
    var forwards = step.round + (step.kind === "draft" ? 0 : 1);
    this.root.dataset.tokens = String(tokens);
    this.root.dataset.forwards = String(forwards);
    this.where.textContent = "round " + (step.round + 1) + " of " + this.data.rounds.length +
      ", step " + (index + 1) + " of " + inRound.length + " \u00b7 so far " + tokens +
      (tokens === 1 ? " token" : " tokens") + " for " + forwards + " target forward" +
      (forwards === 1 ? "" : "s");
    this.renderText(step);
    this.renderCards(step, round);
    var say = "", bars = null, highlight = null, title = "";
    var copies = this.data.settings.drafter === "context";
    if (step.kind === "draft" && copies) {
      say = k ? "Prompt lookup finds the newest tokens earlier in the text and proposes the " + k +
        " tokens that followed them there. It copies, so its q is one-hot: q(x) = 1, and a copied " +
        "token is kept with probability p(x)." : "Prompt lookup finds no earlier occurrence of the " +
        "newest tokens: nothing to copy, so this round is a plain decoding step.";
    } else if (step.kind === "draft") {
      say = "The draft model proposes " + k + " tokens, one after another, each sampled from its " +
        "own distribution q. It costs " + k + " cheap forwards.";
    } else if (step.kind === "score" && k === 0) {
      say = "One forward of the target over the context gives p after it, as in plain decoding.";
    } else if (step.kind === "score") {
      say = "One forward of the target over the context and all " + k + " drafts gives p at " +
        (k + 1) + " positions: p(x) for every draft, and the distribution after the last one.";
    } else if (step.kind === "test") {
      var d = round.drafts[step.index];
      var ratio = Math.min(1, d.p / d.q);
      var keep = d.verdict === "accepted";
      say = "Draft " + (step.index + 1) + " \u201c" + show(d.text) + "\u201d: keep it if u < p(x)/q(x). " +
        "u = " + fmt(d.u) + (keep ? " < " : " \u2265 ") + "min(1, p/q) = " + fmt(ratio) +
        (keep ? ": kept." : ": rejected, and the drafts after it are discarded untested.") +
        " At this position \u03b2 = \u03a3 min(p, q) = " + fmt(d.beta) + ".";
      bars = d.bars; highlight = d.token;
      title = "draft " + (step.index + 1) + ": min(p, q) kept, q \u2212 p thrown away";
    } else {
      var f = round.final;
      if (f.kind === "bonus" && k === 0) {
        say = "With no draft, the target's one forward gives p after the context, and the token " +
          "\u201c" + show(f.text) + "\u201d is sampled from it (p = " + fmt(f.prob) + "): one token " +
          "for one forward, as in plain decoding.";
        bars = f.bars; highlight = f.token;
        title = "the target's p after the context";
      } else if (f.kind === "bonus") {
        say = "All " + k + " drafts were kept, so the target's distribution after the last one is " +
          "already computed: the bonus token \u201c" + show(f.text) + "\u201d is sampled from it (p = " +
          fmt(f.prob) + "). This round emitted " + (k + 1) + " tokens for one target forward.";
        bars = f.bars; highlight = f.token;
        title = "position " + (k + 1) + ": the target's p, for the bonus";
      } else {
        var rejected = round.drafts[a];
        var top = f.residual.map(function (r) { return "\u201c" + show(r.text) + "\u201d " + fmt(r.prob, 2); });
        say = "Draft " + (a + 1) + " was rejected, so its replacement is drawn from the residual " +
          "norm(max(0, p \u2212 q)), the part of p the draft under-proposed: \u201c" + show(f.text) +
          "\u201d (probability " + fmt(f.prob) + "). Most likely residual tokens: " + top.join(", ") +
          ". This round emitted " + (a + 1) + (a === 0 ? " token" : " tokens") + " for one target forward.";
        bars = rejected.bars; highlight = f.token;
        title = "draft " + (a + 1) + " rejected: the residual max(0, p \u2212 q)";
      }
    }
    this.say.textContent = say;
    this.renderChart(bars, highlight, title);
    this.cache.textContent = "Context: " + n + " tokens. Target KV cache: " + (n - 1) +
      " positions before the round; the verify forward writes the last token and the " + k +
      " drafts (" + (n + k) + " positions)" + (step.kind === "emit"
        ? "; rolled back to the " + (n + a) + " positions it accepted, and the context grows to " +
          round.context_after + " tokens."
        : ".");
    this.root.querySelector('[data-act="prev"]').disabled = this.at === 0;
    this.root.querySelector('[data-act="first"]').disabled = this.at === 0;
    this.root.querySelector('[data-act="next"]').disabled = this.at === this.steps.length - 1;
  };

  var loaded = {};
  var counter = 0;

  // The rounds of one recording: rounds.json, or rounds-<source>.json.
  function load(source) {
    var file = "assets/data/rounds" + (source ? "-" + source : "") + ".json";
    if (!loaded[file]) {
      loaded[file] = fetch(window.minispecData(file)).then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      });
    }
    return loaded[file];
  }

  function setup() {
    document.querySelectorAll(".ms-round:not([data-ready])").forEach(function (root) {
      root.setAttribute("data-ready", "loading");
      load(root.dataset.source).then(function (data) {
        root.minispecWidget = new Widget(root, data, ++counter);
        root.setAttribute("data-ready", "true");
      }).catch(function (err) {
        root.textContent = "The recorded rounds could not be loaded (" + err.message + ").";
        root.setAttribute("data-ready", "error");
      });
    });
  }

  if (window.document$) document$.subscribe(setup);
  else document.addEventListener("DOMContentLoaded", setup);
})();
