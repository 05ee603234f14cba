// The storage chart: lines of bytes over time from GET /v1/stats/history samples, drawn
// as SVG (no library: a few polylines and axis labels).

import { h, s } from "./dom.js";
import { bytes, when } from "./format.js";

const W = 720;
const H = 240;
const PAD = { left: 78, right: 16, top: 12, bottom: 34 };

function scale(lo, hi, outLo, outHi) {
  const span = hi - lo || 1;
  return (v) => outLo + ((v - lo) / span) * (outHi - outLo);
}

/**
 * A figure with `data-chart="storage"` holding an svg.
 * series: [{label, cls, pick: (sample) => number | null}]
 */
export function storageChart(samples, series, title) {
  const svg = s("svg", {
    viewBox: `0 0 ${W} ${H}`,
    width: W,
    height: H,
    role: "img",
    "aria-label": title,
    class: "chart",
  });
  const lines = series.map((def) => ({
    ...def,
    points: samples
      .map((smp) => [smp.at, def.pick(smp)])
      .filter(([, v]) => v !== null && v !== undefined),
  }));
  const all = lines.flatMap((l) => l.points);
  const figure = h("figure", { "data-chart": "storage", class: "chart-box" }, svg);
  if (all.length === 0) {
    svg.append(
      s("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" },
        "no samples yet: one is taken at each usage scan and every hour"),
    );
    figure.append(h("figcaption", {}, title));
    return figure;
  }
  let t0 = Math.min(...all.map((p) => p[0]));
  let t1 = Math.max(...all.map((p) => p[0]));
  if (t1 - t0 < 1) {
    t0 -= 30; // one sample: centre it in a minute
    t1 += 30;
  }
  const vmax = Math.max(1, ...all.map((p) => p[1])) * 1.08;
  const x = scale(t0, t1, PAD.left, W - PAD.right);
  const y = scale(0, vmax, H - PAD.bottom, PAD.top);

  for (let i = 0; i <= 4; i += 1) {
    const v = (vmax * i) / 4;
    svg.append(
      s("line", { x1: PAD.left, x2: W - PAD.right, y1: y(v), y2: y(v), class: "grid" }),
      s("text", { x: PAD.left - 6, y: y(v) + 4, "text-anchor": "end", class: "axis" }, bytes(v)),
    );
  }
  for (let i = 0; i <= 4; i += 1) {
    const t = t0 + ((t1 - t0) * i) / 4;
    const anchor = i === 0 ? "start" : i === 4 ? "end" : "middle";
    // times within two days (the caption has the dates), else dates and hours
    const text = t1 - t0 < 172800 ? when(t).slice(11, 19) : when(t).slice(5, 16);
    svg.append(
      s("line", { x1: x(t), x2: x(t), y1: H - PAD.bottom, y2: H - PAD.bottom + 4, class: "tick" }),
      s("text", { x: x(t), y: H - 10, "text-anchor": anchor, class: "axis" }, text),
    );
  }
  for (const line of lines) {
    if (line.points.length === 0) continue;
    const pts = line.points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    svg.append(s("polyline", { points: pts, class: `series ${line.cls}` }));
    for (const [t, v] of line.points) {
      svg.append(
        s("circle", { cx: x(t), cy: y(v), r: 2.5, class: `dot ${line.cls}` },
          s("title", {}, `${line.label}: ${bytes(v)} at ${when(t)}`)),
      );
    }
  }
  const legend = h(
    "ul",
    { class: "legend" },
    lines
      .filter((l) => l.points.length)
      .map((l) => {
        const last = l.points[l.points.length - 1][1];
        return h("li", {}, h("span", { class: `swatch ${l.cls}` }), `${l.label}: ${bytes(last)}`);
      }),
  );
  figure.append(h("figcaption", {}, `${title}, ${when(t0)} to ${when(t1)}`), legend);
  return figure;
}
