// Operations (admin): a cluster's nodes and shards (when the server is part of one), tiers
// and their usage, the server's role and replication lag, maintenance runs since start,
// and the audit log's recent entries.

import { get } from "./api.js";
import { add, h } from "./dom.js";
import { ago, bytes, when } from "./format.js";

function table(id, head, rows) {
  return h("table", { class: "grid-table", id },
    h("thead", {}, h("tr", {}, head.map((t) => h("th", {}, t)))),
    h("tbody", {}, rows));
}

function replication(stats) {
  const r = stats.replication;
  const sb = stats.standby;
  const rows = [["role", stats.role]];
  if (r) {
    rows.push(
      ["replicates to", `${r.tier} (${r.mode})`],
      ["lag", `${r.lag_seconds === null ? "—" : ago(r.lag_seconds)}, ${bytes(r.lag_bytes)} queued (budget ${r.lag_budget} s)`],
      ["shipped", `${bytes(r.shipped_bytes)} in ${r.batches} batches, ${r.failures} failures`],
      r.last_error ? ["last error", r.last_error] : null,
    );
  } else if (!sb) {
    rows.push(["replication", "off"]);
  }
  if (sb) {
    rows.push(
      ["follows", `${sb.tier} (${sb.state})`],
      ["lag", sb.lag_seconds === null ? "—" : ago(sb.lag_seconds)],
      sb.last_error ? ["last error", sb.last_error] : null,
    );
  }
  return h("dl", { class: "kv" }, rows.filter(Boolean).flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))]));
}

// GET /v1/cluster: nodes up or down (a beat within the lease TTL), each shard's owner,
// epoch, replica lag and standbys. Every server answers; {"cluster": false} draws nothing.
function cluster(state) {
  if (!state.cluster) return [];
  const nodes = state.nodes.map((n) =>
    h("tr", { "data-node": n.node, "data-up": String(n.up) },
      h("td", {}, n.node),
      h("td", {}, n.up ? "up" : "down"),
      h("td", { class: "num" }, n.processes),
      h("td", {}, ago(n.beat_age_seconds))));
  const shards = state.shard_owners.map((s) =>
    h("tr", { "data-shard": String(s.shard) },
      h("td", { class: "num" }, s.shard),
      h("td", {}, s.owner ?? "none"),
      h("td", { class: "num" }, s.epoch ?? "—"),
      h("td", {}, s.lag_seconds === null ? "—" : ago(s.lag_seconds)),
      h("td", { class: "num" }, s.checkpoints ?? "—"),
      h("td", { class: "num" }, s.stored_bytes === null ? "—" : bytes(s.stored_bytes)),
      h("td", {}, s.standbys.join(", ") || "—")));
  const t = state.totals;
  return [
    h("h2", {}, `Cluster: ${state.nodes.length} nodes, ${state.shards} shards`),
    h("p", {}, `${t.checkpoints} checkpoints, ${bytes(t.logical_bytes)} logical, ${bytes(t.stored_bytes)} stored in all shards.`),
    table("cluster-nodes", ["node", "state", "processes", "last beat"], nodes),
    table("cluster-shards", ["shard", "owner", "epoch", "replica lag", "checkpoints", "stored", "standbys"], shards),
  ];
}

export async function opsView(view) {
  // A cluster's totals are 503 while a shard has no live owner (the whole would be short):
  // the view is drawn without them, so the nodes' states show what is down.
  const [stats, jobs, audit, clustered] = await Promise.all([
    get("/v1/stats").catch((err) => err),
    get("/v1/admin/jobs"),
    get("/v1/admin/audit?limit=50"),
    get("/v1/cluster"),
  ]);
  const whole = !(stats instanceof Error);
  const tiers = !whole ? [] : Object.entries(stats.tiers).map(([name, t]) =>
    h("tr", {}, h("td", {}, name), h("td", { class: "num" }, t.chunks), h("td", { class: "num" }, bytes(t.bytes))));
  const runs = Object.entries(jobs.jobs).map(([name, j]) =>
    h("tr", {},
      h("td", {}, name),
      h("td", { class: "num" }, j.ok),
      h("td", { class: "num" }, j.error),
      h("td", {}, when(j.last_at)),
      h("td", { class: "num" }, j.last_seconds === null ? "—" : `${j.last_seconds.toFixed(2)} s`),
      h("td", {}, Object.entries(j.totals).map(([k, v]) => `${k} ${Math.round(v)}`).join(", "))));
  const entries = audit.entries.map((e) =>
    h("tr", {},
      h("td", {}, when(e.at)),
      h("td", {}, e.token),
      h("td", {}, e.action),
      h("td", {}, h("code", {}, e.target)),
      h("td", { class: "num" }, e.status),
      h("td", {}, h("code", {}, JSON.stringify(e.details)))));
  add(view, 
    h("h1", {}, "Operations"),
    whole
      ? h("p", {},
        `${stats.checkpoints} checkpoints in ${stats.namespaces} namespaces: ${bytes(stats.logical_bytes)} logical, ` +
        `${bytes(stats.stored_bytes)} stored (dedup ×${stats.dedup_ratio ?? "—"}), ${stats.chunks} chunks.`)
      : h("p", { class: "muted", id: "totals-unavailable" }, `Totals unavailable: ${stats.message}`),
    ...cluster(clustered),
    ...(whole ? [
      h("h2", {}, "Tiers"),
      table("tiers", ["tier", "chunks", "bytes"], tiers),
      h("h2", {}, "Role and replication"),
      replication(stats),
    ] : []),
    h("h2", {}, "Maintenance runs since the server started"),
    runs.length
      ? table("jobs", ["job", "ok", "failed", "last ended", "took", "totals"], runs)
      : h("p", { class: "muted" }, "None yet."),
    h("h2", {}, "Audit log (newest first)"),
    entries.length
      ? table("audit", ["when", "token", "action", "target", "status", "details"], entries)
      : h("p", { class: "muted" }, "No entries."),
  );
}
