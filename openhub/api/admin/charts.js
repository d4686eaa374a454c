// Line charts drawn as inline SVG, no library (the page's CSP allows only 'self').
// lineChart(svg, {points, series: [{key, label, cls}], yFormat, title}) redraws `svg` in place.
"use strict";
const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  Object.entries(attrs || {}).forEach(([k, v]) => el.setAttribute(k, String(v)));
  if (text !== undefined) el.textContent = text;
  return el;
}

// A maximum for the y axis that reads well: 1, 2 or 5 times a power of ten.
function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 5, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}

function lineChart(svg, opts) {
  const W = 480, H = 180, L = 44, R = 10, T = 24, B = 26;
  const points = opts.points;
  const fmtY = opts.yFormat || ((v) => String(Math.round(v * 100) / 100));
  const top = opts.yMax !== undefined ? opts.yMax
    : niceMax(Math.max(0, ...opts.series.flatMap((s) => points.map((p) => p[s.key]))));
  svg.textContent = "";
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("role", "img");
  const last = opts.series.map((s) => `${s.label} ${fmtY(points.length ? points[points.length - 1][s.key] : 0)}`);
  svg.setAttribute("aria-label", `${opts.title}; latest: ${last.join(", ")}`);
  svg.appendChild(svgEl("title", {}, opts.title));
  svg.appendChild(svgEl("text", { x: L, y: 14, class: "chart-title" }, opts.title));
  const x = (i) => L + (points.length > 1 ? i * (W - L - R) / (points.length - 1) : 0);
  const y = (v) => T + (H - T - B) * (1 - Math.min(v, top) / top);
  for (const frac of [0, 0.5, 1]) {  // grid lines with their values
    svg.appendChild(svgEl("line", { x1: L, x2: W - R, y1: y(top * frac), y2: y(top * frac), class: "grid" }));
    svg.appendChild(svgEl("text", { x: L - 4, y: y(top * frac) + 4, class: "axis", "text-anchor": "end" },
      fmtY(top * frac)));
  }
  if (points.length) {
    // Ends on different days (the day charts) are dated, or 02:36 … 02:21 would read backwards.
    const day = (p) => (p.at || "").slice(0, 10);
    const dated = day(points[0]) !== day(points[points.length - 1]);
    const label = (p) => {
      const at = p.at || "", time = at.slice(11, 16);
      return dated ? `${Number(at.slice(8, 10))} ${MONTHS[Number(at.slice(5, 7)) - 1]} ${time}` : time;
    };
    svg.appendChild(svgEl("text", { x: L, y: H - 8, class: "axis" }, label(points[0])));
    svg.appendChild(svgEl("text", { x: W - R, y: H - 8, class: "axis", "text-anchor": "end" },
      label(points[points.length - 1]) + " UTC"));
  }
  opts.series.forEach((s, n) => {
    const d = points.map((p, i) => `${i ? "L" : "M"}${x(i).toFixed(1)},${y(p[s.key]).toFixed(1)}`).join(" ");
    const path = svgEl("path", { d: d || `M${L},${y(0)}`, class: "series " + s.cls, "data-series": s.key });
    path.appendChild(svgEl("title", {}, s.label));
    svg.appendChild(path);
    svg.appendChild(svgEl("text", { x: W - R - 110 * (opts.series.length - n), y: 14, class: "legend " + s.cls },
      "— " + s.label));
  });
}
