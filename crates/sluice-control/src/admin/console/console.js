// The operator console: reads the admin API every few seconds with the session cookie and
// renders one table per view. Data goes into the page as text (textContent), never as HTML.
// Writes carry the session's CSRF value in X-Sluice-CSRF; a session of a read token gets
// no write buttons (and the API would refuse it anyway).
"use strict";

const REFRESH_MS = 5000;
const CSRF = document.querySelector('meta[name="sluice-csrf"]').content;
const CAN_WRITE = document.querySelector('meta[name="sluice-write"]').content === "true";
const state = { view: "rules", timer: null };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "onclick") e.addEventListener("click", v);
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function badge(text, cls) {
  return el("span", { class: "badge " + cls }, text);
}

function fill(tableId, rows, columns, empty) {
  const body = document.querySelector("#" + tableId + " tbody");
  body.replaceChildren();
  if (rows.length === 0) {
    body.append(el("tr", {}, el("td", { class: "empty", colSpan: columns }, empty)));
    return;
  }
  for (const r of rows) body.append(r);
}

async function api(method, path, body) {
  const opts = { method, credentials: "same-origin", headers: {} };
  if (method !== "GET") {
    opts.headers["X-Sluice-CSRF"] = CSRF;
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
  }
  const r = await fetch(path, opts);
  if (r.status === 401) {
    // The session ended: the page itself now shows the sign-in form.
    window.location.reload();
    throw new Error("signed out");
  }
  let v = null;
  try { v = await r.json(); } catch (_) { v = null; }
  return { status: r.status, ok: r.ok, body: v };
}

function errorText(res) {
  const e = res.body && res.body.error;
  if (e && typeof e === "object") return e.code + ": " + e.message;
  return "HTTP " + res.status;
}

function limitText(rule) {
  const a = rule.algorithm || "";
  if (a === "token_bucket" || a === "gcra") return `${rule.rate_per_s}/s, burst ${rule.burst}`;
  if (a === "concurrency") return `${rule.limit} at once`;
  return `${rule.limit} per ${rule.window}`;
}

function canaryText(rule) {
  const on = rule.enforce_on;
  if (!on || on.daemons === undefined) return null;
  const d = on.daemons;
  return Array.isArray(d) ? d.join(", ") : String(d);
}

function renderRules(rules, history) {
  if (!rules.ok) {
    fill("rules-table", [], 8, errorText(rules));
    return;
  }
  document.getElementById("rules-version").textContent = "version " + rules.body.version;
  const rows = rules.body.rules.map((r) => {
    const rule = r.rule || {};
    const mode = rule.mode || "enforce";
    const canary = canaryText(rule);
    return el("tr", { "data-rule": r.id, "data-mode": mode },
      el("td", {}, r.domain),
      el("td", { class: "mono" }, r.id),
      el("td", {}, badge(mode, "mode-" + mode)),
      el("td", {}, rule.algorithm || ""),
      el("td", {}, limitText(rule)),
      el("td", { class: "num" }, (rule.rollout_pct ?? 100) + "%"),
      el("td", {}, canary === null ? "every daemon" : badge(canary, "canary")),
      el("td", {}, rule.scope || "region"));
  });
  fill("rules-table", rows, 8, "no rules");
  if (!history.ok) {
    fill("history-table", [], 6, history.status === 501 ? "rules from a file: no versions here" : errorText(history));
    return;
  }
  const current = rules.body.version;
  fill("history-table", history.body.changes.map((c) => el("tr", { "data-version": c.version },
    el("td", { class: "num" }, c.version),
    el("td", { class: "nowrap" }, when(c.at)),
    el("td", {}, c.approved_by ? `${c.principal}, approved by ${c.approved_by}` : c.principal),
    el("td", {}, c.action),
    el("td", { class: "num" }, c.entries),
    el("td", {}, c.version === current ? "current" : writeButton("Roll back to " + c.version, "rollback",
      () => act("POST", "/v1/rules:rollback", { to_version: c.version }, `Roll back to version ${c.version}?`))),
  )), 6, "no versions");
}

function writeButton(label, kind, onclick) {
  const b = el("button", { class: "action", type: "button", "data-action": kind, onclick }, label);
  if (!CAN_WRITE) {
    b.disabled = true;
    b.title = "signed in with a read token";
  }
  return b;
}

async function act(method, path, body, question) {
  if (!window.confirm(question)) return;
  const res = await api(method, path, body);
  showBanner(res.ok ? null : errorText(res));
  refresh();
}

