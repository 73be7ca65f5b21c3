// The speedup explorer: Leviathan et al.'s cost model with a verify cost r, on sliders.
// Every element <div class="ms-speedup"> becomes one explorer.
//
//   E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha)        tokens per round (Equation 1)
//   S(alpha, k, c, r) = E(alpha, k) / (k c + r)           speedup over plain decoding
//
// r = 1 is Theorem 3.8 as published (verifying k + 1 tokens costs one target step); r > 1 is what
// a CPU measures (lesson 05). The measured points of the Results page come from
// assets/data/speedup.json (docs/hooks/widgets.py). Plain JS and SVG; no network.
(function () {
  "use strict";

  var SVG = "http://www.w3.org/2000/svg";
  var K_MAX = 16;

  function expectedTokens(alpha, k) {
    if (alpha >= 1) return k + 1;
    return (1 - Math.pow(alpha, k + 1)) / (1 - alpha);
  }

  function speedup(alpha, k, c, r) {
    return expectedTokens(alpha, k) / (k * c + r);
  }

  // The best k the k slider can reach (1..K_MAX): the readout never names a k it cannot show.
  function bestK(alpha, c, r) {
    var best = 1;
    for (var k = 2; k <= K_MAX; k++) {
      if (speedup(alpha, k, c, r) > speedup(alpha, best, c, r)) best = k;
    }
    return best;
  }

  // The alpha at which S(alpha, k, c, r) reaches 1 (bisection), or null if even alpha = 1 fails.
  function breakEven(k, c, r) {
    if (speedup(0.999999, k, c, r) < 1) return null;
    var lo = 0, hi = 0.999999;
    for (var i = 0; i < 60; i++) {
      var mid = (lo + hi) / 2;
      if (speedup(mid, k, c, r) < 1) lo = mid; else hi = mid;
    }
    return hi;
  }

  var PRESETS = [
    { name: "paper, GPU-like", alpha: 0.8, k: 5, c: 0.05, r: 1,
      note: "Table 1's regime: a cheap draft and a free verify (r = 1)." },
    { name: "blog: 2.67x", alpha: 0.8343, k: 5, c: 0.1, r: 1,
      note: "50 ms target, 5 ms draft, five drafts, three accepted on average (lesson 05, section 6)." },
  ];  // and the measured presets of assets/data/speedup.json (docs/data/cpu.json)

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

  function svg(tag, attrs, text) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs || {}).forEach(function (key) { node.setAttribute(key, attrs[key]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }


  function Explorer(root, measured) {
    this.root = root;
    this.measured = measured && measured.points && measured.points.length ? measured : null;
    this.presets = PRESETS.concat(measured && measured.presets ? measured.presets : []);
    this.state = { alpha: 0.8, k: 4, c: 0.05, r: 1.0 };
    this.build();
    var self = this, width = root.clientWidth;
    window.addEventListener("resize", function () {
      if (root.clientWidth !== width) { width = root.clientWidth; self.draw(); }
    });
    var wanted = root.getAttribute("data-preset");
    var preset = this.presets.filter(function (p) { return p.name === wanted; })[0];
    if (preset) this.set(preset); else this.render();
  }

  Explorer.prototype.build = function () {
    var self = this;
    this.root.innerHTML = "";
    this.root.classList.add("ms-widget");
    var sliders = el("div", { cls: "ms-speedup__sliders" });
    this.inputs = {};
    this.values = {};
    [["alpha", "\u03b1, acceptance rate", 0, 0.99, 0.001],
     ["k", "k (\u03b3), drafts per round", 1, K_MAX, 1],
     ["c", "c, draft step / target step", 0, 1, 0.01],
     ["r", "r, verify of k + 1 tokens / one step (at least 1)", 1, 4, 0.01]].forEach(function (spec) {
      var id = "ms-speedup-" + spec[0] + "-" + Math.random().toString(36).slice(2, 8);
      var input = el("input", { type: "range", id: id, min: spec[2], max: spec[3], step: spec[4],
        "data-param": spec[0] });
      input.value = self.state[spec[0]];
      var value = el("output", { for: id, cls: "ms-speedup__value" });
      input.addEventListener("input", function () {
        self.state[spec[0]] = parseFloat(input.value);
        self.note.textContent = "";
        self.render();
      });
      self.inputs[spec[0]] = input;
      self.values[spec[0]] = value;
      sliders.appendChild(el("div", { cls: "ms-speedup__row" }, [
        el("label", { for: id, text: spec[1] }), input, value]));
    });
    var presets = el("div", { cls: "ms-speedup__presets" }, [el("span", { text: "Presets: " })]);
    this.presets.forEach(function (p) {
      var b = el("button", { type: "button", cls: "md-button ms-round__btn", text: p.name });
      b.addEventListener("click", function () { self.set(p); });
      presets.appendChild(b);
    });
    this.note = el("p", { cls: "ms-speedup__note" });
    this.readout = el("div", { cls: "ms-speedup__readout", "aria-live": "polite" });
    this.chart = el("div", { cls: "ms-speedup__chart" });
    this.root.appendChild(presets);
    this.root.appendChild(this.note);
    this.root.appendChild(sliders);
    this.root.appendChild(el("p", { cls: "ms-speedup__note", text: "r starts at 1. A measured r " +
      "below 1 (lesson 05 can print one) is timing noise, or a verify of k + 1 tokens that the " +
      "kernels ran more efficiently than a one-token step; the model prices either as a free " +
      "verify, r = 1." }));
    this.root.appendChild(this.readout);
    this.root.appendChild(this.chart);
  };

  Explorer.prototype.set = function (p) {
    var self = this;
    ["alpha", "k", "c", "r"].forEach(function (key) {
      self.state[key] = p[key];
      self.inputs[key].value = p[key];
    });
    this.note.textContent = p.note;
    this.render();
  };

  Explorer.prototype.render = function () {
    var s = this.state;
    var E = expectedTokens(s.alpha, s.k);
    var S = speedup(s.alpha, s.k, s.c, s.r);
    var S1 = speedup(s.alpha, s.k, s.c, 1);
    var kb = bestK(s.alpha, s.c, s.r);
    var even = breakEven(s.k, s.c, s.r);
    this.values.alpha.textContent = s.alpha.toFixed(3);
    this.values.k.textContent = String(s.k);
    this.values.c.textContent = s.c.toFixed(2);
    this.values.r.textContent = s.r.toFixed(2);
    this.root.dataset.speedup = S.toFixed(4);
    this.root.dataset.tokens = E.toFixed(4);
    this.root.dataset.bestK = String(kb);
    var cell = function (label, value, cls) {
      return el("div", { cls: "ms-speedup__cell " + (cls || "") }, [
        el("div", { cls: "ms-speedup__label", text: label }),
        el("div", { cls: "ms-speedup__big", text: value })]);
    };
    this.readout.innerHTML = "";
    this.readout.appendChild(cell("tokens per round E", E.toFixed(2)));
    this.readout.appendChild(cell("cost per round k c + r", (s.k * s.c + s.r).toFixed(2) + " steps"));
    // green for a win, red for a loss, and the word too: the colour is not the only cue
    this.readout.appendChild(cell("speedup E / (k c + r)",
      S.toFixed(2) + "x " + (S >= 1 ? "faster" : "slower"),
      S >= 1 ? "ms-speedup__cell--win" : "ms-speedup__cell--loss"));
    this.readout.appendChild(cell("Theorem 3.8 as published (r = 1)", S1.toFixed(2) + "x"));
    this.readout.appendChild(cell("best k here", kb + " (" + speedup(s.alpha, kb, s.c, s.r).toFixed(2) + "x)"));
    this.readout.appendChild(cell("break-even \u03b1 at this k", even === null ? "none" : even.toFixed(2)));
    this.draw();
  };

  Explorer.prototype.draw = function () {
    var s = this.state;
    // Drawn at the width it is shown at, so that its text stays legible on a phone.
    var W = Math.max(320, Math.min(640, this.chart.clientWidth || 640));
    var H = W < 500 ? 240 : 300, left = 62, right = 12, top = 16, bottom = 40;
    var ks = [];
    for (var k = 1; k <= K_MAX; k++) ks.push(k);
    var curve = ks.map(function (k) { return speedup(s.alpha, k, s.c, s.r); });
    var ideal = ks.map(function (k) { return speedup(s.alpha, k, s.c, 1); });
    var pts = this.measured ? this.measured.points : [];
    var ymax = Math.max.apply(null, curve.concat(ideal, [1.2], pts.map(function (p) { return p.measured; })));
    ymax = Math.ceil(ymax * 1.1 * 4) / 4;
    var x = function (k) { return left + (W - left - right) * (k - 1) / (K_MAX - 1); };
    var y = function (v) { return top + (H - top - bottom) * (1 - v / ymax); };
    var root = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", class: "ms-speedup__svg",
      "aria-label": "predicted speedup against k" });
    var step = ymax > 4 ? 1 : 0.5;
    for (var v = 0; v <= ymax + 1e-9; v += step) {
      root.appendChild(svg("line", { x1: left, x2: W - right, y1: y(v), y2: y(v), class: "ms-svg-grid" }));
      root.appendChild(svg("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end", class: "ms-svg-axis" }, v.toFixed(1)));
    }
    root.appendChild(svg("line", { x1: left, x2: W - right, y1: y(1), y2: y(1), stroke: "#444", "stroke-width": 1.2 }));
    ks.forEach(function (k) {
      if (k === 1 || k % (W < 500 ? 5 : 3) === 1 || k === K_MAX) {
        root.appendChild(svg("text", { x: x(k), y: H - bottom + 16, "text-anchor": "middle", class: "ms-svg-axis" }, String(k)));
      }
    });
    root.appendChild(svg("text", { x: (left + W - right) / 2, y: H - 6, "text-anchor": "middle", class: "ms-svg-axis" }, "k, drafts per round"));
    var mid = (top + H - bottom) / 2;     // the y axis' name, turned to run along it
    root.appendChild(svg("text", { x: 14, y: mid, "text-anchor": "middle", class: "ms-svg-axis",
      transform: "rotate(-90 14 " + mid + ")" }, "speedup over plain"));
    var path = function (values, attrs) {
      var d = values.map(function (v, i) { return (i ? "L" : "M") + x(ks[i]).toFixed(1) + " " + y(v).toFixed(1); }).join(" ");
      root.appendChild(svg("path", Object.assign({ d: d, fill: "none" }, attrs)));
    };
    path(ideal, { stroke: "#7b7b7b", "stroke-width": 2, "stroke-dasharray": "6 4" });
    path(curve, { stroke: "#3f51b5", "stroke-width": 2.6 });
    root.appendChild(svg("circle", { cx: x(s.k), cy: y(speedup(s.alpha, s.k, s.c, s.r)), r: 6, fill: "#3f51b5" }));
    var self = this;
    pts.forEach(function (p) {
      if (p.k > K_MAX) return;
      root.appendChild(svg("rect", { x: x(p.k) - 5, y: y(p.measured) - 5, width: 10, height: 10,
        fill: "#ff9800", stroke: "#6d4100", class: "ms-speedup__measured" }));
      if (self.measured.alpha === self.measured.alpha && p.r) {
        var pred = speedup(self.measured.alpha, p.k, self.measured.c, p.r);
        root.appendChild(svg("path", { d: "M" + (x(p.k) - 6) + " " + y(pred) + " h12", stroke: "#6d4100", "stroke-width": 2 }));
      }
    });
    this.chart.innerHTML = "";
    this.chart.appendChild(root);
    var key = el("p", { cls: "ms-round__legend" }, [
      el("span", { cls: "ms-key ms-key--line", text: "E / (k c + r), the sliders' r" }),
      el("span", { cls: "ms-key ms-key--dash", text: "Theorem 3.8, r = 1" }),
    ]);
    if (this.measured) {
      key.appendChild(el("span", { cls: "ms-key ms-key--measured", text:
        "measured, " + this.measured.label + " (\u03b1 = " + this.measured.alpha + ", c = " +
        this.measured.c + "); tick: its prediction with that run's r(k)" }));
    }
    this.chart.appendChild(key);
  };

  var data = null;

  function setup() {
    var mounts = document.querySelectorAll(".ms-speedup:not([data-ready])");
    if (!mounts.length) return;
    if (!data) {
      data = fetch(window.minispecData("assets/data/speedup.json"))
        .then(function (r) { return r.ok ? r.json() : null; })
        .catch(function () { return null; });
    }
    data.then(function (measured) {
      mounts.forEach(function (root) {
        root.minispecExplorer = new Explorer(root, measured);
        root.setAttribute("data-ready", "true");
      });
    });
  }

  // For the lessons' own checks and for curious readers: the same formulas.
  window.minispecSpeedup = { expectedTokens: expectedTokens, speedup: speedup, bestK: bestK };

  if (window.document$) document$.subscribe(setup);
  else document.addEventListener("DOMContentLoaded", setup);
})();
