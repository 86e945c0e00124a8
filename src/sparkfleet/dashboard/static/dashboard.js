// The dashboard page: a hash router over four views, each drawn from the JSON API.
"use strict";

const POLL_MS = 3000;
const COLORS = ["#2563eb", "#d97706", "#059669", "#9333ea", "#dc2626", "#0891b2"];
const charts = {};  // canvas id -> Chart, destroyed before a redraw
let pollTimer = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function api(path, options) {
  const response = await fetch(path, { credentials: "same-origin", ...(options || {}) });
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

function showError(container, err) {
  container.replaceChildren(el("p", { class: "error" }, String(err.message || err)));
}

function fmtNum(value, digits = 1) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

function fmtAge(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.round(seconds);
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

function badge(text) {
  return el("span", { class: `badge ${String(text).replace(/[^a-z-]/gi, "")}` }, text);
}

function confirmAction(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

// Writes each bar's "passed/total" above it (a 0 % bar has no height to hover on).
const barCounts = {
  id: "barCounts",
  afterDatasetsDraw(chart) {
    const { ctx } = chart;
    ctx.save();
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#1d2330";
    ctx.textAlign = "center";
    chart.data.datasets.forEach((dataset, i) => {
      if (!dataset.counts || chart.getDatasetMeta(i).hidden) return;
      chart.getDatasetMeta(i).data.forEach((bar, j) => {
        if (dataset.data[j] !== null) ctx.fillText(dataset.counts[j], bar.x, bar.y - 4);
      });
    });
    ctx.restore();
  },
};

function drawChart(id, config) {
  if (charts[id]) charts[id].destroy();
  charts[id] = new Chart(document.getElementById(id), config);
  return charts[id];
}

function clearCharts(prefix) {
  for (const id of Object.keys(charts)) {
    if (id.startsWith(prefix)) { charts[id].destroy(); delete charts[id]; }
  }
}

// ---------------------------------------------------------------- deployments

// What the last action on each deployment said; kept here because polling redraws the cards.
const actionNotes = {};

function noteAction(name, text, cls) {
  actionNotes[name] = { text, cls };
  const node = document.getElementById(`action-${name}`);
  if (node) { node.textContent = text; node.className = cls; }
}

async function deploymentAction(name, verb, button) {
  const what = verb === "down"
    ? `Stop every rank of ${name}? This is what \`sparkfleet down ${name}\` does.`
    : `Restart ${name}? It is stopped, then brought up again from its recorded recipe and cluster ` +
      "(--env values given to the first `up` are not re-applied).";
  if (!(await confirmAction(what))) return;
  button.disabled = true;
  noteAction(name, verb === "down" ? "stopping…" : "restarting…", "muted");
  try {
    const result = await api(`/api/deployments/${encodeURIComponent(name)}/${verb}`, {
      method: "POST", headers: { "X-Sparkfleet-Action": "1" },
    });
    noteAction(name, verb === "down" ? `stopped: ${result.stopped.join(", ") || "nothing was running"}`
      : `up again at ${result.endpoint}`, "muted");
  } catch (err) {
    noteAction(name, `${verb} failed: ${err.message}`, "error");
  }
  loadDeployments();
}

function rankRow(rank) {
  return el("tr", { "data-rank": rank.rank },
    el("td", {}, rank.rank),
    el("td", {}, rank.node, el("div", { class: "muted" }, `${rank.host} · ${rank.runtime}`)),
    el("td", { class: "state" }, badge(rank.state), rank.detail ? el("div", { class: "muted" }, rank.detail) : null),
    el("td", { class: "uptime" }, fmtAge(rank.uptime)),
    el("td", { class: "health" }, rank.health === "-" ? "–" : badge(rank.health)),
    el("td", { style: "width:55%" }, el("pre", { class: "log" }, rank.log.join("\n") || " ")));
}

function deploymentCard(d) {
  const stopped = d.status === "stopped";
  const down = el("button", { class: "danger", "data-action": "down", disabled: stopped }, "Down");
  const restart = el("button", { "data-action": "restart" }, "Restart");
  down.addEventListener("click", () => deploymentAction(d.name, "down", down));
  restart.addEventListener("click", () => deploymentAction(d.name, "restart", restart));
  const note = actionNotes[d.name];
  return el("div", { class: "card deployment", "data-name": d.name },
    el("h3", {}, d.name, badge(d.status), el("span", { class: "muted" }, `${d.engine} · ${d.served_model}`),
      el("span", { class: "actions" }, down, restart)),
    el("div", { class: "muted" }, `endpoint ${d.endpoint} · recipe ${d.recipe} · cluster ${d.cluster}`),
    el("div", { id: `action-${d.name}`, class: note ? note.cls : "muted" }, note ? note.text : ""),
    d.events.length ? el("ul", { class: "events" }, d.events.slice(-3).map((e) => el("li", {},
      el("span", { class: "muted" }, `${new Date(e.time * 1000).toLocaleString()} ${e.kind}${e.node ? ` (${e.node})` : ""}: `),
      e.message))) : null,
    el("table", {},
      el("thead", {}, el("tr", {}, ["rank", "node", "state", "uptime", "health", "last log lines"].map((h) => el("th", {}, h)))),
      el("tbody", {}, d.ranks.map(rankRow))));
}

// Polls overlap while nodes are slow to answer: an answer older than the one drawn is dropped.
let deploymentsAsked = 0;
let deploymentsDrawn = 0;

let deploymentsInFlight = 0;

async function loadDeployments() {
  const box = document.getElementById("deployments");
  const asked = ++deploymentsAsked;
  deploymentsInFlight += 1;
  try {
    const list = await api("/api/deployments").finally(() => { deploymentsInFlight -= 1; });
    if (asked < deploymentsDrawn) return;
    deploymentsDrawn = asked;
    box.replaceChildren(...(list.length ? list.map(deploymentCard)
      : [el("p", { class: "muted" }, "No deployments recorded. `sparkfleet up RECIPE` starts one.")]));
    document.getElementById("refreshed").textContent = `refreshed ${new Date().toLocaleTimeString()}`;
    box.dataset.loaded = String(Date.now());
  } catch (err) {
    showError(box, err);
  }
}

// ---------------------------------------------------------------- pickers

function fillPicker(select, runs, label, chosen, allowNone) {
  const options = runs.map((r) => el("option", { value: r.id }, label(r)));
  if (allowNone) options.push(el("option", { value: "" }, "— none —"));
  select.replaceChildren(...options);
  select.value = chosen === undefined || chosen === null ? "" : String(chosen);
}

// Run A defaults to the second newest and B to the newest, so the page opens on a comparison.
function pickPair(aId, bId, runs, label, onChange) {
  const a = document.getElementById(aId);
  const b = document.getElementById(bId);
  fillPicker(a, runs, label, runs.length > 1 ? runs[1].id : runs[0]?.id, false);
  fillPicker(b, runs, label, runs.length > 1 ? runs[0].id : "", true);
  a.onchange = onChange;
  b.onchange = onChange;
}

// ---------------------------------------------------------------- bench

function benchLabel(r) {
  return `#${r.id} ${r.label || ""} ${r.model || ""} ${r.created_at}${r.status !== "complete" ? ` (${r.status})` : ""}`
    .replace(/\s+/g, " ");
}

function runName(run, which) {
  return `${which}: #${run.id}${run.label ? ` ${run.label}` : ""}`;
}

function overlay(canvasId, title, xLabel, runs, seriesName) {
  const xs = [...new Set(runs.flatMap(({ run }) => (run.series[seriesName] || []).map((p) => p.x)))].sort((p, q) => p - q);
  const datasets = runs.filter(({ run }) => run.series[seriesName]).map(({ run, which }, i) => {
    const byX = Object.fromEntries(run.series[seriesName].map((p) => [p.x, p]));
    return {
      label: runName(run, which),
      runId: run.id,
      data: xs.map((x) => (byX[x] ? byX[x].median : null)),
      spread: xs.map((x) => (byX[x] ? [byX[x].low, byX[x].high] : null)),
      borderColor: COLORS[i], backgroundColor: COLORS[i],
      borderDash: which === "B" ? [6, 4] : [],
      spanGaps: true, tension: 0, pointRadius: 4,
    };
  });
  drawChart(canvasId, {
    type: "line",
    data: { labels: xs, datasets },
    options: {
      animation: false, maintainAspectRatio: false,
      plugins: {
        title: { display: true, text: title },
        legend: { labels: { usePointStyle: true, pointStyle: "line", pointStyleWidth: 36 } },
        tooltip: { callbacks: { afterLabel: (ctx) => {
          const s = ctx.dataset.spread[ctx.dataIndex];
          return s ? `min–max ${fmtNum(s[0])}–${fmtNum(s[1])}` : "";
        } } },
      },
      scales: { x: { title: { display: true, text: xLabel } },
                y: { beginAtZero: true, title: { display: true, text: "tok/s" } } },
    },
  });
}

async function drawBench(kind) {
  const box = document.getElementById(`${kind}-charts`);
  const a = document.getElementById(`${kind}-a`).value;
  const b = document.getElementById(`${kind}-b`).value;
  clearCharts(`${kind}-chart`);
  if (!a) { box.replaceChildren(el("p", { class: "muted" }, `No ${kind} runs stored: \`sparkfleet bench ${kind}\` makes one.`)); return; }
  try {
    const runs = [{ run: await api(`/api/bench/runs/${a}`), which: "A" }];
    if (b && b !== a) runs.push({ run: await api(`/api/bench/runs/${b}`), which: "B" });
    const names = [...new Set(runs.flatMap(({ run }) => Object.keys(run.series)))];
    box.replaceChildren(...names.map((n) => el("div", { class: "chart-box" }, el("canvas", { id: `${kind}-chart-${n}` }))));
    for (const n of names) {
      overlay(`${kind}-chart-${n}`, kind === "decode" ? `decode: ${n} prompts` : "prefill", runs[0].run.x_label, runs, n);
    }
    box.dataset.drawn = `${a}|${b}`;
  } catch (err) {
    showError(box, err);
  }
}

function benchHistory(runs) {
  const put = (run, which) => el("button", { "data-put": which, onclick: () => {
    document.getElementById(`${run.kind}-${which.toLowerCase()}`).value = String(run.id);
    drawBench(run.kind);
    document.getElementById(`${run.kind}-charts`).scrollIntoView();
  } }, which);
  document.getElementById("bench-history").replaceChildren(runs.length ? el("table", { id: "bench-runs" },
    el("thead", {}, el("tr", {}, ["run", "kind", "label", "model", "engine", "deployment", "started (UTC)", "status", ""]
      .map((h) => el("th", {}, h)))),
    el("tbody", {}, runs.map((r) => el("tr", { "data-run": r.id },
      el("td", {}, `#${r.id}`), el("td", {}, r.kind), el("td", {}, r.label || ""), el("td", {}, r.model || ""),
      el("td", {}, r.engine || ""), el("td", {}, r.deployment || ""), el("td", {}, r.created_at),
      el("td", {}, r.status), el("td", {}, put(r, "A"), " ", put(r, "B")))))) : null);
}

async function loadBench() {
  try {
    const runs = await api("/api/bench/runs");
    benchHistory(runs);
    for (const kind of ["decode", "prefill"]) {
      const mine = runs.filter((r) => r.kind === kind);
      pickPair(`${kind}-a`, `${kind}-b`, mine, benchLabel, () => drawBench(kind));
      await drawBench(kind);
    }
  } catch (err) {
    showError(document.getElementById("decode-charts"), err);
  }
}

// ---------------------------------------------------------------- quality and needle

function evalLabel(r) {
  return `${r.label} · ${r.model} · ${r.passed}/${r.total} · ${r.created_utc}`;
}

async function drawQuality() {
  const a = document.getElementById("quality-a").value;
  const b = document.getElementById("quality-b").value;
  const summary = document.getElementById("quality-summary");
  const flips = document.getElementById("quality-flips");
  clearCharts("quality-chart");
  flips.replaceChildren();
  if (!a) { summary.replaceChildren(el("p", { class: "muted" }, "No quality runs stored: `sparkfleet eval quality` makes one.")); return; }
  try {
    let runs;
    let cmp = null;
    if (b && b !== a) {
      cmp = await api(`/api/evals/quality/compare?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`);
      runs = [{ run: cmp.a, which: "A" }, { run: cmp.b, which: "B" }];
    } else {
      runs = [{ run: await api(`/api/evals/quality/${encodeURIComponent(a)}`), which: "A" }];
    }
    summary.replaceChildren(...runs.map(({ run, which }) => el("div", { class: "run-summary", "data-which": which },
      `${which}: ${run.label} (${run.id}) — ${run.model}, ${run.api} API: ${run.passed}/${run.total} passed`)));
    const cats = [...new Set(runs.flatMap(({ run }) => run.categories.map((c) => c.category)))];
    drawChart("quality-chart", {
      type: "bar",
      plugins: [barCounts],
      data: {
        labels: cats,
        datasets: runs.map(({ run, which }, i) => {
          const by = Object.fromEntries(run.categories.map((c) => [c.category, c]));
          return {
            label: `${which}: ${run.label}`, runId: run.id, backgroundColor: COLORS[i],
            data: cats.map((c) => (by[c] ? 100 * by[c].rate : null)),
            counts: cats.map((c) => (by[c] ? `${by[c].passed}/${by[c].total}` : "not run")),
          };
        }),
      },
      options: {
        animation: false, maintainAspectRatio: false,
        plugins: { title: { display: true, text: "pass rate per category (%)" },
                   tooltip: { callbacks: { afterLabel: (ctx) => ctx.dataset.counts[ctx.dataIndex] } } },
        scales: { y: { beginAtZero: true, max: 110, title: { display: true, text: "% passed" },
                       ticks: { callback: (v) => (v <= 100 ? v : "") } } },
      },
    });
    if (cmp) {
      flips.replaceChildren(
        el("p", { class: "verdict" }, cmp.verdict),
        el("p", { class: "muted" }, `${cmp.paired} tasks paired, ${cmp.flips.length} flipped`),
        cmp.flips.length ? el("table", { id: "flips" },
          el("thead", {}, el("tr", {}, ["task", "category", "flip", "why the failing run failed"].map((h) => el("th", {}, h)))),
          el("tbody", {}, cmp.flips.map((f) => el("tr", { "data-task": f.id },
            el("td", {}, f.id), el("td", {}, f.category),
            el("td", { class: `flip-${f.direction}` }, f.direction === "broke" ? "A pass → B fail" : "A fail → B pass"),
            el("td", {}, f.why))))) : null);
    }
    summary.dataset.drawn = `${a}|${b}`;
  } catch (err) {
    showError(summary, err);
  }
}

async function drawNeedle() {
  const box = document.getElementById("needle");
  const id = document.getElementById("needle-run").value;
  if (!id) { box.replaceChildren(el("p", { class: "muted" }, "No needle runs stored: `sparkfleet eval needle` makes one.")); return; }
  try {
    const run = await api(`/api/evals/needle/${encodeURIComponent(id)}`);
    const head = el("tr", {}, el("th", {}, "depth \\ tokens"), run.lengths.map((n) => el("th", {}, n)));
    const rows = run.grid.map((row) => el("tr", { "data-depth": row.depth }, el("th", {}, `${row.depth}%`),
      row.cells.map((c, j) => el("td", {
        class: c === null ? "none" : c.passed ? "pass" : "fail",
        "data-length": run.lengths[j],
        title: c === null ? "not run" : `expected ${c.expected}; answered ${c.answer}`,
      }, c === null ? "–" : c.passed ? "pass" : "fail"))));
    box.replaceChildren(
      el("p", {}, `${run.label} — ${run.model}: ${run.passed}/${run.total} passed; effective length `,
        el("strong", {}, run.effective_length ?? "none"),
        run.skipped_lengths.length ? ` (skipped, over the context: ${run.skipped_lengths.join(", ")})` : ""),
      el("table", { class: "heatmap", id: "needle-heatmap" }, el("thead", {}, head), el("tbody", {}, rows)));
  } catch (err) {
    showError(box, err);
  }
}

async function loadEvals() {
  try {
    const quality = await api("/api/evals/runs?kind=quality");
    pickPair("quality-a", "quality-b", quality, evalLabel, drawQuality);
    await drawQuality();
    const needle = await api("/api/evals/runs?kind=needle");
    const picker = document.getElementById("needle-run");
    fillPicker(picker, needle, evalLabel, needle[0]?.id, false);
    picker.onchange = drawNeedle;
    await drawNeedle();
  } catch (err) {
    showError(document.getElementById("quality-summary"), err);
  }
}

// ---------------------------------------------------------------- doctor

function fmtRate(mbps, gbit) {
  return mbps == null ? "n/a" : gbit ? (mbps / 1000).toFixed(2) : mbps.toFixed(1);
}

// The last `doctor --fabric` matrix: row sends to column, each cell coloured by its share of the
// fleet's median (green at the median, red at or below the failing fraction).
async function drawFabric() {
  const box = document.getElementById("fabric");
  const m = await api("/api/doctor/fabric");
  if (!m) { box.replaceChildren(el("p", { class: "muted" }, "No fabric run recorded: `sparkfleet doctor --fabric` makes one.")); return; }
  const gbit = m.median_mbps != null && m.median_mbps >= 1000;
  const at = {};
  for (const c of m.cells) at[`${c.src}\u0000${c.dst}`] = c;
  const cell = (src, dst) => {
    if (src === dst) return el("td", { class: "muted" }, "–");
    const c = at[`${src}\u0000${dst}`];
    if (!c) return el("td", { class: "muted", "data-src": src, "data-dst": dst }, "n/a");
    const share = c.share == null ? 0 : Math.max(0, Math.min(1, (c.share - m.fraction) / (1 - m.fraction)));
    return el("td", { class: c.below ? "heat below" : "heat", "data-src": src, "data-dst": dst,
                      style: `background: hsl(${Math.round(120 * share)}, 60%, 82%)`,
                      title: c.share == null ? "" : `${(100 * c.share).toFixed(0)} % of the median` }, fmtRate(c.mbps, gbit));
  };
  box.replaceChildren(el("div", { class: "card fabric" },
    el("h3", {}, "Fabric", badge(m.failed.length ? "fail" : "pass"), el("span", { class: "muted" },
      `bandwidth, ${gbit ? "Gbit/s" : "Mbit/s"}, row sends to column · median ${fmtRate(m.median_mbps, gbit)} · ` +
      `red below ${m.fraction} × the median · ${fmtAge(m.age_s)} ago`)),
    el("table", { class: "fabric-matrix" },
      el("thead", {}, el("tr", {}, el("th", {}, ""), ...m.nodes.map((n) => el("th", {}, n)))),
      el("tbody", {}, m.nodes.map((src) => el("tr", { "data-src": src }, el("th", {}, src), ...m.nodes.map((dst) => cell(src, dst)))))),
    ...rdmaMatrix(m)));
}

// ib_write_bw's matrix (row writes to column, one direction per pair) when the run measured RDMA.
function rdmaMatrix(m) {
  if (!m.rdma_cells || !m.rdma_cells.length) return [];
  const at = {};
  for (const c of m.rdma_cells) at[`${c.src}\u0000${c.dst}`] = c;
  const cell = (src, dst) => {
    if (src === dst) return el("td", { class: "muted" }, "–");
    const c = at[`${src}\u0000${dst}`];
    if (!c) return el("td", { class: "muted" }, "");
    if (c.gbps == null) return el("td", { class: "heat below", "data-src": src, "data-dst": dst }, "n/a");
    const share = c.share == null ? 0 : Math.max(0, Math.min(1, (c.share - m.fraction) / (1 - m.fraction)));
    return el("td", { class: c.below ? "heat below" : "heat", "data-src": src, "data-dst": dst,
                      style: `background: hsl(${c.below ? 0 : Math.round(120 * share)}, 60%, 82%)`,
                      title: `expected ${c.expected_gbps == null ? "?" : c.expected_gbps.toFixed(1)} Gbit/s` +
                             (c.lat_us == null ? "" : `, latency ${c.lat_us} µs`) }, c.gbps.toFixed(2));
  };
  return [el("p", { class: "muted" }, `RDMA write, Gbit/s (ib_write_bw), row writes to column · median ${m.rdma_median_gbps == null ? "n/a" : m.rdma_median_gbps.toFixed(2)}`),
    el("table", { class: "rdma-matrix" },
      el("thead", {}, el("tr", {}, el("th", {}, ""), ...m.nodes.map((n) => el("th", {}, n)))),
      el("tbody", {}, m.nodes.map((src) => el("tr", { "data-src": src }, el("th", {}, src), ...m.nodes.map((dst) => cell(src, dst))))))];
}

async function loadDoctor() {
  const box = document.getElementById("doctor");
  try {
    await drawFabric();
    const nodes = await api("/api/doctor");
    if (!nodes.length) { box.replaceChildren(el("p", { class: "muted" }, "No doctor runs recorded: `sparkfleet doctor` makes one.")); return; }
    box.replaceChildren(...nodes.map((n) => el("div", { class: "card doctor-node", "data-node": n.node },
      el("h3", {}, n.node, badge(n.counts.fail ? "fail" : n.counts.warn ? "warn" : "pass"),
        el("span", { class: "muted" },
          `${n.counts.fail} failed, ${n.counts.warn} warnings, ${n.counts.pass} passed · ${fmtAge(n.age_s)} ago` +
          (n.recipe ? ` · for ${n.recipe}` : ""))),
      el("table", {},
        el("thead", {}, el("tr", {}, ["status", "check", "evidence", "fix"].map((h) => el("th", {}, h)))),
        el("tbody", {}, n.checks.map((c) => el("tr", { "data-check": c.id },
          el("td", {}, badge(c.status)), el("td", {}, c.id), el("td", {}, c.evidence),
          el("td", { class: "muted" }, c.status === "pass" ? "" : c.fix))))))));
  } catch (err) {
    showError(box, err);
  }
}

// ---------------------------------------------------------------- A/B experiments

async function drawExperiment(id) {
  const box = document.getElementById("ab-summary");
  clearCharts("ab-");
  const report = await api(`/api/experiments/${id}`);
  const a = report.variants ? report.variants.a : "A";
  const b = report.variants ? report.variants.b : "B";
  box.replaceChildren(
    el("p", {}, `${report.recipe || ""} · ${report.rounds || 0} of ${report.rounds_planned || 0} round(s) · ${report.status}`
      + (report.note ? ` · ${report.note}` : "")),
    el("table", { id: "ab-metrics" },
      el("thead", {}, el("tr", {}, ["metric", a, b, "B vs A", "95% interval", "verdict"].map((h) => el("th", {}, h)))),
      el("tbody", {}, (report.metrics || []).map((m) => el("tr", { "data-metric": m.name },
        el("td", {}, `${m.name} (${m.unit})`), el("td", {}, fmtNum(m.a.value)), el("td", {}, fmtNum(m.b.value)),
        el("td", {}, `${m.diff_pct > 0 ? "+" : ""}${fmtNum(m.diff_pct)} %`),
        el("td", {}, m.interval_pct ? `${fmtNum(m.interval_pct[0])} … ${fmtNum(m.interval_pct[1])} %` : "—"),
        el("td", {}, badge(m.verdict ? "pass" : "warn"), " ", m.verdict_text))))),
    report.quality ? el("p", {}, `quality: ${a} ${report.quality.a_passed}/${report.quality.paired}, ${b} `
      + `${report.quality.b_passed}/${report.quality.paired}, McNemar p ${fmtNum(report.quality.mcnemar_p, 3)}: `
      + report.quality.verdict_text) : "",
    el("p", { class: "muted" }, report.rule || ""));
  const charts = document.getElementById("ab-charts");
  charts.replaceChildren();
  (report.metrics || []).forEach((m, i) => {
    const canvas = el("canvas", { id: `ab-chart-${i}` });
    charts.append(el("div", { class: "chart-box" }, canvas));
    const rounds = m.a.rounds.map((_, r) => `round ${r + 1}`);
    drawChart(`ab-chart-${i}`, { type: "bar", data: { labels: rounds, datasets: [
      { label: a, data: m.a.rounds }, { label: b, data: m.b.rounds }] },
      options: { plugins: { title: { display: true, text: `${m.name} (${m.unit}): ${m.verdict_text}` } } } });
  });
}

async function loadExperiments() {
  const select = document.getElementById("ab-run");
  try {
    const runs = await api("/api/experiments");
    if (!runs.length) {
      document.getElementById("ab-summary").replaceChildren(el("p", { class: "muted" }, "No experiments stored: `sparkfleet ab` makes one."));
      return;
    }
    select.replaceChildren(...runs.map((r) => el("option", { value: String(r.id) },
      `#${r.id} ${r.variants[0]} vs ${r.variants[1]} (${r.status})`)));
    select.onchange = () => drawExperiment(select.value);
    await drawExperiment(select.value || runs[0].id);
  } catch (err) {
    showError(document.getElementById("ab-summary"), err);
  }
}

// ---------------------------------------------------------------- watch

function watchChart(id, title, times, nodes, key, scale) {
  const labels = times.map((t) => new Date(t * 1000).toLocaleTimeString());
  const datasets = Object.entries(nodes)
    .filter(([, series]) => series[key].some((v) => v !== null))
    .map(([node, series]) => ({ label: node, data: series[key].map((v) => (v === null ? null : v * scale)),
                                spanGaps: false, pointRadius: 0 }));
  drawChart(id, { type: "line", data: { labels, datasets },
    options: { animation: false, plugins: { title: { display: true, text: title } } } });
}

async function drawWatch(name) {
  const box = document.getElementById("watch-events");
  try {
    const w = await api(`/api/watch/${encodeURIComponent(name)}`);
    watchChart("watch-mem", "MemAvailable per node (GiB)", w.times, w.nodes, "mem_available", 1 / 2 ** 30);
    watchChart("watch-kv", "KV-cache usage (%)", w.times, w.nodes, "kv_usage", 100);
    watchChart("watch-running", "running requests", w.times, w.nodes, "running", 1);
    box.replaceChildren(w.events.length ? el("table", { class: "events" },
      el("thead", {}, el("tr", {}, ["time", "event", "node", "message"].map((h) => el("th", {}, h)))),
      el("tbody", {}, w.events.map((e) => el("tr", { "data-kind": e.kind },
        el("td", {}, new Date(e.time * 1000).toLocaleString()), el("td", {}, badge(e.kind)),
        el("td", {}, e.node || "–"), el("td", {}, el("pre", { class: "log" }, e.message))))))
      : el("p", { class: "muted" }, "No events."));
  } catch (err) {
    showError(box, err);
  }
}

async function loadWatch() {
  const select = document.getElementById("watch-name");
  try {
    const names = await api("/api/watch");
    if (!names.length) {
      document.getElementById("watch-events").replaceChildren(
        el("p", { class: "muted" }, "Nothing watched yet. `sparkfleet watch NAME` records a deployment's series."));
      return;
    }
    const chosen = names.includes(select.value) ? select.value : names[0];
    select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    select.value = chosen;
    select.onchange = () => drawWatch(select.value);
    drawWatch(chosen);
  } catch (err) {
    showError(document.getElementById("watch-events"), err);
  }
}

// ---------------------------------------------------------------- gateway

function simpleTable(id, heads, rows, empty) {
  document.getElementById(id).replaceChildren(rows.length ? el("table", { class: "events" },
    el("thead", {}, el("tr", {}, heads.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) => el("td", {}, c === null || c === undefined ? "–" : String(c)))))))
    : el("p", { class: "muted" }, empty));
}

