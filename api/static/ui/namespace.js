// One namespace: its lineage graph, the selected checkpoint's details and actions, its
// storage over time, and what its retention policy would delete.

import { download, get, path, send } from "./api.js";
import { storageChart } from "./chart.js";
import { add, fill, h } from "./dom.js";
import { bytes, rfcSeconds, shortId, value, when } from "./format.js";
import { lineageGraph } from "./lineage.js";
import { policySummary } from "./namespaces.js";

const MAX_LINEAGE_LOOKUPS = 40; // lineage requests to find tombstones and outside parents

async function allCheckpoints(ns) {
  const out = [];
  let before = null;
  do {
    const q = new URLSearchParams({ limit: "1000" });
    if (before) q.set("before", before);
    const page = await get(`${path("/v1/namespaces", ns, "checkpoints")}?${q}`);
    out.push(...page.checkpoints);
    before = page.next;
  } while (before);
  return out;
}

/** Live checkpoints, plus tombstones and outside parents found through lineage. */
async function graphNodes(ns, records) {
  const nodes = new Map(records.map((r) => [r.id, { id: r.id, parent: r.parent, kind: "live", rec: r }]));
  const orphans = records.filter((r) => r.parent && !nodes.has(r.parent)).slice(0, MAX_LINEAGE_LOOKUPS);
  const chains = await Promise.all(
    orphans.map((r) => get(path("/v1/namespaces", ns, "checkpoints", r.id, "lineage"))),
  );
  for (const { chain } of chains) {
    for (const entry of chain.slice(1)) {
      if (nodes.has(entry.id)) break;
      if (entry.namespace !== ns) {
        nodes.set(entry.id, { id: entry.id, parent: null, kind: "external", namespace: entry.namespace });
        break;
      }
      if (entry.deleted) {
        nodes.set(entry.id, { id: entry.id, parent: entry.parent, kind: "tombstone" });
      }
    }
  }
  return [...nodes.values()];
}

function metadataKeys(records) {
  const keys = new Set();
  for (const r of records) {
    for (const [k, v] of Object.entries(r.metadata || {})) {
      if (v === null || typeof v !== "object") keys.add(k);
    }
  }
  return [...keys].sort();
}

export async function namespaceView(view, who, ns, selected, showError) {
  const st = { view, who, ns, selected, showError, metaKey: null, records: [], nodes: [], plan: null };
  st.graphBox = h("div", { class: "graph-box" });
  st.detail = h("aside", { id: "detail", class: "detail" },
    h("p", { class: "muted" }, "Click a checkpoint to see its files, storage and validity."));
  st.metaSelect = h("select", { name: "meta", onchange: () => {
    st.metaKey = st.metaSelect.value || null;
    drawGraph(st);
  } });
  st.summary = h("p", { class: "muted" });
  st.chartBox = h("div");
  st.retention = h("section", { id: "retention" });
  add(view, 
    h("h1", {}, ns),
    st.summary,
    h("section", { class: "split" },
      h("div", {},
        h("h2", {}, "Lineage"),
        h("label", { class: "small" }, "show metadata ", st.metaSelect),
        st.graphBox),
      st.detail),
    h("h2", {}, "Storage over time"),
    st.chartBox,
    h("h2", {}, "Retention"),
    st.retention,
  );
  await Promise.all([load(st), drawChart(st)]);
  await drawRetention(st);
}

async function load(st) {
  st.records = await allCheckpoints(st.ns);
  st.nodes = await graphNodes(st.ns, st.records);
  const keys = metadataKeys(st.records);
  if (st.metaKey === null || !keys.includes(st.metaKey)) {
    st.metaKey = keys.includes("step") ? "step" : keys[0] || null;
  }
  fill(st.metaSelect, h("option", { value: "" }, "(none)"),
    keys.map((k) => h("option", { value: k, selected: k === st.metaKey }, k)));
  const invalid = st.records.filter((r) => r.validity.state === "invalid").length;
  const logical = st.records.reduce((t, r) => t + r.size, 0);
  st.summary.textContent =
    `${st.records.length} checkpoints, ${invalid} invalid, ${bytes(logical)} logical` +
    (st.nodes.length > st.records.length ? `, ${st.nodes.length - st.records.length} deleted or outside` : "");
  drawGraph(st);
  if (st.selected && !st.records.some((r) => r.id === st.selected)) st.selected = null;
  if (st.selected) await drawDetail(st);
}

function drawGraph(st) {
  const svg = lineageGraph(st.nodes, {
    metaKey: st.metaKey,
    selected: st.selected,
    onSelect: (id) => select(st, id),
  });
  if (st.plan) {
    for (const id of st.plan.delete) {
      const g = svg.querySelector(`[data-checkpoint="${CSS.escape(id)}"]`);
      if (g) g.classList.add("would-delete");
    }
  }
  fill(st.graphBox, svg);
}

function select(st, id) {
  st.selected = id;
  history.replaceState(null, "", `#/ns/${st.ns}?c=${id}`);
  drawGraph(st);
  drawDetail(st).catch(st.showError);
}

