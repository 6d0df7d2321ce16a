"use strict";
// The review page's script. Every text of the data goes into the page with textContent.
(function () {
  const D = JSON.parse(document.getElementById("review-data").textContent);
  const S = D.summary;
  const planned = S.planned;
  const $ = (id) => document.getElementById(id);
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = String(v);
      else e.setAttribute(k, String(v));
    }
    for (const c of kids) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
    return e;
  }
  const fmtInt = (n) => (n === null || n === undefined) ? "–" : Number(n).toLocaleString("en-US");
  const fmtPct = (x) => (100 * x).toFixed(1) + " %";
  // Plotly reads labels and hover texts as HTML-ish markup: a name from the store is escaped there
  const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  const fmtDate = (ts) => new Date(ts * 1000).toISOString().slice(0, 16).replace("T", " ");
  function fmtSpan(sec) {
    if (sec < 3600) return Math.round(sec / 60) + " min";
    if (sec < 86400 * 2) return (sec / 3600).toFixed(1) + " h";
    return (sec / 86400).toFixed(1) + " days";
  }

  // ---------------------------------------------------------------- header
  $("title").textContent = "memforest review: " + S.command;
  const what = planned ? "planned pairs" : "merged nodes";
  const paths = Object.entries(D.paths || {}).map(([k, v]) => k + " " + v).join(" · ");
  $("subtitle").textContent = paths;
  if (planned) {
    const b = $("planned-banner");
    b.hidden = false;
    b.textContent = "Dry run: nothing was merged. The pairs below are the first round's plan; later rounds " +
      "merge further until each tenant has lost what it was asked to.";
  }
  for (const n of D.notes || []) $("notes").append(el("li", {text: n}));

  // ---------------------------------------------------------------- summary
  const cards = [
    ["nodes_in", "nodes in", fmtInt(S.nodes_in), S.nodes_in],
    ["nodes_out", planned ? "nodes out (nothing merged yet)" : "nodes out", fmtInt(S.nodes_out), S.nodes_out],
    ["asked", "removals asked", fmtInt(S.asked), S.asked],
  ];
  if (S.ratio_asked !== null && S.ratio_asked !== undefined)
    cards.push(["ratio_asked", "ratio asked (--ratio)", fmtPct(S.ratio_asked), S.ratio_asked]);
  cards.push(["asked_share", "removals asked / nodes in (each tenant's rounded)", fmtPct(S.asked_share),
    S.asked_share]);
  if (!planned) {
    cards.push(["removed", "removed", fmtInt(S.removed), S.removed]);
    cards.push(["ratio_reached", "ratio reached", fmtPct(S.ratio_reached), S.ratio_reached]);
    cards.push(["shortfall", "shortfall (removals not made)", fmtInt(S.shortfall), S.shortfall, S.shortfall > 0]);
  }
  if (S.size_in && S.size_out) {  // store/size.py: the same encoding on both sides
    const si = S.size_in, so = S.size_out;
    const per = si.originals ? (so.rows / si.originals).toFixed(2) : "?";
    cards.push(["rows", `vector rows searched (${per} per memory)`, `${fmtInt(si.rows)} \u2192 ${fmtInt(so.rows)}`,
      so.rows]);
    const mb = (b) => (b / 1e6).toFixed(b < 1e7 ? 2 : 1) + " MB";
    cards.push(["bytes", `texts + vectors against the input, both ${so.encoding}`,
      `${mb(si.bytes)} \u2192 ${mb(so.bytes)} (${si.bytes ? fmtPct(so.bytes / si.bytes) : "?"})`, so.bytes]);
  } else {
    cards.push(["bytes", "vector rows and bytes", "not known for this run", ""]);
  }
  cards.push(["tenants", "tenants", fmtInt(S.tenants), S.tenants]);
  cards.push(["merged_nodes", planned ? "pairs planned (round 1)" : "merged nodes", fmtInt(S.merged_nodes), S.merged_nodes]);
  if (!planned) {
    cards.push(["merges", "merges", fmtInt(S.merges), S.merges]);
    if (S.rounds !== null && S.rounds !== undefined) cards.push(["rounds", "rounds", fmtInt(S.rounds), S.rounds]);
    if (S.condensed !== null && S.condensed !== undefined) {
      cards.push(["condensed", "merges condensed to the cap", fmtInt(S.condensed), S.condensed, S.condensed > 0]);
      cards.push(["condensed_tokens", "tokens dropped by condensing", fmtInt(S.condensed_tokens), S.condensed_tokens,
        S.condensed_tokens > 0]);
    }
    if (S.fallbacks !== null && S.fallbacks !== undefined)
      cards.push(["fallbacks", "merger texts replaced (fallbacks)", fmtInt(S.fallbacks), S.fallbacks, S.fallbacks > 0]);
  }
  const simUnknown = S.merged_nodes - S.similarity_known;
  if (S.flagged.low_similarity === null) {
    cards.push(["flag_low_similarity", "low similarity (< " + D.thresholds.low_similarity + "): similarities " +
      S.similarity_from, "unknown", "unknown", true]);
  } else {
    cards.push(["flag_low_similarity", "low similarity (< " + D.thresholds.low_similarity + ")" +
      (simUnknown > 0 ? "; " + fmtInt(simUnknown) + " unknown" : ""),
      fmtInt(S.flagged.low_similarity), S.flagged.low_similarity, S.flagged.low_similarity > 0 || simUnknown > 0]);
  }
  cards.push(["flag_long_span", "time span over " + D.thresholds.long_span_days + " days",
    fmtInt(S.flagged.long_span), S.flagged.long_span, S.flagged.long_span > 0]);
  cards.push(["flag_mixed_metadata", "mixed metadata values", fmtInt(S.flagged.mixed_metadata),
    S.flagged.mixed_metadata, S.flagged.mixed_metadata > 0]);
  for (const [key, label, shown, value, warn] of cards) {
    $("summary").append(el("div", {class: "card" + (warn ? " warn" : ""), id: "fig-" + key, "data-value": value},
      el("div", {class: "v", text: shown}), el("div", {class: "k", text: label})));
  }
  const bits = [];
  if (S.schedule) bits.push("schedule " + S.schedule);
  if (S.merger) bits.push("merger " + S.merger);
  if (S.embedder) bits.push("embedder " + S.embedder);
  if (S.max_node_tokens) bits.push("node cap " + S.max_node_tokens + " tokens");
  if (S.trees !== null && S.trees !== undefined) bits.push(fmtInt(S.trees) + " event trees");
  if (S.kept) bits.push(fmtInt(S.kept) + " nodes kept by the keep rule");
  bits.push("similarity: " + S.similarity_from);
  $("run-line").textContent = bits.join(" · ");
  const st = Object.entries(S.seconds || {});
  if (st.length) {
    for (const [k, v] of st) $("stages").append(el("tr", {"data-stage": k}, el("td", {text: k}),
      el("td", {class: "n", text: v.toFixed(2) + " s"})));
  } else $("stages").append(el("tr", {}, el("td", {class: "muted", text: "no timings (no run report)"})));
  const ms = S.merger_stats;
  if (ms) {
    for (const k of ["pairs", "calls", "accepted", "retries", "retry_accepted", "fallbacks", "merges_per_s"]) {
      if (ms[k] !== undefined) $("merger").append(el("tr", {}, el("td", {text: k.replace(/_/g, " ")}),
        el("td", {class: "n", text: typeof ms[k] === "number" ? (Number.isInteger(ms[k]) ? fmtInt(ms[k]) : ms[k].toFixed(2)) : String(ms[k])})));
    }
    for (const [k, v] of Object.entries(ms.fallback_reasons || {}))
      $("merger").append(el("tr", {}, el("td", {text: "fallback: " + k}), el("td", {class: "n", text: fmtInt(v)})));
  } else {
    $("merger").append(el("tr", {}, el("td", {class: "muted",
      text: S.merger && S.merger !== "extractive" ? "no merger counters in the report" :
        "the extractive merger: no model, no fallbacks"})));
  }

  // ---------------------------------------------------------------- plots
  const P = D.plots;
  const cfg = {displayModeBar: false, responsive: true};
  const lay = (title, x, y) => ({title: {text: title, font: {size: 14}}, margin: {l: 55, r: 15, t: 40, b: 45},
    xaxis: {title: {text: x}}, yaxis: {title: {text: y}}, bargap: 0.05, paper_bgcolor: "#fff", plot_bgcolor: "#fff"});
  const mids = (h) => h.counts.map((_, i) => (h.edges[i] + h.edges[i + 1]) / 2);
  const widths = (h) => h.counts.map((_, i) => h.edges[i + 1] - h.edges[i]);
  $("plots-note").textContent = "Over every " + (planned ? "planned pair" : "merged node") + " of the run (" +
    fmtInt(S.merged_nodes) + ") and every tenant (" + fmtInt(S.tenants) + "), not only those listed below.";
  Plotly.newPlot("plot-size", [{type: "bar", x: P.size.x, y: P.size.y, marker: {color: "#4c78a8"}}],
    Object.assign(lay("Sources per " + (planned ? "pair" : "merged node"), "sources", what),
      {xaxis: {title: {text: "sources"}, type: "category"}}), cfg);
  if (S.merged_nodes > 0 && S.similarity_known === 0) {
    $("plot-similarity").append(el("h3", {text: "Similarity of the " + what + ": unknown"}),
      el("p", {class: "plot-empty", text: "Similarities are " + S.similarity_from + ", so no merge is flagged for " +
        "low similarity: that is not a clean bill."}));
  } else {
    const thr = D.thresholds.low_similarity;
    Plotly.newPlot("plot-similarity", [{type: "bar", x: mids(P.similarity), y: P.similarity.counts,
      width: widths(P.similarity), marker: {color: mids(P.similarity).map((m) => m < thr ? "#e45756" : "#54a24b")}}],
      Object.assign(lay("Similarity of the " + what + " (" + fmtInt(S.flagged.low_similarity) + " under " + thr + ")",
        "cosine (" + S.similarity_from.split(" (")[0] + ")", what + " (log)"),
        {yaxis: {title: {text: what + " (log)"}, type: "log", dtick: 1},
          shapes: [{type: "line", x0: thr, x1: thr, yref: "paper", y0: 0, y1: 1, line: {dash: "dot", color: "#e45756"}}]}),
      cfg);
  }
  const sp = P.span_days;
  Plotly.newPlot("plot-span", [{type: "bar", x: mids(sp), y: sp.counts, width: widths(sp),
    marker: {color: mids(sp).map((m) => m > D.thresholds.long_span_days ? "#e45756" : "#72b7b2")}}],
    Object.assign(lay("Time span of the " + what, "days between the oldest and newest source", what),
      {xaxis: {title: {text: "days between the oldest and newest source (log)"}, type: "log"}}), cfg);
  const T = P.top_tenants;
  const tx = T.tenant.map(esc);
  const tr = [{type: "bar", name: planned ? "removals asked" : "asked", x: tx, y: T.asked, marker: {color: "#bab0ac"}}];
  if (!planned) tr.push({type: "bar", name: "removed", x: tx, y: T.removed, marker: {color: "#4c78a8"}});
  Plotly.newPlot("plot-tenants", tr, Object.assign(lay("Removals per tenant (the " + T.tenant.length +
    " with most; every tenant is in the table below)", "", "memories"), {barmode: "group",
    legend: {orientation: "h", y: 1.12}, xaxis: {tickangle: -40, automargin: true, type: "category"}}), cfg);

  // ---------------------------------------------------------------- tenants
  const TT = D.tenants;
  const nT = TT.tenant.length;
  // a dry run removed nothing yet: no removed, ratio reached or shortfall columns
  const cols = [["tenant", "tenant"], ["nodes_in", "in"], ["nodes_out", "out"], ["asked", "asked"],
    ["asked_share", "asked / in"], ...(planned ? [] : [["removed", "removed"], ["ratio", "ratio reached"],
      ["shortfall", "shortfall"]]), ["merged", planned ? "pairs" : "merged nodes"], ["flagged", "flagged"],
    ["shown", "listed below"]];
  if (planned) $("tenant-short").parentElement.hidden = true;
  let tSort = ["nodes_in", -1], tPage = 0, tIdx = [];
  const PER = 50;
  const thead = $("tenant-table").tHead;
  const hr = el("tr");
  for (const [k, label] of cols) {
    const th = el("th", {"data-col": k, text: label});
    th.addEventListener("click", () => { tSort = [k, tSort[0] === k ? -tSort[1] : (k === "tenant" ? 1 : -1)]; tPage = 0; tenants(); });
    hr.append(th);
  }
  thead.append(hr);
  function tenants() {
    const q = $("tenant-search").value.trim().toLowerCase();
    const onlyShort = $("tenant-short").checked;
    tIdx = [];
    for (let i = 0; i < nT; i++) {
      if (q && !TT.tenant[i].toLowerCase().includes(q)) continue;
      if (onlyShort && !TT.shortfall[i]) continue;
      tIdx.push(i);
    }
    const [k, dir] = tSort, col = TT[k];
    tIdx.sort((a, b) => (col[a] < col[b] ? -dir : col[a] > col[b] ? dir : a - b));
    const pages = Math.max(1, Math.ceil(tIdx.length / PER));
    tPage = Math.min(tPage, pages - 1);
    const body = $("tenant-table").tBodies[0];
    body.replaceChildren();
    for (const i of tIdx.slice(tPage * PER, tPage * PER + PER)) {
      const row = el("tr", {class: TT.shortfall[i] ? "short" : null, "data-tenant": TT.tenant[i]});
      for (const [c] of cols) {
        const v = TT[c][i];
        if (c === "tenant") {
          const a = el("a", {text: v, title: "show this tenant's " + what});
          a.addEventListener("click", () => { pickTenant(v); });
          row.append(el("td", {}, a));
        } else row.append(el("td", {"data-col": c, text: c === "ratio" || c === "asked_share" ? v.toFixed(3) : fmtInt(v)}));
      }
      body.append(row);
    }
    $("tenant-count").textContent = fmtInt(tIdx.length) + " of " + fmtInt(nT) + " tenants";
    $("tenant-page").textContent = "page " + (tPage + 1) + " of " + pages;
  }
  $("tenant-search").addEventListener("input", () => { tPage = 0; tenants(); });
  $("tenant-short").addEventListener("change", () => { tPage = 0; tenants(); });
  $("tenant-prev").addEventListener("click", () => { if (tPage > 0) { tPage--; tenants(); } });
  $("tenant-next").addEventListener("click", () => { if ((tPage + 1) * PER < tIdx.length) { tPage++; tenants(); } });
  tenants();

  // ---------------------------------------------------------------- merged nodes
  const N = D.nodes;
  $("nodes-title").textContent = planned ? "Planned pairs (first round)" : "Merged nodes";
  $("sample-note").textContent = "Listed: " + fmtInt(D.sample.shown) + " of " + fmtInt(D.sample.of) + " " + what +
    " (" + D.sample.rule + "). Flags: similarity under " + D.thresholds.low_similarity + "; sources more than " +
    D.thresholds.long_span_days + " days apart; source sentences the merged text does not hold (struck through); " +
    "a text-valued metadata key with different values among the sources.";
  const hay = N.map((n) => ((n.text || "") + "\n" + n.members.map((m) => m.text).join("\n")).toLowerCase());
  // the tenant filter: a name typed or picked from every tenant with merges (filled on first use)
  const rowOf = new Map(TT.tenant.map((t, i) => [t, i]));
  let listed = false;
  function tenantList() {
    if (listed) return;
    listed = true;
    const ix = [];
    for (let i = 0; i < nT; i++) if (TT.merged[i] > 0) ix.push(i);
    ix.sort((a, b) => (TT.tenant[a] < TT.tenant[b] ? -1 : TT.tenant[a] > TT.tenant[b] ? 1 : 0));
    const frag = document.createDocumentFragment();
    for (const i of ix) frag.append(el("option", {value: TT.tenant[i],
      label: fmtInt(TT.merged[i]) + " " + what + ", " + fmtInt(TT.shown[i]) + " listed"}));
    $("tenant-names").append(frag);
  }
  $("filter-tenant").addEventListener("focus", tenantList);
  function tenantFilter() {
    const v = $("filter-tenant").value;
    const exact = rowOf.has(v) ? v : rowOf.has(v.trim()) ? v.trim() : null;
    return {exact: exact, part: exact === null && v.trim() ? v.trim().toLowerCase() : null};
  }
  for (const [k, label] of Object.entries(D.flags)) $("filter-flag").append(el("option", {value: k, text: label}));
  let shownCount = 0, nIdx = [];
  const STEP = 25;
  function pickTenant(t) {
    $("filter-tenant").value = t;
    nodes();
    $("nodes-section").scrollIntoView();
  }
  function card(n) {
    const flagged = n.flags.length > 0;
    const head = el("div", {class: "head"},
      el("span", {class: "tenant", text: n.tenant}),
      el("span", {class: "muted", text: n.id || "(not merged yet)"}),
      el("span", {class: "badge sim", text: "similarity " + (n.sim === null ? "n/a" : n.sim.toFixed(3))}),
      el("span", {class: "badge", text: n.size + " sources" + (n.merges > 1 ? ", " + n.merges + " merges" : "")}),
      el("span", {class: "badge", text: "span " + fmtSpan(n.span)}));
    for (const f of n.flags) head.append(el("span", {class: "badge flag", "data-flag": f,
      text: D.flags[f] + (f === "mixed_metadata" && n.mixed.length ? ": " + n.mixed.join(", ") : "")}));
    const merged = el("div", {class: "merged"}, el("h4", {text: planned ? "planned" : "merged text"}),
      n.text === null ? el("p", {class: "planned", text: "Would merge in round 1; the merger writes the text when the run happens."})
        : el("p", {class: "merged-text", text: n.text}));
    const srcs = el("div", {class: "sources"}, el("h4", {text: "sources (oldest first)"}));
    for (const m of n.members) {
      const p = el("p", {class: "source-text"});
      let at = 0;
      for (const [a, b] of m.drop) {
        if (a > at) p.append(m.text.slice(at, a));
        p.append(el("mark", {class: "drop", title: "not in the merged text", text: m.text.slice(a, b)}));
        at = b;
      }
      if (at < m.text.length) p.append(m.text.slice(at));
      srcs.append(el("div", {class: "src"}, el("div", {class: "date", text: fmtDate(m.ts) + " · " + m.id +
        (m.meta ? " · " + m.meta : "")}), p));
    }
    return el("div", {class: "node" + (flagged ? " flagged" : ""), "data-tenant": n.tenant, "data-id": n.id || ""},
      head, el("div", {class: "cols"}, merged, srcs));
  }
  function nodes() {
    const t = tenantFilter(), q = $("filter-text").value.trim().toLowerCase(), f = $("filter-flag").value;
    const words = q ? q.split(/\s+/) : [];
    nIdx = [];
    for (let i = 0; i < N.length; i++) {
      const n = N[i];
      if (t.exact !== null && n.tenant !== t.exact) continue;
      if (t.part !== null && !n.tenant.toLowerCase().includes(t.part)) continue;
      if (f === "*" ? n.flags.length === 0 : f && !n.flags.includes(f)) continue;
      if (words.length && !words.every((w) => hay[i].includes(w))) continue;
      nIdx.push(i);
    }
    const s = $("sort").value;
    const key = {"sim-asc": (n) => n.sim === null ? 2 : n.sim, "sim-desc": (n) => n.sim === null ? 2 : -n.sim,
      "size-desc": (n) => -n.size, "size-asc": (n) => n.size, "span-desc": (n) => -n.span}[s];
    nIdx.sort((a, b) => (key(N[a]) - key(N[b])) || (a - b));
    shownCount = 0;
    $("nodes").replaceChildren();
    more();
  }
  function more() {
    const box = $("nodes");
    for (const i of nIdx.slice(shownCount, shownCount + STEP)) box.append(card(N[i]));
    shownCount = Math.min(nIdx.length, shownCount + STEP);
    $("node-count").textContent = fmtInt(nIdx.length) + " match; showing " + fmtInt(shownCount) + why();
    $("nodes-more").hidden = shownCount >= nIdx.length;
  }
  function why() {
    // what the tenant filter found: a tenant without merges, or one whose merges the bounded list left out
    const t = tenantFilter();
    if (t.exact === null) return t.part !== null && !nIdx.length ? ": no listed " + what.slice(0, -1) +
      " has a tenant whose name contains \u201c" + t.part + "\u201d" : "";
    const i = rowOf.get(t.exact), m = TT.merged[i], sh = TT.shown[i];
    if (m === 0) return ": tenant \u201c" + t.exact + "\u201d has no " + what + (planned ?
      " (nothing of it is planned in round 1)" : " (nothing of it was merged)");
    if (sh === 0) return ": none of the " + fmtInt(m) + " " + what + " of tenant \u201c" + t.exact + "\u201d is " +
      "listed on this page, a bounded sample (the note above); memforest review with a larger --per-tenant or " +
      "--max-nodes lists more";
    return " (tenant \u201c" + t.exact + "\u201d: " + fmtInt(sh) + " of its " + fmtInt(m) + " " + what + " listed)";
  }
  for (const id of ["filter-flag", "sort"]) $(id).addEventListener("change", nodes);
  $("filter-tenant").addEventListener("input", nodes);
  $("filter-text").addEventListener("input", nodes);
  $("nodes-more").addEventListener("click", more);
  nodes();
  document.body.setAttribute("data-ready", "1");
})();