// RFC 3339 UTC as the tables show it: "2026-12-03 06:33:49".
function when(ts) {
  return typeof ts === "string" ? ts.replace("T", " ").replace(/\.\d+Z$|Z$/, "") : "";
}

function age(s) {
  if (s < 90) return Math.round(s) + " s ago";
  if (s < 5400) return Math.round(s / 60) + " min ago";
  return Math.round(s / 3600) + " h ago";
}

function renderDaemons(status) {
  if (!status.ok) {
    fill("daemons-table", [], 7, errorText(status));
    return;
  }
  const s = status.body;
  document.getElementById("daemons-version").textContent = "current version " + s.version;
  const rows = (s.daemons || []).map((d) => {
    const st = !d.current ? "behind" : d.age_s > 60 ? "stale" : "current";
    return el("tr", { "data-daemon": d.daemon_id, "data-version": d.version },
      el("td", { class: "mono" }, d.daemon_id),
      el("td", {}, d.region),
      el("td", { class: "num" }, d.version),
      el("td", {}, badge(st, "state-" + st)),
      el("td", {}, d.source),
      el("td", { title: d.last_seen }, age(d.age_s)),
      el("td", {}, d.last_error || ""));
  });
  if (rows.length === 0 && s.this_daemon) {
    const d = s.this_daemon;
    rows.push(el("tr", { "data-daemon": d.daemon_id, "data-version": d.version },
      el("td", { class: "mono" }, d.daemon_id), el("td", {}, ""), el("td", { class: "num" }, d.version),
      el("td", {}, badge("current", "state-current")), el("td", {}, "file"), el("td", {}, "now"), el("td", {}, "")));
  }
  fill("daemons-table", rows, 7, "no daemon has reported");
}

// A region's lag: the bounds its p50 and p99 fall under (its own region: in-region hops).
function lagCell(lag) {
  return lag.count === 0 ? "–" : `${bound(lag.p50_ms)} / ${bound(lag.p99_ms)}`;
}

function bound(ms) {
  return ms === null ? "> 5 s" : "≤ " + ms + " ms";
}

