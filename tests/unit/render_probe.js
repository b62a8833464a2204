// Injected by tests/unit/test_report.py into a copy of a report: after load, draw every chart
// (inline SVG) onto a canvas, count its inked and coloured pixels, and write the result into the
// page as JSON (read back with chromium --dump-dom).
window.addEventListener("load", function () {
  var svgs = document.querySelectorAll("svg.chart"), results = [], pending = svgs.length;
  function done() {
    var d = document.createElement("div");
    d.id = "render-check";
    d.textContent = JSON.stringify(results);
    document.body.appendChild(d);
  }
  if (!pending) done();
  svgs.forEach(function (svg, i) {
    var box = svg.getBoundingClientRect(), img = new Image();
    img.onload = function () {
      var c = document.createElement("canvas");
      c.width = img.width || 680; c.height = img.height || 320;
      var g = c.getContext("2d");
      g.drawImage(img, 0, 0);
      var px = g.getImageData(0, 0, c.width, c.height).data, ink = 0, colored = 0;
      for (var k = 0; k < px.length; k += 4) {
        var hi = Math.max(px[k], px[k + 1], px[k + 2]), lo = Math.min(px[k], px[k + 1], px[k + 2]);
        if (lo < 235) ink++;
        if (hi - lo > 60) colored++;
      }
      results[i] = {name: svg.closest("figure").dataset.chart, w: box.width, h: box.height, ink: ink,
                    colored: colored};
      if (--pending === 0) done();
    };
    img.onerror = function () {
      results[i] = {name: "decode error", w: 0, h: 0, ink: 0, colored: 0};
      if (--pending === 0) done();
    };
    img.src = "data:image/svg+xml;charset=utf-8," +
      encodeURIComponent(new XMLSerializer().serializeToString(svg));
  });
});
