// A namespace's lineage as a graph: one row per checkpoint in commit order (newest on
// top), a lane per branch. A child continues its parent's lane if it is the parent's first
// child; a fork (a later child) opens a new lane. Deleted checkpoints appear as
// tombstones, and a parent in another namespace as an external node.

import { s } from "./dom.js";
import { bytes, shortId, value } from "./format.js";

const ROW = 46;
const LANE = 26;
const TOP = 22;
const LEFT = 18;

/** Assign each node a lane; `nodes` sorted oldest first. */
function lanes(nodes) {
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const continued = new Set(); // parents whose lane a child already continues
  const lane = new Map();
  let next = 0;
  for (const n of nodes) {
    const parent = n.parent && byId.get(n.parent);
    if (parent && lane.has(parent.id) && !continued.has(parent.id)) {
      continued.add(parent.id);
      lane.set(n.id, lane.get(parent.id));
    } else {
      lane.set(n.id, next);
      next += 1;
    }
  }
  return { lane, count: Math.max(1, next) };
}

function label(n, metaKey) {
  if (n.kind === "tombstone") return [`${shortId(n.id)} deleted`];
  if (n.kind === "external") return [`from ${n.namespace || "another namespace"} ${shortId(n.id)}`];
  const r = n.rec;
  const first = [shortId(r.id), r.tier, bytes(r.size)];
  if (r.pinned) first.push("pinned");
  if (metaKey && r.metadata && metaKey in r.metadata) {
    first.push(`${metaKey}=${value(r.metadata[metaKey])}`);
  }
  const second = [];
  if (r.tags.length) second.push(r.tags.map((t) => `#${t}`).join(" "));
  if (r.validity.state !== "unverified") second.push(r.validity.state);
  return [first.join(" · "), second.join(" · ")];
}

/**
 * The graph as an svg. nodes: [{id, parent, kind: "live"|"tombstone"|"external", rec}],
 * any order; onSelect(id) is called when a live checkpoint is clicked.
 */
export function lineageGraph(nodes, { metaKey, selected, onSelect }) {
  const sorted = [...nodes].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  const { lane, count } = lanes(sorted);
  const row = new Map(sorted.map((n, i) => [n.id, sorted.length - 1 - i]));
  const px = (id) => LEFT + lane.get(id) * LANE;
  const py = (id) => TOP + row.get(id) * ROW;
  const textX = LEFT + count * LANE + 8;
  const width = textX + 560;
  const height = TOP + sorted.length * ROW;
  const svg = s("svg", {
    viewBox: `0 0 ${width} ${height}`,
    width,
    height,
    class: "lineage",
    role: "group",
    "aria-label": "lineage",
  });
  const edges = s("g", { class: "edges" });
  svg.append(edges);
  for (const n of sorted) {
    if (!n.parent || !row.has(n.parent)) continue;
    const [x1, y1, x2, y2] = [px(n.parent), py(n.parent), px(n.id), py(n.id)];
    const d = x1 === x2 ? `M${x1},${y1} L${x2},${y2}` : `M${x1},${y1} C${x1},${y1 - ROW / 2} ${x2},${y1 - ROW / 2} ${x2},${y1 - ROW} L${x2},${y2}`;
    edges.append(s("path", { d, class: x1 === x2 ? "edge" : "edge fork" }));
  }
  for (const n of sorted) {
    const [x, y] = [px(n.id), py(n.id)];
    const [line1, line2] = label(n, metaKey);
    const attrs =
      n.kind === "live"
        ? {
            "data-checkpoint": n.id,
            "data-validity": n.rec.validity.state,
            class: `node live ${n.rec.validity.state}${n.id === selected ? " selected" : ""}${n.forked ? " forked" : ""}`,
            tabindex: 0,
            role: "button",
            "aria-label": `checkpoint ${n.id}`,
          }
        : { [`data-${n.kind}`]: n.id, class: `node ${n.kind}` };
    const g = s("g", attrs);
    if (n.kind === "tombstone") {
      g.append(s("path", { d: `M${x - 5},${y - 5} L${x + 5},${y + 5} M${x + 5},${y - 5} L${x - 5},${y + 5}`, class: "cross" }));
    } else {
      g.append(s("circle", { cx: x, cy: y, r: n.kind === "live" ? 7 : 5 }));
    }
    g.append(s("line", { x1: x + 9, x2: textX - 4, y1: y, y2: y, class: "leader" }));
    g.append(s("text", { x: textX, y: y - 2, class: "l1" }, line1));
    if (line2) g.append(s("text", { x: textX, y: y + 13, class: "l2" }, line2));
    g.append(s("title", {}, n.id));
    if (n.kind === "live") {
      g.addEventListener("click", () => onSelect(n.id));
      g.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" || ev.key === " ") {
          ev.preventDefault();
          onSelect(n.id);
        }
      });
    }
    svg.append(g);
  }
  return svg;
}
