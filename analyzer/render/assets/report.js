/* postmortem HTML report: draws the cross-rank timeline and the full inputs table from the
 * embedded data (see analyzer/render/html.py for its layout). Everything that came from a log is
 * escaped before plotly sees it (plotly renders a subset of HTML in labels and hover text) and is
 * put into the page with textContent, never innerHTML. Nothing is fetched. */
(function () {
  "use strict";

  var MAX_TEXT = 600;   // characters of a log line in a hover label
  var WRAP = 110;       // hover line width
  var PAGE = 100;       // member lanes shown at once when a fold is expanded
  var INPUT_PAGE = 250; // rows of the full inputs table per page

  function esc(value) {
    return String(value).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&#34;").replace(/'/g, "&#39;");
  }

  var PLURAL = {rank: "ranks", process: "processes", host: "hosts", file: "files"};
  function plural(unitType) { return PLURAL[unitType] || "lanes"; }

  function wrapText(value) {
    var s = String(value);
    if (s.length > MAX_TEXT) { s = s.slice(0, MAX_TEXT) + "\u2026"; }
    var out = [];
    for (var i = 0; i < s.length; i += WRAP) { out.push(esc(s.slice(i, i + WRAP))); }
    return out.join("<br>");
  }

  function utc(ms) {
    var d = new Date(Math.floor(ms));
    var frac = Math.round((ms - Math.floor(ms)) * 1000);
    var iso = d.toISOString();  // always UTC
    return iso.slice(0, 10) + " " + iso.slice(11, 23) + (frac ? String(1000 + frac).slice(1) : "") + " UTC";
  }

  function el(tag, text, cls) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) { node.textContent = text; }
    if (cls) { node.className = cls; }
    return node;
  }

  function readData() {
    var node = document.getElementById("pm-data");
    if (node.getAttribute("data-encoding") !== "gzip-base64") {
      return Promise.resolve(JSON.parse(node.textContent));
    }
    if (typeof DecompressionStream === "undefined") {
      return Promise.reject(new Error("this browser cannot decompress the embedded timeline data " +
        "(DecompressionStream: Chrome 80+, Firefox 113+, Safari 16.4+)"));
    }
    var raw = atob(node.textContent.trim());
    var bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) { bytes[i] = raw.charCodeAt(i); }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).text().then(JSON.parse);
  }

  // --- timeline ---------------------------------------------------------------------------------

  function Timeline(D) {
    this.D = D;
    this.expanded = {};  // fold lane -> first member index shown
    var m = D.markers, i;
    this.byLane = {};
    for (i = 0; i < m.lane.length; i++) { (this.byLane[m.lane[i]] = this.byLane[m.lane[i]] || []).push(i); }
    this.foldUnits = {};  // fold lane -> [unit, ...] in display order
    this.byUnit = {};     // unit -> [member row, ...]
    for (i = 0; i < D.units.lane.length; i++) {
      (this.foldUnits[D.units.lane[i]] = this.foldUnits[D.units.lane[i]] || []).push(i);
    }
    var mem = D.members;
    for (i = 0; i < mem.unit.length; i++) { (this.byUnit[mem.unit[i]] = this.byUnit[mem.unit[i]] || []).push(i); }
  }

  Timeline.prototype.memberX = function (r) {
    // Members' times are integer ms after D.t0; other axes are used as they are.
    var mem = this.D.members;
    return this.D.panels[mem.panel[r]].id === "time" ? this.D.t0 + mem.x[r] : mem.x[r];
  };

  Timeline.prototype.rows = function () {
    var D = this.D, out = [];
    for (var lane = 0; lane < D.lanes.label.length; lane++) {
      out.push({lane: lane});
      if (this.expanded[lane] !== undefined) {
        var units = this.foldUnits[lane] || [], start = this.expanded[lane];
        for (var j = start; j < Math.min(units.length, start + PAGE); j++) { out.push({lane: lane, unit: units[j]}); }
      }
    }
    return out;
  };

  Timeline.prototype.eventLines = function (e, panelId, x) {
    var D = this.D, E = D.events, lines = [];
    if (E.ts[e] !== null) {
      var src = E.src[e] === null ? "unknown source" : D.sources[E.src[e]];
      lines.push(utc(E.ts[e]) + " (clock: " + esc(src) + (D.inferred[E.src[e]] ? ", inferred" : "") + ")");
    } else if (panelId === "order") {
      lines.push("no timestamp: position " + x + " in this lane's line order");
    }
    var where = (E.rank[e] !== null ? "rank " + E.rank[e] : "") +
      (E.host[e] !== null ? (E.rank[e] !== null ? " on " : "") + "host " + esc(D.hosts[E.host[e]]) : "");
    if (where) { lines.push(where); }
    lines.push(esc(D.files[E.file[e]]) + ":" + E.line[e] + "  [" + esc(D.kinds[E.kind[e]]) + "]");
    lines.push(wrapText(D.texts[E.text[e]]));
    return lines;
  };

  Timeline.prototype.seqLabel = function (D, cls, x, lo, hi, op, group) {
    var range = (lo !== undefined && lo !== hi) ? "#" + lo + "\u2013#" + hi : "#" + x;
    return (op ? esc(op) + " " : "") + range + (group ? " (pg " + esc(group) + ")" : "");
  };

  Timeline.prototype.hover = function (i) {
    var D = this.D, m = D.markers, cls = D.classes[m.cls[i]], panel = D.panels[m.panel[i]];
    var L = D.lanes, lane = m.lane[i], lines = [];
    var op = m.op[i] === null ? "" : D.ops[m.op[i]], group = m.group[i] === null ? "" : D.groups[m.group[i]];
    var head = "<b>" + esc(cls.name) + "</b>";
    if (panel.id === "seq") { head += " " + this.seqLabel(D, cls, m.x[i], m.lo[i], m.hi[i], op, group); }
    lines.push(head + " \u00b7 " + wrapText(L.label[lane]));
    if (m.count[i] > 1) {
      var spread = panel.id === "time" ? utc(m.lo[i]) + " \u2192 " + utc(m.hi[i])
        : (panel.id === "seq" ? "#" + m.lo[i] + " \u2192 #" + m.hi[i] : "positions " + m.lo[i] + " \u2192 " + m.hi[i]);
      lines.push(m.count[i] + " of the " + L.units[lane] + " " + plural(L.unit_type[lane]) + " folded here; spread " + spread +
        (panel.id === "time" ? " (marker at the median)" : ""));
      lines.push("<i>the line below is the first one's</i>");
    }
    if (m.ev[i] === 2) { lines.push("<b>evidence for the verdict</b>"); } else if (m.ev[i] === 1) { lines.push("evidence for a finding"); }
    return lines.concat(this.eventLines(m.e[i], panel.id, m.x[i])).join("<br>");
  };

  Timeline.prototype.memberHover = function (r) {
    var D = this.D, mem = D.members, cls = D.classes[mem.cls[r]], panel = D.panels[mem.panel[r]];
    var unit = mem.unit[r], head = "<b>" + esc(cls.name) + "</b>";
    if (panel.id === "seq") {
      head += " " + this.seqLabel(D, cls, mem.x[r], undefined, undefined,
        mem.op[r] === null ? "" : D.ops[mem.op[r]], mem.group[r] === null ? "" : D.groups[mem.group[r]]);
    }
    var lines = [head + " \u00b7 " + esc(D.units.label[unit]), "folded in " + wrapText(D.lanes.label[D.units.lane[unit]])];
    if (panel.id === "time") {
      lines.push(utc(this.memberX(r)) + (mem.inf[r] ? " (clock inferred)" : ""));
    } else if (panel.id === "order") {
      lines.push("no timestamp: position " + mem.x[r] + " in this lane's line order");
    }
    lines.push(esc(D.files[mem.file[r]]) + ":" + mem.line[r] + "  [" + esc(D.kinds[mem.kind[r]]) + "]");
    lines.push(mem.text[r] !== null ? wrapText(D.texts[mem.text[r]])
      : "<i>(line text not embedded: folded ranks beyond the report's size budget; see the file)</i>");
    return lines.join("<br>");
  };

  Timeline.prototype.figure = function () {
    var D = this.D, L = D.lanes, rows = this.rows(), n = rows.length;
    var series = {};  // panel|class -> trace
    var spreads = {};  // panel -> spread trace
    function trace(p, c) {
      var key = p + "|" + c;
      if (!series[key]) {
        var cls = D.classes[c];
        series[key] = {
          type: "scatter", mode: "markers", name: esc(cls.name), legendgroup: cls.id,
          xaxis: D.panels[p].axis, yaxis: "y",
          x: [], y: [], hovertext: [], hoverinfo: "text",
          marker: {symbol: [], size: [], color: cls.color, opacity: 0.9, line: {color: [], width: []}}
        };
      }
      return series[key];
    }
    function push(t, x, y, hover, cls, inferred, ev) {
      // Each class has its own sub-row in the lane, so markers of different kinds at one time stay visible.
      t.x.push(x); t.y.push(y + (cls.dy || 0)); t.hovertext.push(hover);
      t.marker.symbol.push(inferred ? cls.symbol_open : cls.symbol);
      t.marker.size.push(cls.size + (ev ? 4 : 0));
      t.marker.line.color.push(ev === 2 ? "#b3261e" : (ev ? "#333333" : cls.color));
      t.marker.line.width.push(ev ? 2 : 1);
    }
    var m = D.markers, mem = D.members;
    for (var y = 0; y < n; y++) {
      var row = rows[y], idx, k;
      if (row.unit === undefined) {
        idx = this.byLane[row.lane] || [];
        for (k = 0; k < idx.length; k++) {
          var i = idx[k], c = D.classes[m.cls[i]];
          push(trace(m.panel[i], m.cls[i]), m.x[i], y, this.hover(i), c, m.inf[i], m.ev[i]);
          if (m.count[i] > 1 && m.lo[i] !== m.hi[i]) {
            var s = spreads[m.panel[i]] = spreads[m.panel[i]] || {
              type: "scatter", mode: "lines", name: "spread over folded lanes", legendgroup: "spread",
              showlegend: false, hoverinfo: "skip", xaxis: D.panels[m.panel[i]].axis, yaxis: "y",
              x: [], y: [], line: {color: "rgba(90,90,90,0.45)", width: 3}
            };
            s.x.push(m.lo[i], m.hi[i], null); s.y.push(y + (c.dy || 0), y + (c.dy || 0), null);
          }
        }
      } else {
        idx = this.byUnit[row.unit] || [];
        for (k = 0; k < idx.length; k++) {
          var r = idx[k];
          push(trace(mem.panel[r], mem.cls[r]), this.memberX(r), y, this.memberHover(r), D.classes[mem.cls[r]], mem.inf[r], mem.ev[r]);
        }
      }
    }
    // Larger glyphs first, so that a smaller one drawn at the same place lies on top of them.
    var keys = Object.keys(series).sort(function (a, b) {
      var pa = a.split("|").map(Number), pb = b.split("|").map(Number);
      return D.classes[pb[1]].size - D.classes[pa[1]].size || pa[1] - pb[1] || pa[0] - pb[0];
    });
    var seen = {};
    var data = keys.map(function (key) {
      var t = series[key];
      t.showlegend = !seen[t.legendgroup];
      seen[t.legendgroup] = true;
      return t;
    });
    Object.keys(spreads).sort().forEach(function (p) { data.unshift(spreads[p]); });

    // Lanes: labels, host bands, culprit highlight.
    var tickvals = [], ticktext = [], shapes = [], prevHost = null, band = 0, longest = 10;
    for (y = 0; y < n; y++) {
      var lane = rows[y].lane, member = rows[y].unit !== undefined;
      var label = member ? "\u2003" + D.units.label[rows[y].unit] : laneLabel(L, lane);
      longest = Math.max(longest, label.length);
      var text = esc(label);
      if (L.culprit[lane] && !member) { text = "<b><span style=\"color:#b3261e\">" + text + "</span></b>"; }
      tickvals.push(y); ticktext.push(text);
      var host = member ? D.units.host[rows[y].unit] : L.host[lane];
      if (host !== prevHost || host === null) { band += 1; prevHost = host; }
      if (L.culprit[lane]) {
        shapes.push({type: "rect", xref: "paper", yref: "y", x0: 0, x1: 1, y0: y - 0.5, y1: y + 0.5,
          fillcolor: "rgba(179,38,30,0.13)", line: {width: 0}, layer: "below"});
      } else if (band % 2 === 0) {
        shapes.push({type: "rect", xref: "paper", yref: "y", x0: 0, x1: 1, y0: y - 0.5, y1: y + 0.5,
          fillcolor: "rgba(120,130,150,0.08)", line: {width: 0}, layer: "below"});
      }
    }
    var layout = {
      // Taller lanes while there are few, so that the classes' sub-rows stay apart.
      height: Math.max(320, (n > 120 ? 24 : (n > 40 ? 32 : 40)) * n + 110),
      margin: {l: Math.min(460, 40 + 6.2 * longest), r: 24, t: 30, b: 60},
      showlegend: false,  // the page's legend above the plot names every glyph, with what it means
      hovermode: "closest",
      hoverlabel: {align: "left", font: {family: "monospace", size: 11}},
      yaxis: {tickvals: tickvals, ticktext: ticktext, range: [n - 0.5, -0.5], autorange: false,
        zeroline: false, showgrid: false, tickfont: {size: 11}},
      shapes: shapes,
      plot_bgcolor: "#ffffff"
    };
    var weights = {time: 0.6, order: 0.22, seq: 0.18}, total = 0, gap = 0.025;
    D.panels.forEach(function (p) { total += weights[p.id]; });
    var start = 0, span = 1 - gap * (D.panels.length - 1);
    D.panels.forEach(function (p, j) {
      var width = span * weights[p.id] / total;
      var axis = {domain: [start, Math.min(1, start + width)], anchor: "y", title: {text: esc(p.title), font: {size: 12}},
        showline: true, mirror: true, linecolor: "#b0b6bf", zeroline: false, gridcolor: "#eceef1"};
      if (p.id === "time") { axis.type = "date"; axis.hoverformat = "%Y-%m-%d %H:%M:%S.%L"; }
      else {
        axis.type = "linear"; axis.tickformat = "d";
        var ext = extent(data, p.axis);
        if (ext !== null && ext.hi - ext.lo <= 12) { axis.dtick = 1; axis.range = [ext.lo - 0.6, ext.hi + 0.6]; }
      }
      layout[p.axis === "x" ? "xaxis" : "xaxis" + p.axis.slice(1)] = axis;
      start += width + gap;
    });
    return {data: data, layout: layout};
  };

  function laneLabel(L, lane) {
    // "ranks 0,2-1023 [1022]: waiting in ALLREDUCE #35", shortened for the axis.
    var label = L.label[lane];
    if (!L.folded[lane]) { return label.length > 52 ? label.slice(0, 51) + "\u2026" : label; }
    if (label.length > 30) { label = label.slice(0, 29) + "\u2026"; }
    var state = L.state[lane] || "";
    if (state.length > 32) { state = state.slice(0, 31) + "\u2026"; }
    return label + " [" + L.units[lane] + "]" + (state ? ": " + state : "");
  }

  function extent(data, axis) {
    // The lowest and highest x drawn on one axis; null when none.
    var lo = Infinity, hi = -Infinity;
    data.forEach(function (t) {
      if (t.xaxis !== axis) { return; }
      t.x.forEach(function (v) { if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); } });
    });
    return lo === Infinity ? null : {lo: lo, hi: hi};
  }

  Timeline.prototype.draw = function (node) {
    var fig = this.figure();
    var config = {displaylogo: false, responsive: true, scrollZoom: false,
      modeBarButtonsToRemove: ["select2d", "lasso2d"], toImageButtonOptions: {filename: "postmortem-timeline"}};
    return Plotly.react(node, fig.data, fig.layout, config);
  };

  Timeline.prototype.controls = function (list, redraw) {
    var D = this.D, L = D.lanes, self = this;
    while (list.firstChild) { list.removeChild(list.firstChild); }
    for (var lane = 0; lane < L.label.length; lane++) {
      if (!L.folded[lane]) { continue; }
      (function (lane) {
        var units = self.foldUnits[lane] || [];
        var item = el("li");
        item.appendChild(el("span", L.label[lane], "mono"));
        var hosts = L.hosts[lane];
        item.appendChild(el("span", " \u2014 " + L.units[lane] + " " + plural(L.unit_type[lane]) +
          (hosts ? " on " + hosts + " host" + (hosts === 1 ? "" : "s") : "") + (L.state[lane] ? ": " + L.state[lane] : "")));
        var start = self.expanded[lane];
        if (start === undefined) {
          var open = el("button", "expand");
          open.addEventListener("click", function () { self.expanded[lane] = 0; redraw(); });
          item.appendChild(open);
        } else {
          var shown = el("span", " showing " + (start + 1) + "\u2013" + Math.min(units.length, start + PAGE) + " of " + units.length, "muted");
          item.appendChild(shown);
          if (start > 0) {
            var prev = el("button", "previous " + PAGE);
            prev.addEventListener("click", function () { self.expanded[lane] = Math.max(0, start - PAGE); redraw(); });
            item.appendChild(prev);
          }
          if (start + PAGE < units.length) {
            var next = el("button", "next " + PAGE);
            next.addEventListener("click", function () { self.expanded[lane] = start + PAGE; redraw(); });
            item.appendChild(next);
          }
          var close = el("button", "collapse");
          close.addEventListener("click", function () { delete self.expanded[lane]; redraw(); });
          item.appendChild(close);
        }
        list.appendChild(item);
      })(lane);
    }
  };

  // --- step time per rank (slow jobs) ---------------------------------------------------------------

  function stepFigure(S) {
    // One line per rank on two panels: the step's duration, and the part of it outside NCCL kernels.
    var byRank = {}, order = [], i;
    for (i = 0; i < S.rank.length; i++) {
      if (!byRank[S.rank[i]]) { byRank[S.rank[i]] = []; order.push(S.rank[i]); }
      byRank[S.rank[i]].push(i);
    }
    var data = [];
    [["step_ms", "x", "step duration"], ["outside_ms", "x2", "outside collectives"]].forEach(function (panel, p) {
      order.forEach(function (rank) {
        var rows = byRank[rank], culprit = S.culprit[rows[0]] === 1;
        var name = "rank " + rank + (culprit ? " (culprit)" : "");
        data.push({
          type: "scatter", mode: "lines+markers", name: name, legendgroup: "r" + rank, showlegend: p === 0 && (culprit || order.length <= 12),
          xaxis: panel[1], yaxis: p === 0 ? "y" : "y2",
          x: rows.map(function (r) { return S.step[r]; }), y: rows.map(function (r) { return S[panel[0]][r]; }),
          hovertext: rows.map(function (r) {
            return "<b>" + name + "</b> step " + S.step[r] + "<br>step " + S.step_ms[r].toFixed(1) + " ms, outside collectives " +
              S.outside_ms[r].toFixed(1) + " ms";
          }),
          hoverinfo: "text",
          line: {color: culprit ? "#b3261e" : "rgba(90,100,115,0.55)", width: culprit ? 3 : 1.2},
          marker: {size: culprit ? 7 : 4, symbol: culprit ? "diamond" : "circle", color: culprit ? "#b3261e" : "rgba(90,100,115,0.7)"}
        });
      });
    });
    // Culprits drawn last, on top of the others.
    data.sort(function (a, b) { return (a.line.width > 2) - (b.line.width > 2); });
    var axis = function (domain, title) {
      return {domain: domain, anchor: "free", title: {text: title, font: {size: 12}}, tickformat: "d", showline: true,
        linecolor: "#b0b6bf", gridcolor: "#eceef1", zeroline: false};
    };
    var x1 = axis([0, 0.47], "step"), x2 = axis([0.53, 1], "step");
    x1.anchor = "y"; x2.anchor = "y2";
    return {data: data, layout: {
      height: 320, margin: {l: 60, r: 24, t: 40, b: 50}, hovermode: "closest", plot_bgcolor: "#ffffff",
      hoverlabel: {align: "left", font: {family: "monospace", size: 11}},
      legend: {orientation: "h", x: 0, y: 1.02, yanchor: "bottom", font: {size: 11}},
      xaxis: x1, xaxis2: x2,
      yaxis: {anchor: "x", rangemode: "tozero", title: {text: "step duration (ms)", font: {size: 12}}, gridcolor: "#eceef1"},
      yaxis2: {anchor: "x2", rangemode: "tozero", title: {text: "outside collectives (ms)", font: {size: 12}}, gridcolor: "#eceef1"}
    }};
  }

  function drawSteps(D) {
    var node = document.getElementById("steps-plot");
    if (!node || !D.steps) { return Promise.resolve(); }
    var fig = stepFigure(D.steps);
    return Plotly.react(node, fig.data, fig.layout, {displaylogo: false, responsive: true, scrollZoom: false,
      modeBarButtonsToRemove: ["select2d", "lasso2d"], toImageButtonOptions: {filename: "postmortem-step-times"}});
  }

  // --- full inputs table (large jobs) -------------------------------------------------------------

  function inputsTable(D) {
    var holder = document.getElementById("inputs-all");
    if (!holder || !D.inputs) { return; }
    var I = D.inputs, button = el("button", "show all " + I.file.length + " files");
    var filter = el("input"), pager = el("div", null, "pager"), table = el("table", null, "inputs"), start = 0;
    filter.placeholder = "filter by path"; filter.type = "search";
    function matching() {
      var q = filter.value, out = [];
      for (var i = 0; i < I.file.length; i++) { if (!q || I.file[i].indexOf(q) >= 0) { out.push(i); } }
      return out;
    }
    function show() {
      var rows = matching();
      while (table.firstChild) { table.removeChild(table.firstChild); }
      var head = el("tr");
      ["file", "format", "ranks", "lines", "recognised", "status", "reason"].forEach(function (h) { head.appendChild(el("th", h)); });
      table.appendChild(head);
      rows.slice(start, start + INPUT_PAGE).forEach(function (i) {
        var tr = el("tr", null, I.status[i]);
        var lines = I.lines[i], rec = lines ? Math.round(100 * (lines - I.unparsed[i]) / lines) + "%" : "";
        [I.file[i], I.format[i], I.ranks[i], String(lines), rec, I.status[i], I.reason[i]].forEach(function (v, c) {
          tr.appendChild(el("td", v, c === 3 || c === 4 ? "num" : ""));
        });
        table.appendChild(tr);
      });
      while (pager.firstChild) { pager.removeChild(pager.firstChild); }
      pager.appendChild(el("span", rows.length ? (start + 1) + "\u2013" + Math.min(rows.length, start + INPUT_PAGE) + " of " + rows.length + " files " : "no file matches ", "muted"));
      if (start > 0) {
        var prev = el("button", "previous"); prev.addEventListener("click", function () { start = Math.max(0, start - INPUT_PAGE); show(); });
        pager.appendChild(prev);
      }
      if (start + INPUT_PAGE < rows.length) {
        var next = el("button", "next"); next.addEventListener("click", function () { start += INPUT_PAGE; show(); });
        pager.appendChild(next);
      }
    }
    button.addEventListener("click", function () {
      holder.removeChild(button);
      holder.appendChild(filter); holder.appendChild(pager); holder.appendChild(table);
      filter.addEventListener("input", function () { start = 0; show(); });
      show();
    });
    holder.appendChild(button);
  }

  // --- start ------------------------------------------------------------------------------------

  function fail(error) {
    var box = document.getElementById("timeline-error");
    if (box) { box.textContent = "The timeline could not be drawn: " + (error && error.message ? error.message : String(error)); }
    console.error(error);
  }

  function start() {
    readData().then(function (D) {
      inputsTable(D);
      var plot = document.getElementById("timeline-plot"), list = document.getElementById("timeline-folds");
      if (!D.lanes.label.length) {
        plot.style.display = "none";
        document.body.setAttribute("data-timeline", "empty");
        performance.mark("pm-timeline-ready");
        return;
      }
      var timeline = new Timeline(D);
      window.postmortemTimeline = timeline;  // for tests and the curious: rows(), figure()
      function redraw() {
        timeline.controls(list, redraw);
        return timeline.draw(plot);
      }
      return Promise.all([redraw(), drawSteps(D)]).then(function () {
        plot.on("plotly_click", function (ev) {
          if (!ev || !ev.points || !ev.points.length) { return; }
          var row = timeline.rows()[Math.round(ev.points[0].y)];
          if (row && row.unit === undefined && D.lanes.folded[row.lane]) {
            if (timeline.expanded[row.lane] === undefined) { timeline.expanded[row.lane] = 0; } else { delete timeline.expanded[row.lane]; }
            redraw();
          }
        });
        document.body.setAttribute("data-timeline", "ready");
        performance.mark("pm-timeline-ready");
      });
    }).catch(fail);
  }

  if (typeof Plotly === "undefined") {
    fail(new Error("plotly.js is missing from this file"));
  } else {
    start();
  }
})();
