// The nccl-tests section of the report: busbw by message size, one curve per run (or host), and
// each run's expected line (dashed). Reads only the page's own #pm-busbw JSON; draws with the
// inlined plotly.js. Nothing is fetched.
(function () {
  "use strict";
  var node = document.getElementById("pm-busbw");
  var plot = document.getElementById("busbw-plot");
  if (!node || !plot) { return; }
  if (!window.Plotly) { plot.textContent = "The curve needs the inlined plotly.js, which did not load."; return; }
  var D = JSON.parse(node.textContent);
  var data = [];
  D.runs.forEach(function (r, i) {
    var colour = D.palette[i % D.palette.length];
    data.push({
      type: "scatter", mode: "lines+markers", name: r.label, x: r.size, y: r.busbw,
      line: { color: colour, width: r.flagged ? 3 : 1.5 }, marker: { size: r.flagged ? 7 : 5 },
      hovertemplate: "%{x} B: %{y} GB/s<extra>" + r.label.replace(/[<>&]/g, "") + "</extra>"
    });
    if (r.expected !== null) {
      data.push({
        type: "scatter", mode: "lines", name: "expected for " + r.label + ": " + r.basis,
        x: [r.size[0], r.size[r.size.length - 1]], y: [r.expected, r.expected],
        line: { color: colour, dash: "dash", width: 1 }, hoverinfo: "name", showlegend: i < 8
      });
    }
  });
  Plotly.newPlot(plot, data, {
    height: 420, margin: { l: 60, r: 20, t: 10, b: 50 },
    xaxis: { type: "log", title: { text: "message size (bytes)" } },
    yaxis: { title: { text: "busbw (GB/s)" }, rangemode: "tozero" },
    legend: { orientation: "h", y: -0.2 }
  }, { displaylogo: false, responsive: true });
})();
