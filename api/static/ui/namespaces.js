// The namespaces the token may read: checkpoints, logical / stored bytes, last save, RPO
// (time since the newest checkpoint: what a crash now would lose), retention policy; and
// the storage chart for the vault (admin) or the readable namespaces together.

import { get, path } from "./api.js";
import { storageChart } from "./chart.js";
import { add, h } from "./dom.js";
import { ago, bytes, ulidSeconds, when } from "./format.js";

export function policySummary(policy) {
  const r = (policy && policy.retention) || {};
  const parts = [];
  for (const [key, v] of Object.entries(r)) {
    if (v === null || v === undefined || (Array.isArray(v) && v.length === 0)) continue;
    const name = key.replace(/^keep_/, "");
    if (key === "keep_best") parts.push(`best ${v.mode} ${v.metric} ×${v.n}`);
    else if (Array.isArray(v)) parts.push(`${name} ${v.join(",")}`);
    else parts.push(`${name} ${v}`);
  }
  return parts.length ? parts.join(", ") : "no rules (keeps everything)";
}

export async function namespacesView(view, who, showError) {
  const [list, history] = await Promise.all([
    get("/v1/namespaces"),
    get("/v1/stats/history?limit=500"),
  ]);
  const samples = history.samples;
  const lastByNs = {};
  for (const smp of samples) Object.assign(lastByNs, smp.namespaces);
  const now = Date.now() / 1000;
  const rows = list.namespaces.map((ns) => {
    const saved = ulidSeconds(ns.latest);
    const policyCell = h("td", { class: "muted" }, who.admin ? "…" : "—");
    if (who.admin) {
      get(path("/v1/namespaces", ns.name, "policy"))
        .then((p) => {
          policyCell.textContent = policySummary(p);
          policyCell.classList.remove("muted");
        })
        .catch(showError);
    }
    const stored = lastByNs[ns.name] ? lastByNs[ns.name].stored_bytes : null;
    return h(
      "tr",
      { "data-namespace": ns.name },
      h("td", {}, h("a", { href: `#/ns/${ns.name}` }, ns.name)),
      h("td", { class: "num" }, ns.checkpoints),
      h("td", { class: "num" }, bytes(ns.logical_bytes)),
      h("td", { class: "num", title: "at the last usage scan" }, bytes(stored)),
      h("td", {}, when(saved)),
      h("td", { class: "num" }, saved === null ? "—" : ago(now - saved)),
      policyCell,
    );
  });
  const last = samples.length ? samples[samples.length - 1] : null;
  add(view, 
    h("h1", {}, "Namespaces"),
    list.namespaces.length
      ? h(
          "table",
          { class: "grid-table", id: "namespaces" },
          h("thead", {}, h("tr", {},
            ["namespace", "checkpoints", "logical", "stored", "last save", "RPO", "retention policy"]
              .map((t) => h("th", {}, t)))),
          h("tbody", {}, rows),
        )
      : h("p", { class: "muted" }, "No namespace this token may read."),
    who.admin && last
      ? h("p", { class: "muted" },
          `Vault: ${bytes(last.logical_bytes)} logical, ${bytes(last.stored_bytes)} stored, ` +
          `${bytes(last.disk_bytes)} on disk (data dir, allocated blocks).`)
      : null,
    h("h2", {}, "Storage over time"),
    storageChart(samples, seriesForOverview(who, list.namespaces), "vault storage"),
  );
}

function seriesForOverview(who, namespaces) {
  if (who.admin) {
    return [
      { label: "vault logical", cls: "s-logical", pick: (x) => x.logical_bytes },
      { label: "vault stored", cls: "s-stored", pick: (x) => x.stored_bytes },
      { label: "vault on disk", cls: "s-disk", pick: (x) => x.disk_bytes },
    ];
  }
  // Without admin, the readable namespaces summed: what this token's share looks like.
  const names = new Set(namespaces.map((n) => n.name));
  const sum = (field) => (x) => {
    const found = Object.entries(x.namespaces).filter(([ns]) => names.has(ns));
    return found.length ? found.reduce((t, [, b]) => t + b[field], 0) : null;
  };
  return [
    { label: "logical (readable namespaces)", cls: "s-logical", pick: sum("logical_bytes") },
    { label: "stored (readable namespaces)", cls: "s-stored", pick: sum("stored_bytes") },
  ];
}