async function loadGateway() {
  try {
    const g = await api("/api/gateway");
    simpleTable("gateway-routes", ["model", "replicas", "output cap", "loop abort", "request fields"],
      g.routes.map((r) => [r.model, r.replicas.map((p) => `${p.name} (${p.url})`).join(", ") || "none ready",
        r.max_new_tokens || "none", r.loop_abort ? "on" : "off", JSON.stringify(r.fields)]),
      "No ready deployment: `sparkfleet up` one, or route a URL in gateway.toml.");
    simpleTable("gateway-keys", ["name", "id", "rpm", "tpm", "state"],
      g.keys.map((k) => [k.name, k.id, k.rpm, k.tpm, k.state]), "No keys: `sparkfleet gateway key create NAME`.");
    simpleTable("gateway-requests", ["time", "key", "model", "deployment", "status", "tokens", "TTFT (ms)", "e2e (ms)",
      "held (ms)", "finish", "capped", "loop"], g.requests.map((r) => [new Date(r.time * 1000).toLocaleString(),
      r.key_name, r.model, r.deployment, r.status, `${r.prompt_tokens || 0}+${r.completion_tokens || 0}`,
      r.ttft === null ? null : fmtNum(r.ttft * 1000, 0), r.e2e === null ? null : fmtNum(r.e2e * 1000, 0),
      r.held ? fmtNum(r.held * 1000, 0) : "", r.finish_reason, r.clamped ? "yes" : "", r.loop_aborted ? "stopped" : ""]),
      "No requests logged yet.");
    simpleTable("gateway-changes", ["time", "deployment", "event", "what happened"], g.changes.map((c) => [
      new Date(c.time * 1000).toLocaleString(), c.name, c.kind, c.message]),
      "No change behind the gateway yet (down, rollback, ab, switch and watch's restarts drain and hold here).");
  } catch (err) {
    showError(document.getElementById("gateway-routes"), err);
  }
}

// ---------------------------------------------------------------- router

const PAGES = { deployments: loadDeployments, bench: loadBench, evals: loadEvals, ab: loadExperiments, watch: loadWatch, gateway: loadGateway, doctor: loadDoctor };

function route() {
  const page = (location.hash.slice(1) || "deployments").split("?")[0];
  const name = PAGES[page] ? page : "deployments";
  for (const section of document.querySelectorAll(".page")) section.classList.toggle("shown", section.id === `page-${name}`);
  for (const link of document.querySelectorAll("nav a")) link.classList.toggle("active", link.dataset.page === name);
  clearInterval(pollTimer);
  pollTimer = null;
  PAGES[name]();
  // Only the deployments page is live; the others change when a run is stored, not every second.
  // A poll waits for the previous one: unreachable nodes must not pile requests up on the server.
  if (name === "deployments") pollTimer = setInterval(() => { if (!deploymentsInFlight) loadDeployments(); }, POLL_MS);
}

window.addEventListener("hashchange", route);
route();