function kv(rows) {
  return h("dl", { class: "kv" }, rows.filter(Boolean).flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

async function drawDetail(st) {
  const rec = st.records.find((r) => r.id === st.selected);
  if (!rec) return;
  const base = path("/v1/namespaces", st.ns, "checkpoints", rec.id);
  const storageBox = h("div", { class: "muted" }, "measuring storage…");
  const v = rec.validity;
  fill(
    st.detail,
    h("h2", {}, "Checkpoint ", h("code", {}, rec.id)),
    kv([
      ["created", rec.created_at],
      ["parent", rec.parent ? h("code", {}, rec.parent) : "none (a root)"],
      ["tier", rec.tier],
      ["pinned", rec.pinned ? "yes" : "no"],
      ["size", bytes(rec.size)],
      ["tags", rec.tags.length ? h("span", {}, rec.tags.map((t) => h("span", { class: "tag" }, t))) : "none"],
      ["validity", h("span", { "data-validity-state": v.state }, v.state)],
      v.reason ? ["reason", h("span", { class: "reason" }, v.reason)] : null,
      v.source ? ["marked by", `${v.source}${v.at ? ` at ${v.at}` : ""}`] : null,
    ]),
    h("h3", {}, "Metadata"),
    Object.keys(rec.metadata || {}).length
      ? kv(Object.entries(rec.metadata).map(([k, x]) => [k, value(x)]))
      : h("p", { class: "muted" }, "none"),
    h("h3", {}, "Files"),
    h("table", { class: "grid-table files" },
      h("thead", {}, h("tr", {}, ["name", "size", "hash", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, Object.entries(rec.files).map(([name, f]) => h("tr", {},
        h("td", {}, name),
        h("td", { class: "num" }, bytes(f.size)),
        h("td", {}, h("code", { title: f.hash }, f.hash.slice(0, 12))),
        h("td", {}, st.who.may("read", st.ns)
          ? h("button", { type: "button", "data-download": name,
              onclick: () => download(`${base}/files/${path(name)}`, name).catch(st.showError) }, "download")
          : null))))),
    h("h3", {}, "Storage"),
    storageBox,
    actions(st, rec, base),
  );
  try {
    fill(storageBox, storageTable(await get(`${base}/storage`)));
    storageBox.classList.remove("muted");
  } catch (err) {
    storageBox.textContent = err.message;
  }
}

function storageTable(u) {
  return h("div", {},
    kv([
      ["logical", bytes(u.logical_bytes)],
      ["stored", `${bytes(u.stored_bytes)}${u.ratio ? ` (×${u.ratio})` : ""}`],
      ["chunks", u.chunks],
      ["longest delta chain", u.max_chain],
      ["tiers", Object.entries(u.tiers).map(([t, b]) => `${t} ${bytes(b)}`).join(", ") || "—"],
    ]),
    h("table", { class: "grid-table" },
      h("thead", {}, h("tr", {}, ["codec", "chunks", "stored", "plain"].map((t) => h("th", {}, t)))),
      h("tbody", {}, Object.entries(u.codecs).map(([c, x]) => h("tr", {},
        h("td", {}, c), h("td", { class: "num" }, x.chunks),
        h("td", { class: "num" }, bytes(x.bytes)), h("td", { class: "num" }, bytes(x.plain)))))));
}

/** The buttons this token may use on `rec` (none for a read-only token). */
function actions(st, rec, base) {
  const canWrite = st.who.may("write", st.ns) || st.who.may("delete", st.ns);
  const canDelete = st.who.may("delete", st.ns);
  if (!canWrite) return null;
  const reason = h("input", { name: "reason", placeholder: "reason (optional)", maxlength: 500 });
  const tag = h("input", { name: "tag", placeholder: "new tag", maxlength: 128 });
  const confirmRow = h("div", { class: "confirm", hidden: true });
  const act = (body) => async () => {
    await send("PATCH", base, body);
    await load(st);
  };
  const run = (fn) => () => fn().catch(st.showError);
  const box = h("section", { class: "actions" }, h("h3", {}, "Actions"),
    h("div", { class: "row" }, reason,
      h("button", { type: "button", "data-action": "valid",
        onclick: run(act2(() => ({ validity: { state: "valid", reason: reason.value || null } }))) }, "Mark valid"),
      h("button", { type: "button", "data-action": "invalid", class: "warn",
        onclick: run(act2(() => ({ validity: { state: "invalid", reason: reason.value || null } }))) }, "Mark invalid")),
    h("div", { class: "row" },
      rec.pinned
        ? (canDelete ? h("button", { type: "button", "data-action": "unpin", onclick: run(act({ pinned: false })) }, "Unpin") : null)
        : h("button", { type: "button", "data-action": "pin", onclick: run(act({ pinned: true })) }, "Pin")),
    h("div", { class: "row" }, tag,
      h("button", { type: "button", "data-action": "tag",
        onclick: run(act2(() => (tag.value.trim() ? { tags: [...rec.tags, tag.value.trim()] } : null))) }, "Add tag"),
      canDelete ? rec.tags.map((t) => h("button", { type: "button", class: "chip", "data-action": "untag", "data-tag": t,
        title: "remove this tag", onclick: run(act({ tags: rec.tags.filter((x) => x !== t) })) }, `× ${t}`)) : null),
    canDelete && !rec.pinned
      ? h("div", { class: "row" }, h("button", { type: "button", class: "danger", "data-action": "delete",
          onclick: () => {
            confirmRow.hidden = false;
            fill(confirmRow, `Delete ${rec.id}? It leaves a tombstone; GC frees its bytes.`,
              h("button", { type: "button", class: "danger", "data-action": "confirm-delete",
                onclick: run(async () => {
                  await send("DELETE", base);
                  st.selected = null;
                  fill(st.detail, h("p", { class: "muted" }, `Deleted ${rec.id}.`));
                  await load(st);
                }) }, "Delete"),
              h("button", { type: "button", onclick: () => { confirmRow.hidden = true; } }, "Cancel"));
          } }, "Delete…"), confirmRow)
      : null,
  );
  // A body computed at click time (the inputs' current values); null: nothing to do.
  function act2(makeBody) {
    return async () => {
      const body = makeBody();
      if (body) await act(body)();
    };
  }
  return box;
}

async function drawChart(st) {
  const history = await get("/v1/stats/history?limit=500");
  const series = [
    { label: `${st.ns} logical`, cls: "s-logical", pick: (x) => (x.namespaces[st.ns] || {}).logical_bytes },
    { label: `${st.ns} stored`, cls: "s-stored", pick: (x) => (x.namespaces[st.ns] || {}).stored_bytes },
  ];
  if (st.who.admin) {
    series.push({ label: "vault on disk", cls: "s-disk", pick: (x) => x.disk_bytes });
  }
  fill(st.chartBox, storageChart(history.samples, series, `storage of ${st.ns}`));
}

async function drawRetention(st) {
  if (!st.who.admin) {
    fill(st.retention, h("p", { class: "muted" },
      "The policy and its preview are admin routes: sign in with an admin token to see them."));
    return;
  }
  const [policy, report] = await Promise.all([
    get(path("/v1/namespaces", st.ns, "policy")),
    send("POST", `/v1/admin/retention?dry_run=true&namespace=${encodeURIComponent(st.ns)}`),
  ]);
  const plan = (report.namespaces && report.namespaces[st.ns]) ||
    { keep: Object.fromEntries(report.keep.map((id) => [id, []])), delete: report.delete, reclaimable_bytes: report.reclaimable_bytes };
  st.plan = plan;
  drawGraph(st);
  const byId = new Map(st.records.map((r) => [r.id, r]));
  const row = (id, action, rules) => {
    const r = byId.get(id);
    return h("tr", { "data-plan": action, "data-plan-checkpoint": id },
      h("td", {}, h("code", { title: id }, shortId(id))),
      h("td", {}, r ? when(rfcSeconds(r.created_at)) : ""),
      h("td", {}, r ? r.tags.join(" ") : ""),
      h("td", { class: action === "delete" ? "warn-text" : "" }, action),
      h("td", {}, rules.join(", ")));
  };
  const rows = [
    ...plan.delete.map((id) => row(id, "delete", [])),
    ...Object.entries(plan.keep).map(([id, rules]) => row(id, "keep", rules)),
  ].sort((a, b) => (a.dataset.planCheckpoint < b.dataset.planCheckpoint ? 1 : -1));
  const confirmRow = h("div", { class: "confirm", hidden: true });
  const applyBox = st.who.may("delete", st.ns) && plan.delete.length
    ? h("div", { class: "row" },
        h("button", { type: "button", class: "danger", "data-action": "apply-retention", onclick: () => {
          confirmRow.hidden = false;
          fill(confirmRow, `Apply the policy now: delete ${plan.delete.length} checkpoints?`,
            h("button", { type: "button", class: "danger", "data-action": "confirm-retention", onclick: () => {
              send("POST", `/v1/admin/retention?dry_run=false&namespace=${encodeURIComponent(st.ns)}`)
                .then(async () => {
                  st.plan = null;
                  await load(st);
                  await drawRetention(st);
                })
                .catch(st.showError);
            } }, "Apply"),
            h("button", { type: "button", onclick: () => { confirmRow.hidden = true; } }, "Cancel"));
        } }, "Apply retention…"), confirmRow)
    : null;
  fill(st.retention,
    h("p", {}, h("strong", {}, "Policy: "), policySummary(policy)),
    h("p", { class: "muted" },
      `Preview (nothing applied): ${plan.delete.length} to delete, ${Object.keys(plan.keep).length} kept, ` +
      `${bytes(plan.reclaimable_bytes)} reclaimable at the next GC.`),
    h("table", { class: "grid-table", id: "retention-plan" },
      h("thead", {}, h("tr", {}, ["checkpoint", "created", "tags", "action", "kept by"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows)),
    applyBox);
}
