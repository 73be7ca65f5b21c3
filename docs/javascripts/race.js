// A race: plain and speculative decoding of the same prompt, replayed at the speeds they were
// recorded at when the site was built (docs/hooks/widgets.py -> assets/data/race.json, made by
// minispec.tools.viz.record_race: SmolLM2-135M-Instruct, greedy, each token with the process CPU
// time at which the engine emitted it). Every element <div class="ms-race"> becomes one race.
// The speculative row advances in bursts: a round's accepted drafts and its own token come out
// together, after one target forward. Plain JS; no network.
(function () {
  "use strict";


  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // How many tokens of a run are out at time t (seconds).
  function countAt(run, t) {
    var n = 0;
    while (n < run.times.length && run.times[n] <= t) n++;
    return n;
  }

  function Race(root, data) {
    this.root = root;
    this.data = data;
    this.names = ["plain", "speculative"];
    this.end = Math.max(data.runs.plain.seconds, data.runs.speculative.seconds);
    this.frame = null;
    this.build();
    this.showAt(0);
  }

  Race.prototype.build = function () {
    var self = this, d = this.data, k = d.settings.k;
    var labels = {
      plain: "plain decoding: one target forward per token",
      speculative: "speculative, prompt lookup (k = " + k + "): up to " + (k + 1) +
        " tokens per forward",
    };
    this.root.innerHTML = "";
    this.root.classList.add("ms-widget", "ms-race");
    this.button = el("button", "md-button ms-race__btn", "\u25b6 Race");
    this.button.type = "button";
    this.button.setAttribute("data-act", "race");
    this.button.addEventListener("click", function () { self.play(); });
    this.clock = el("span", "ms-race__clock");
    var bar = el("div", "ms-race__bar");
    bar.appendChild(this.button);
    bar.appendChild(this.clock);
    this.root.appendChild(bar);
    this.rows = {};
    this.names.forEach(function (name) {
      var row = el("div", "ms-race__row ms-race__row--" + name);
      row.setAttribute("data-run", name);
      var head = el("div", "ms-race__head");
      head.appendChild(el("span", "ms-race__label", labels[name]));
      var count = el("span", "ms-race__count");
      head.appendChild(count);
      var track = el("div", "ms-race__track");
      var fill = el("div", "ms-race__fill");
      track.appendChild(fill);
      var text = el("div", "ms-race__text");
      row.appendChild(head);
      row.appendChild(track);
      row.appendChild(text);
      self.root.appendChild(row);
      self.rows[name] = { count: count, fill: fill, text: text };
    });
    var plain = d.runs.plain, spec = d.runs.speculative;
    var summary = "Recorded when this site was built: " + d.model + ", " + plain.tokens.length +
      " new tokens, greedy, one thread, " + d.clock.replace("_", " ") + " (CPU time). Plain " +
      plain.seconds.toFixed(2) + " s, speculative " + spec.seconds.toFixed(2) + " s: " +
      (plain.seconds / spec.seconds).toFixed(2) + "x, with " +
      (spec.tokens.length / spec.target_forwards).toFixed(2) + " tokens per target forward. " +
      (d.identical ? "The two texts are the same tokens; the green ones, underlined with dots, " +
        "came from accepted drafts." :
        "The texts differ!");
    this.root.appendChild(el("p", "ms-race__source", summary));
  };

  // Draw both runs as they stood t seconds after their requests were added.
  Race.prototype.showAt = function (t) {
    var self = this;
    this.root.dataset.time = t.toFixed(3);
    this.clock.textContent = t.toFixed(2) + " s";
    this.names.forEach(function (name) {
      var run = self.data.runs[name], row = self.rows[name];
      var n = countAt(run, t);
      var done = n === run.tokens.length;
      row.count.textContent = n + " / " + run.tokens.length + " tokens" +
        (done ? " \u2014 \u2714 finished at " + run.seconds.toFixed(2) + " s" : "");
      row.fill.style.width = (100 * n / run.tokens.length).toFixed(1) + "%";
      row.fill.classList.toggle("ms-race__fill--done", done);
      self.root.querySelector('[data-run="' + name + '"]').dataset.finished = String(done);
      self.drawText(row.text, run, n);
      row.text.scrollTop = row.text.scrollHeight;          // follow the newest tokens
      // text above the box: its top line fades out instead of showing half cut
      row.text.classList.toggle("ms-race__text--more", row.text.scrollTop > 0);
      self.root.querySelector('[data-run="' + name + '"]').dataset.shown = String(n);
    });
  };

  // The first n tokens; a token that came out with the next one in the same burst (within 2 ms:
  // a target forward takes far longer) was an accepted draft (a round emits its accepted drafts,
  // then the target's own token).
  Race.prototype.drawText = function (box, run, n) {
    box.innerHTML = "";
    var plainText = "";
    var flush = function () {
      if (plainText) box.appendChild(document.createTextNode(plainText));
      plainText = "";
    };
    for (var i = 0; i < n; i++) {
      if (i + 1 < run.times.length && run.times[i + 1] - run.times[i] < 0.002) {
        flush();
        box.appendChild(el("span", "ms-race__drafted", run.texts[i]));
      } else {
        plainText += run.texts[i];
      }
    }
    flush();
  };

  Race.prototype.play = function () {
    var self = this;
    if (this.frame) window.cancelAnimationFrame(this.frame);
    var start = null;
    this.root.dataset.done = "false";
    var tick = function (now) {
      if (start === null) start = now;
      var t = Math.min(self.end, (now - start) / 1000);
      self.showAt(t);
      if (t < self.end) {
        self.frame = window.requestAnimationFrame(tick);
      } else {
        self.frame = null;
        self.root.dataset.done = "true";
        self.button.textContent = "\u21bb Again";
      }
    };
    this.frame = window.requestAnimationFrame(tick);
  };

  var loading = null;

  function setup() {
    var mounts = document.querySelectorAll(".ms-race:not([data-ready])");
    if (!mounts.length) return;
    if (!loading) {
      loading = fetch(window.minispecData("assets/data/race.json")).then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      });
    }
    loading.then(function (data) {
      mounts.forEach(function (root) {
        root.minispecRace = new Race(root, data);
        root.setAttribute("data-ready", "true");
      });
    }).catch(function (err) {
      mounts.forEach(function (root) {
        root.textContent = "The recorded race could not be loaded (" + err.message + ").";
        root.setAttribute("data-ready", "error");
      });
    });
  }

  if (window.document$) document$.subscribe(setup);
  else document.addEventListener("DOMContentLoaded", setup);
})();
