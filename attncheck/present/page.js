// attncheck's page: the head view (P and O heatmaps of one head), its sliders and keys, opened from the grid.
// Every string from the data goes into the page as text (textContent, setAttribute): never as markup.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("attncheck-data").textContent);
  var dumps = DATA.dumps || [];
  var view = null; // {d, e, l, h}: the head shown
  var arrays = new Map(); // decoded Float32Arrays by site and field

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else if (k === "cls") node.className = attrs[k];
      else node.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { if (c) node.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return node;
  }

  function decode(text) {
    // "f:" base64 float32, or "v:" base64 varints zigzag(x·1e4) + 3 with 0, 1, 2 for nan, inf, -inf (present/page.py)
    var s = atob(text.slice(2)), u = new Uint8Array(s.length), i;
    for (i = 0; i < s.length; i++) u[i] = s.charCodeAt(i);
    if (text.charAt(0) === "f") return new Float32Array(u.buffer);
    var out = [], v = 0, mul = 1;
    for (i = 0; i < u.length; i++) {
      v += (u[i] & 127) * mul;
      if (u[i] & 128) { mul *= 128; continue; }
      if (v < 3) out.push([NaN, Infinity, -Infinity][v]);
      else { var z = v - 3; out.push((z % 2 === 0 ? z / 2 : -(z + 1) / 2) / 1e4); }
      v = 0; mul = 1;
    }
    return out;
  }

  function f32(site, field) { // the decoded values of one of a site's arrays, decoded once
    var cached = arrays.get(site);
    if (!cached) { cached = {}; arrays.set(site, cached); }
    if (!(field in cached)) cached[field] = site[field] == null ? null : decode(site[field]);
    return cached[field];
  }

  function num(x) { return typeof x === "string" ? Number(x) : x; }
  function fmt(x, digits) {
    x = num(x);
    if (x === null || x === undefined) return "—";
    if (isNaN(x)) return "nan";
    if (!isFinite(x)) return x < 0 ? "-inf" : "inf";
    return x.toFixed(digits === undefined ? 4 : digits);
  }
  function sci(x) { x = num(x); return isFinite(x) ? x.toExponential(1) : String(x); }
  function span(a) {
    if (!a.length) return "none";
    var out = [], start = a[0], prev = a[0];
    for (var i = 1; i <= a.length; i++) {
      if (i < a.length && a[i] === prev + 1) { prev = a[i]; continue; }
      out.push(start === prev ? String(start) : start + ".." + prev);
      if (i < a.length) { start = prev = a[i]; }
    }
    return out.join(", ");
  }

  // ---- sites by dump, evaluation and layer ------------------------------------------------------------
  dumps.forEach(function (d) {
    d.byKey = new Map();
    var evs = new Set(), layers = new Set();
    d.H = 0;
    d.sites.forEach(function (s) {
      d.byKey.set(s.e + ":" + s.l, s); evs.add(s.e); layers.add(s.l); d.H = Math.max(d.H, s.H);
    });
    d.evs = Array.from(evs).sort(function (a, b) { return a - b; });
    d.layers = Array.from(layers).sort(function (a, b) { return a - b; });
  });

  function token(d, run, pos) {
    var ids = d.tokens && d.tokens[run];
    if (!ids || pos >= ids.length) return "";
    var id = ids[pos];
    var text = d.vocab && d.vocab[id];
    return text !== undefined && text !== null ? JSON.stringify(text) : "tok " + id;
  }

  // ---- the head view ----------------------------------------------------------------------------------
  var panel = document.getElementById("head-view");
  if (!panel) {
    panel = el("section", {id: "head-view", hidden: ""});
    document.querySelector("main").appendChild(panel);
  }
  var controls = el("div", {cls: "controls"});
  var sliders = {};
  [["d", "dump"], ["e", "evaluation"], ["l", "layer"], ["h", "head"]].forEach(function (pair) {
    var input = el("input", {type: "range", min: "0", max: "0", step: "1", value: "0", id: "slider-" + pair[0],
                             "aria-label": pair[1]});
    var out = el("output", {"for": "slider-" + pair[0]});
    var label = el("label", {}, [pair[1] + " ", input, out]);
    input.addEventListener("input", function () { moveTo(pair[0], Number(input.value)); });
    sliders[pair[0]] = {input: input, out: out, label: label};
    controls.appendChild(label);
  });
  controls.appendChild(el("span", {cls: "note", text: "keys: ←/→ head, ↑/↓ layer, PgUp/PgDn evaluation"}));
  var body = el("div", {id: "head-body"});
  controls.hidden = DATA.kind === "inspect"; // one head: nothing to move to
  panel.appendChild(controls);
  panel.appendChild(body);

  function moveTo(which, index) {
    if (!view) return;
    var d = dumps[view.d];
    var v = {d: view.d, e: view.e, l: view.l, h: view.h};
    if (which === "d") { v = {d: index, e: dumps[index].evs[0], l: dumps[index].layers[0], h: view.h}; }
    if (which === "e") v.e = d.evs[index];
    if (which === "l") v.l = d.layers[index];
    if (which === "h") v.h = index;
    show(v);
  }

  function step(which, delta) {
    if (!view) return;
    var d = dumps[view.d];
    var list = which === "e" ? d.evs : which === "l" ? d.layers : null;
    var cur = which === "h" ? view.h : list.indexOf(view[which]);
    var max = which === "h" ? d.H - 1 : list.length - 1;
    var next = Math.min(max, Math.max(0, cur + delta));
    if (next !== cur) moveTo(which, next);
  }

  document.addEventListener("keydown", function (ev) {
    var t = ev.target && ev.target.tagName;
    if (!view || t === "INPUT" || t === "SELECT" || t === "TEXTAREA" || ev.altKey || ev.ctrlKey || ev.metaKey) return;
    var keys = {ArrowLeft: ["h", -1], ArrowRight: ["h", 1], ArrowUp: ["l", -1], ArrowDown: ["l", 1],
                PageUp: ["e", -1], PageDown: ["e", 1]};
    var k = keys[ev.key];
    if (k) { ev.preventDefault(); step(k[0], k[1]); }
  });

  function syncSliders() {
    var d = dumps[view.d];
    var vals = {d: [view.d, dumps.length - 1, d.source], e: [d.evs.indexOf(view.e), d.evs.length - 1, view.e],
                l: [d.layers.indexOf(view.l), d.layers.length - 1, view.l], h: [view.h, d.H - 1, view.h]};
    Object.keys(vals).forEach(function (k) {
      var s = sliders[k];
      s.input.max = String(Math.max(0, vals[k][1]));
      s.input.value = String(Math.max(0, vals[k][0]));
      s.out.textContent = k === "d" ? String(vals[k][0]) : String(vals[k][2]);
      s.label.hidden = vals[k][1] < 1;
    });
  }

  function markGrid() {
    document.querySelectorAll("table.grid td.sel").forEach(function (c) { c.classList.remove("sel"); });
    var sel = 'table.grid[data-d="' + view.d + '"][data-e="' + view.e + '"] tr[data-l="' + view.l + '"] td.c';
    var cell = document.querySelectorAll(sel)[view.h];
    if (cell) cell.classList.add("sel");
  }

  function show(v) {
    view = v;
    panel.hidden = false;
    syncSliders();
    markGrid();
    var d = dumps[v.d];
    var site = d.byKey.get(v.e + ":" + v.l);
    body.textContent = "";
    if (!site) {
      body.appendChild(el("p", {cls: "note", text: "layer " + v.l + " has no attention site in evaluation " + v.e +
                                                   " (filtered out, or not in this evaluation)"}));
      return;
    }
    renderHead(d, site, v.h);
  }

  function headFigure(site, h) {
    var f = site.fig[h];
    if (!f || (!f[0] && !f[1])) return "no element of this head was compared";
    return "need " + fmt(f[2], 2) + " (worst |err|/bound" + (f[3] ? ", " + f[3] : "") + "); " + f[0] +
           " elements compared, " + f[1] + " beyond their bound";
  }

  function renderHead(d, site, h) {
    var g = Math.floor(h / Math.max(1, site.H / site.H_kv));
    var title = "evaluation " + site.e + " (run " + site.run + ", n_past " + site.n_past + ", T " + site.T +
                ") · layer " + site.l + " · head " + h + " of 0.." + (site.H - 1) + " (reads KV head " + g + ")";
    body.appendChild(el("h2", {text: title}));
    var hi = site.heads.indexOf(h), ri = (site.rheads || []).indexOf(h);
    var f = site.fig[h], state = f && f[1] ? "fail" : f && f[0] ? "pass" : "unverified";
    body.appendChild(el("p", {cls: "verdict " + state, id: "head-status",
                              text: hi < 0 && ri < 0 ? "head " + h + " was not printed (llama.cpp printed heads " +
                                    span(site.heads) + ")" : headFigure(site, h)}));
    var fails = site.fails.filter(function (f) { return f[0] === h; });
    body.appendChild(el("h3", {text: site.nodes.kq_soft_max ? "P = " + site.nodes.kq_soft_max + ": queries × slots"
                                     : "P: queries × slots (flash attention prints no weights)"}));
    body.appendChild(heatP(d, site, h, hi, ri, fails));
    body.appendChild(el("h3", {text: "O = " + (site.nodes.kqv || site.nodes.flash_attn || "output") + ": queries × dims"}));
    body.appendChild(heatO(d, site, h, hi, ri, fails));
    body.appendChild(failureTable(site, h));
    body.appendChild(checkTable(d, site, h));
  }

  function gapped(printed, n, lo) {
    // printed indices in order, with {gap: [first, last]} for each run of unprinted ones in lo..n-1
    var out = [], prev = (lo || 0) - 1;
    printed.forEach(function (i, k) {
      if (i > prev + 1) out.push({gap: [prev + 1, i - 1]});
      out.push({i: i, k: k});
      prev = i;
    });
    if (prev < n - 1) out.push({gap: [prev + 1, n - 1]});
    return out;
  }

  var REASON_CLASS = ["", "causal", "empty", "window"];
  function reasonAt(site, which, t, slot) {
    // [class, words] why slot is masked for query t (null: visible, or not known), from the codes the page was given
    var codes = site[which];
    if (codes == null) return null;
    var ti = which === "mask" ? site.q.indexOf(t) : t;
    var si = (which === "mask" ? site.s : site.rslots).indexOf(slot);
    if (ti < 0 || si < 0) return null;
    var code = Number(codes.charAt(ti * (which === "mask" ? site.s.length : site.rslots.length) + si));
    return code ? [REASON_CLASS[code] || "m", (DATA.reasons || {})[code] || "masked"] : null;
  }

  function pColour(p) {
    if (!isFinite(p)) return "";
    var a = Math.max(0, Math.min(1, p));
    return "rgba(21, 94, 190, " + (0.06 + 0.94 * a).toFixed(3) + ")";
  }

  function oColour(x, scale) {
    if (!isFinite(x)) return "";
    var a = Math.min(1, Math.abs(x) / (scale || 1));
    return x >= 0 ? "rgba(198, 96, 20, " + (0.08 + 0.8 * a).toFixed(3) + ")" : "rgba(40, 110, 170, " + (0.08 + 0.8 * a).toFixed(3) + ")";
  }

  function failAt(fails, kind, t, x) {
    for (var i = 0; i < fails.length; i++) {
      var f = fails[i];
      if (f[1] === kind && f[2] === t && f[3] === x) return f;
    }
    return null;
  }

  function failText(f) {
    return "FAIL " + f[7] + ": dumped " + fmt(f[4]) + ", recomputed " + fmt(f[5], 6) + ", bound " + sci(f[6]) +
           " (" + f[8] + ", line " + f[9] + ")";
  }

  function headerRow(d, site, cols, what) {
    var tr = el("tr", {}, [el("th", {text: "query \\ " + what})]);
    cols.forEach(function (c) {
      if (c.gap) {
        tr.appendChild(el("th", {text: "…", title: what + "s " + c.gap[0] + ".." + c.gap[1] + " not printed"}));
      } else {
        var tok = what === "slot" ? token(d, site.run, (site.slot_base || 0) + c.i) : "";
        tr.appendChild(el("th", {text: String(c.i) + (tok ? " " + tok : ""), title: what + " " + c.i + (tok ? " " + tok : "")}));
      }
    });
    return el("thead", {}, [tr]);
  }

  function rowHead(d, site, t) {
    var pos = site.n_past + t, tok = token(d, site.run, pos);
    return el("th", {text: "q" + t + " · pos " + pos + (tok ? " " + tok : ""), title: "query " + t + ", position " + pos + (tok ? ", " + tok : "")});
  }

  function table(cls, head, rows, n) {
    var t = el("table", {cls: "heat " + cls + (n > 24 ? " compact" : "")}, [head, el("tbody", {}, rows)]);
    return el("div", {cls: "heatwrap"}, [t]);
  }

  function heatP(d, site, h, hi, ri, fails) {
    var ref = ri >= 0 ? f32(site, "rP") : null;
    var P = hi >= 0 ? f32(site, "P") : null;
    if (!ref && !P) return el("p", {cls: "note", text: "no weights of this head were printed"});
    var nq = site.q.length, ns = site.s.length;
    var printedAt = function (t, j) {
      var tk = site.q.indexOf(t), jk = site.s.indexOf(j);
      return P && tk >= 0 && jk >= 0 ? P[(hi * nq + tk) * ns + jk] : undefined;
    };
    var masked = function (td, mask, got) {
      td.className = "m " + mask[0];
      td.textContent = got !== undefined && got !== 0 ? fmt(got) : "·";
      td.title = "masked: " + mask[1] + (got !== undefined ? "; printed " + fmt(got) : "");
    };
    var rows = [], cols, queries;
    if (ref) { // the reference over the slots up to each query, then the printed slots past the tokens
      var total = 0, starts = [];
      for (var t0 = 0; t0 < site.T; t0++) { starts.push(total); total += site.n_past + t0 + 1; }
      var slots = site.rslots || [];
      cols = gapped(slots, site.n_kv).filter(function (c) { return !c.gap || c.gap[0] > 0; });
      queries = [];
      for (var t1 = 0; t1 < site.T; t1++) queries.push({i: t1});
      queries.forEach(function (q) {
        var t = q.i, pos = site.n_past + t, tr = el("tr", {}, [rowHead(d, site, t)]);
        cols.forEach(function (c) {
          if (c.gap) { tr.appendChild(el("td", {cls: "np m empty", text: "…", title: "slots " + c.gap[0] + ".." + c.gap[1] + ": empty cache slots, not printed"})); return; }
          var got = printedAt(t, c.i), mask = reasonAt(site, "rmask", t, c.i), f = failAt(fails, "P", t, c.i);
          var td = el("td", {});
          if (mask) masked(td, mask, got);
          else if (c.i > pos) { td.textContent = "?"; td.title = "visible, but the reference holds no weight here"; }
          else {
            var r = ref[ri * total + starts[t] + c.i];
            td.textContent = fmt(r);
            td.title = "query " + t + " · slot " + c.i + ": reference " + fmt(r, 6) + (got !== undefined ? "; printed " + fmt(got) : "; not printed");
            td.style.background = pColour(r);
            if (r > 0.55) td.style.color = "#fff";
          }
          if (got !== undefined) td.classList.add("pr");
          if (f) { td.classList.add("bad"); td.textContent = fmt(f[4]); td.title = td.title + "\n" + failText(f); }
          tr.appendChild(td);
        });
        rows.push(tr);
      });
    } else { // the printed weights, elided slots and queries as labelled gaps
      cols = gapped(site.s, site.n_kv);
      queries = gapped(site.q, site.T);
      queries.forEach(function (q) {
        if (q.gap) { rows.push(el("tr", {}, [el("th", {text: "q" + q.gap[0] + ".." + q.gap[1] + " …", title: "queries " + q.gap[0] + ".." + q.gap[1] + " not printed"})])); return; }
        var t = q.i, tr = el("tr", {}, [rowHead(d, site, t)]), g = 0;
        cols.forEach(function (c) {
          if (c.gap) {
            var n = c.gap[1] - c.gap[0] + 1, seen = site.gaps && site.gaps[q.k] ? site.gaps[q.k][g] : null;
            var text = "slots " + c.gap[0] + ".." + c.gap[1] + " not printed: " + (seen === null || seen === undefined ?
              "which are visible is not known" : seen + " of " + n + " visible (their weights unknown), " + (n - seen) + " masked");
            g += 1;
            tr.appendChild(el("td", {cls: "np", text: "…", title: text}));
            return;
          }
          var p = P[(hi * nq + q.k) * ns + c.k], mask = reasonAt(site, "mask", t, c.i), f = failAt(fails, "P", t, c.i);
          var td = el("td", {});
          if (mask) masked(td, mask, p);
          else {
            td.textContent = fmt(p);
            td.title = "query " + t + " · slot " + c.i + ": printed " + fmt(p);
            td.style.background = pColour(p);
            if (p > 0.55) td.style.color = "#fff";
          }
          td.classList.add("pr");
          if (f) { td.classList.add("bad"); td.title = td.title + "\n" + failText(f); }
          tr.appendChild(td);
        });
        rows.push(tr);
      });
    }
    var wrap = el("div", {}, [table("p", headerRow(d, site, cols, "slot"), rows, cols.length)]);
    wrap.appendChild(el("p", {cls: "note", text: ref ?
      "reference P (--model) up to each query's position; outlined: printed by llama.cpp; red: beyond its bound, showing the dumped value (hover for the recomputed one and the bound); · masked (hover for why)"
      : "printed weights; … not printed; · masked: a later token of this ubatch (causal), an empty cache slot, or outside the window (hover for which)"}));
    return wrap;
  }

  function heatO(d, site, h, hi, ri, fails) {
    var ref = ri >= 0 ? f32(site, "rO") : null;
    var O = hi >= 0 ? f32(site, "O") : null;
    if (!ref && !O) return el("p", {cls: "note", text: "no output of this head was printed"});
    var nq = site.q.length, nd = site.d.length, D = site.rD || site.D_h || 0;
    var printedAt = function (t, x) {
      var tk = site.q.indexOf(t), dk = site.d.indexOf(x);
      return O && tk >= 0 && dk >= 0 ? O[(hi * nq + tk) * nd + dk] : undefined;
    };
    var cols, queries, scale = 0, rows = [];
    if (ref) {
      cols = []; for (var x = 0; x < D; x++) cols.push({i: x});
      queries = []; for (var t1 = 0; t1 < site.T; t1++) queries.push({i: t1});
      for (var k = 0; k < site.T * D; k++) scale = Math.max(scale, Math.abs(ref[ri * site.T * D + k]) || 0);
    } else {
      cols = gapped(site.d, site.D_h || 0); queries = gapped(site.q, site.T);
      for (var m = 0; m < nq * nd; m++) scale = Math.max(scale, Math.abs(O[hi * nq * nd + m]) || 0);
    }
    queries.forEach(function (q) {
      if (q.gap) { rows.push(el("tr", {}, [el("th", {text: "q" + q.gap[0] + ".." + q.gap[1] + " …"})])); return; }
      var t = q.i, tr = el("tr", {}, [rowHead(d, site, t)]);
      cols.forEach(function (c) {
        if (c.gap) { tr.appendChild(el("td", {cls: "np", text: "…", title: "dims " + c.gap[0] + ".." + c.gap[1] + " not printed"})); return; }
        var got = printedAt(t, c.i), value = ref ? ref[(ri * site.T + t) * D + c.i] : got, f = failAt(fails, "O", t, c.i);
        var td = el("td", {text: fmt(value), title: "query " + t + " · dim " + c.i + ": " + (ref ? "reference " + fmt(value, 6) : "printed " + fmt(value)) +
                                                   (ref ? (got !== undefined ? "; printed " + fmt(got) : "; not printed") : "")});
        td.style.background = oColour(value, scale);
        if (got !== undefined) td.classList.add("pr");
        if (f) { td.classList.add("bad"); td.textContent = fmt(f[4]); td.title = td.title + "\n" + failText(f); }
        tr.appendChild(td);
      });
      rows.push(tr);
    });
    var wrap = el("div", {}, [table("o", headerRow(d, site, cols, "dim"), rows, cols.length)]);
    wrap.appendChild(el("p", {cls: "note", text: ref ? "reference O_h (--model) over every dim; outlined: printed; red: beyond its bound"
                                                      : "printed O_h rows; … dims not printed"}));
    return wrap;
  }

  function failureTable(site, h) {
    var rows = site.fails.filter(function (f) { return f[0] === h || f[0] === null; });
    if (!rows.length) return el("p", {cls: "note", text: "no failing element of this head or of the whole layer"});
    var head = el("tr", {}, ["check", "node", "line", "head", "query", "slot/dim", "dumped", "recomputed", "bound"].map(function (c) { return el("th", {text: c}); }));
    var body = rows.map(function (f) {
      return el("tr", {cls: "fail"}, [f[7], f[8], String(f[9]), f[0] === null ? "layer" : String(f[0]),
        f[2] === null ? "" : String(f[2]), f[3] === null ? "" : String(f[3]), fmt(f[4]), fmt(f[5], 6), sci(f[6])].map(function (c, i) {
        return el("td", {text: c, cls: i >= 2 ? "n" : ""});
      }));
    });
    return el("div", {}, [el("h3", {text: "failing elements (kept per check: the first 20)"}),
                          el("table", {cls: "list failures"}, [el("thead", {}, [head]), el("tbody", {}, body)])]);
  }

  function checkTable(d, site, h) {
    var head = el("tr", {}, ["check", "node", "line", "this head: compared", "failed", "worst ratio", "whole node: compared", "not compared", "why"].map(function (c) { return el("th", {text: c}); }));
    var str = function (i) { return (d.strings || [])[i] || ""; }, hi = site.heads.indexOf(h);
    var body = site.checks.map(function (c) {
      var mine = c[9] && hi >= 0 ? c[9][hi] : null;
      return el("tr", {}, [str(c[0]), str(c[1]), String(c[2]), mine ? String(mine[0]) : "—", mine ? String(mine[1]) : "—",
        mine ? fmt(mine[2], 2) : "—", String(c[3]), String(c[4]), str(c[5])].map(function (x, i) {
        return el("td", {text: x, cls: i >= 2 && i <= 7 ? "n" : ""});
      }));
    });
    return el("details", {}, [el("summary", {text: "every check of layer " + site.l + " (" + site.checks.length + ")"}),
                               el("table", {cls: "list checks"}, [el("thead", {}, [head]), el("tbody", {}, body)])]);
  }

  // ---- the grid opens heads, and tells a cell's counts on hover ------------------------------------------
  function cellAt(target) {
    // {d, e, l, h} of a grid cell (h null for a layer's whole-layer cell), or null
    var cell = target.closest && target.closest("table.grid td.c, table.grid td[data-h], table.grid td.lc");
    if (!cell) return null;
    var table = cell.closest("table.grid"), row = cell.closest("tr");
    var e = cell.hasAttribute("data-e") ? cell.getAttribute("data-e") : table.getAttribute("data-e");
    var h = cell.hasAttribute("data-h") ? Number(cell.getAttribute("data-h")) :
      cell.classList.contains("c") ? Array.prototype.indexOf.call(row.querySelectorAll("td.c"), cell) : null;
    return {cell: cell, d: Number(table.getAttribute("data-d")), e: Number(e), l: Number(row.getAttribute("data-l")), h: h};
  }

  document.addEventListener("click", function (ev) {
    var at = cellAt(ev.target);
    if (!at || at.h === null) return;
    show({d: at.d, e: at.e, l: at.l, h: at.h});
    panel.scrollIntoView({block: "start"});
  });

  document.addEventListener("mouseover", function (ev) {
    var at = cellAt(ev.target);
    if (!at || at.cell.hasAttribute("title")) return;
    var site = dumps[at.d].byKey.get(at.e + ":" + at.l);
    if (!site) return;
    var where = "eval " + at.e + " layer " + at.l;
    if (at.h === null) {
      var f = site.lfig;
      at.cell.title = where + ", checks of no single head (the sum line, cache views, whole-layer nodes): " +
        (f ? "need " + fmt(f[2], 2) + " (worst |err|/bound, " + f[3] + "); " + f[0] + " elements compared, " + f[1] + " beyond their bound" : "none");
      return;
    }
    at.cell.title = where + " head " + at.h + ": " + (site.fig[at.h] ? headFigure(site, at.h) :
      "not printed (llama.cpp printed heads " + span(site.heads) + ")" + ((site.rheads || []).indexOf(at.h) >= 0 ? "; the reference (--model) is drawn" : ""));
  });

  if (DATA.open) show(DATA.open);
  window.attncheckShow = show; // for people poking at the page from the console
  document.body.setAttribute("data-ready", "1");
})();