function renderDaemon(daemon) {
  if (!daemon.ok) {
    fill("breakers-table", [], 3, errorText(daemon));
    fill("gossip-table", [], 6, errorText(daemon));
    return;
  }
  const d = daemon.body;
  document.getElementById("daemon").textContent = `${d.daemon_id} · ${d.region} · ${d.store}`;
  document.getElementById("breakers-daemon").textContent = "on " + d.daemon_id;
  fill("breakers-table", d.breakers.map((b) => el("tr", { "data-shard": b.shard, "data-state": b.state },
    el("td", { class: "num" }, b.shard),
    el("td", {}, badge(b.state, "state-" + b.state)),
    el("td", { class: "num" }, b.opened_total))), 3, "no breaker (the memory store)");
  const g = d.gossip;
  if (!g) {
    document.getElementById("gossip-summary").textContent = "";
    fill("gossip-table", [], 6, "gossip is off on this daemon (no gossip.addr)");
    fill("gossip-counters", [], 2, "");
    return;
  }
  document.getElementById("gossip-summary").textContent =
    `${g.live_regions} regions, ${g.live_nodes} daemons live`;
  fill("gossip-table", g.regions.map((r) => el("tr", { "data-region": r.region },
    el("td", {}, r.region, r.this_region ? " (this)" : ""),
    el("td", { class: "mono" }, r.daemons.join(", ")),
    el("td", { class: "num" }, r.this_region ? "–" : r.remote_slots),
    el("td", { class: "num" }, r.this_region ? "–" : r.remote_keys),
    el("td", { "data-lag": r.region }, lagCell(r.lag)),
    el("td", { class: "mono" }, r.busy_keys.map((k) => `${k.key} (${k.figure})`).join(", ")))),
  6, "no region");
  const lag = g.lag;
  const lagText = lag.count === 0 ? "no packet merged yet"
    : `p50 ${bound(lag.p50_ms)}, p99 ${bound(lag.p99_ms)} (${lag.count} packets, all regions; per region in the table)`;
  const counters = [
    ["Lag, send to merge", lagText],
    ["Ships this region's figures", g.shipping ? "yes" : "no"],
    ["Region sender", g.region_sender ? "yes" : "no"],
    ["Busy figures shipped", g.shipped_total],
    ["Busy figures deferred (budget)", g.deferred_total],
    ["Figures merged from other regions", g.merged_total],
    ["Figures of this region tracked", g.local_figures],
  ];
  fill("gossip-counters", counters.map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", { class: "num" }, v))), 2, "");
}

function renderDecisions(decisions) {
  if (!decisions.ok) {
    const why = decisions.status === 404 ? "the decision log is off on this daemon" : errorText(decisions);
    fill("refused-table", [], 4, why);
    fill("shadow-table", [], 4, why);
    return;
  }
  const refused = new Map();
  const shadow = new Map();
  for (const d of decisions.body.decisions) {
    for (const r of d.rules || []) {
      if (r.outcome === "refused") {
        const k = r.id + "\u0000" + r.identity;
        const e = refused.get(k) || { rule: r.id, identity: r.identity, n: 0, last: 0 };
        e.n += 1;
        e.last = Math.max(e.last, d.ts);
        refused.set(k, e);
      } else if (r.outcome === "would_refuse") {
        const e = shadow.get(r.id) || { rule: r.id, n: 0, ids: new Map() };
        e.n += 1;
        e.ids.set(r.identity, (e.ids.get(r.identity) || 0) + 1);
        shadow.set(r.id, e);
      }
    }
  }
  const top = [...refused.values()].sort((a, b) => b.n - a.n).slice(0, 20);
  fill("refused-table", top.map((e) => el("tr", { "data-rule": e.rule },
    el("td", { class: "mono" }, e.rule),
    el("td", { class: "mono" }, e.identity),
    el("td", { class: "num" }, e.n),
    el("td", {}, new Date(e.last / 1000).toISOString().slice(11, 19)))), 4, "no refusal recorded");
  const rules = [...shadow.values()].sort((a, b) => b.n - a.n);
  fill("shadow-table", rules.map((e) => {
    const [topId, topN] = [...e.ids.entries()].sort((a, b) => b[1] - a[1])[0];
    return el("tr", { "data-rule": e.rule },
      el("td", { class: "mono" }, e.rule),
      el("td", { class: "num" }, e.n),
      el("td", { class: "num" }, e.ids.size),
      el("td", { class: "mono" }, `${topId} (${topN})`));
  }), 4, "no shadow would-refusal recorded");
}

function renderPending(pending) {
  const count = document.getElementById("pending-count");
  if (!pending.ok) {
    count.textContent = "";
    fill("pending-table", [], 7, pending.status === 501 ? "rules from a file: nothing is held here" : errorText(pending));
    return;
  }
  const items = pending.body.pending;
  count.textContent = items.length ? `(${items.length})` : "";
  fill("pending-table", items.map((p) => el("tr", { "data-pending": p.id },
    el("td", { class: "num" }, p.id),
    el("td", {}, p.principal),
    el("td", {}, p.action),
    el("td", {}, p.reasons.join("; ")),
    el("td", { class: "nowrap" }, when(p.created)),
    el("td", { class: "nowrap" }, when(p.expires)),
    el("td", { class: "nowrap" },
      writeButton("Approve", "approve", () => act("POST", `/v1/pending/${p.id}:approve`, undefined, `Approve change ${p.id}?`)),
      " ",
      writeButton("Reject", "reject", () => act("POST", `/v1/pending/${p.id}:reject`, undefined, `Reject change ${p.id}?`))))),
  7, "nothing waits for approval");
}

function showBanner(text) {
  const b = document.getElementById("banner");
  b.textContent = text || "";
  b.hidden = !text;
}

async function refresh() {
  try {
    const [rules, history, status, daemon, decisions, pending] = await Promise.all([
      api("GET", "/v1/rules"),
      api("GET", "/v1/rules:history?limit=8"),
      api("GET", "/v1/rules:status"),
      api("GET", "/v1/daemon"),
      api("GET", "/v1/decisions?since=15m&limit=1000"),
      api("GET", "/v1/pending"),
    ]);
    renderRules(rules, history);
    renderDaemons(status);
    renderDaemon(daemon);
    renderDecisions(decisions);
    renderPending(pending);
    document.getElementById("updated").textContent = "updated " + new Date().toISOString().slice(11, 19) + " UTC";
    document.body.setAttribute("data-refreshed", String(Date.now()));
  } catch (e) {
    showBanner("refresh failed: " + e.message);
  }
}

function show(view) {
  state.view = view;
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.view === view);
  for (const s of document.querySelectorAll("section.view")) s.hidden = s.id !== "view-" + view;
}

document.addEventListener("DOMContentLoaded", () => {
  for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => show(b.dataset.view));
  document.getElementById("read-only").hidden = CAN_WRITE;
  document.getElementById("sign-out").addEventListener("click", async () => {
    await fetch("/ui/logout", { method: "POST", credentials: "same-origin", headers: { "X-Sluice-CSRF": CSRF } });
    window.location.reload();
  });
  refresh();
  state.timer = window.setInterval(refresh, REFRESH_MS);
});
