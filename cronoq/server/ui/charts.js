// The pool cards' charts: the leader's history of each pool (GET /v1/history),
// drawn with uPlot (uplot.min.js, loaded by index.html before the modules: it
// defines window.uPlot). On every hello (connect and reconnect) the page loads
// the history of the chosen range, so the charts hold what happened before it
// opened; then each snapshot event brings the samples taken since the last
// point (GET /v1/history?range_s=...), appended, the page's series bounded to
// the range shown and to what the server keeps (kept_s).

import { app, api, $, on, CLASSES } from "./app.js";

const RANGES = {"300": 300, "3600": 3600, "all": null};   // the switch's choices, seconds (null: all kept)
const POINTS = 720;                 // points per series asked for a whole range
const CHART_HEIGHT = 150;

const state = {
  range: "all",
  interval: 1, kept: 3600,          // from the server's answer
  pools: new Map(),                 // pool -> {t: [seconds], series name -> [values]}
  charts: new Map(),                // pool -> {card, charts: [{kind, plot, holder}]}
  loading: null,                    // the load under way (a whole range)
  fetching: false,                  // an incremental read under way
  serverNow: 0,                     // the latest server time seen, seconds
  enabled: false,                   // the token has the metrics role
};

// A colour token of app.css as the page resolves it now (it follows the theme).
function token(name) {
  const probe = document.createElement("i");
  probe.style.color = `var(${name})`;
  document.body.append(probe);
  const colour = getComputedStyle(probe).color;
  probe.remove();
  return colour;
}

// The series each chart draws: [label, key into the pool's data, options].
function chartKinds() {
  const [c1, c2, c3, c4] = [1, 2, 3, 4].map((i) => token(`--series-${i}`));
  const bad = token("--bad");
  const byClass = [c3, c2, c1, c4];   // critical, high, normal, low
  return [
    {kind: "capacity", title: "slots and cost", series: [
      ["capacity", "capacity", {stroke: c1, width: 2}],
      ["desired", "desired", {stroke: c2, dash: [6, 4]}],
      ["busy", "busy", {stroke: c3}],
      ["cost", "cost", {stroke: c4, scale: "cost"}],
    ], axes: [{}, {scale: "cost", side: 1, grid: {show: false}}]},
    {kind: "pending", title: "pending by class", series: CLASSES.map((c, i) =>
      [c, "pending_" + c, {stroke: byClass[i]}])},
    {kind: "throughput", title: "per second", series: [
      ["succeeded/s", "throughput_per_s", {stroke: c1, width: 2}],
      ["failed/s", "failures_per_s", {stroke: bad}],
    ]},
    {kind: "waits", title: "waits (s)", series: CLASSES.flatMap((c, i) => [
      [c + " p50", "wait_p50_s_" + c, {stroke: byClass[i]}],
      [c + " p99", "wait_p99_s_" + c, {stroke: byClass[i], dash: [4, 3]}],
    ])},
  ];
}

// "2", "0.25", "1.234": a number as the legend shows it.
function formatValue(v) {
  if (v == null || Number.isNaN(v)) return "–";
  if (Number.isInteger(v)) return String(v);
  return String(Number(v.toFixed(Math.abs(v) >= 100 ? 1 : 3)));
}

// ------------------------------------------------------------------ the data

function emptyPool() {
  const data = {t: []};
  for (const kind of chartKinds()) for (const [, key] of kind.series) data[key] = [];
  return data;
}

// One pool's answer of /v1/history as the page's columns (times in seconds).
function columns(pool) {
  const data = {t: pool.t_unix_ms.map((ms) => ms / 1000)};
  for (const name of ["capacity", "desired", "busy", "held", "pending", "throughput_per_s", "failures_per_s",
                      "wait_p50_s", "wait_p99_s", "cost"]) data[name] = pool[name];
  for (const c of CLASSES) {
    data["pending_" + c] = pool.pending_by_class[c];
    data["wait_p50_s_" + c] = pool.wait_p50_s_by_class[c];
    data["wait_p99_s_" + c] = pool.wait_p99_s_by_class[c];
  }
  return data;
}

function rangeSeconds() {
  return RANGES[state.range] ?? state.kept;
}

// Drop what is older than the range shown (and than what the server keeps).
function bound(data) {
  const since = state.serverNow - Math.min(rangeSeconds(), state.kept);
  let drop = 0;
  while (drop < data.t.length && data.t[drop] < since) drop++;
  if (drop) for (const key of Object.keys(data)) data[key].splice(0, drop);
}

async function load() {
  const range = RANGES[state.range];
  const query = new URLSearchParams({points: String(POINTS)});
  if (range != null) query.set("range_s", String(range));
  const answer = await api("/v1/history?" + query);
  state.interval = answer.interval_s;
  state.kept = answer.kept_s;
  state.serverNow = Number(BigInt(answer.at_unix_ns) / 1000000n) / 1000;
  state.pools = new Map(answer.pools.map((pool) => [pool.name, columns(pool)]));
}

// The samples taken since the last point each pool holds, appended.
async function appendNew() {
  let last = Infinity;
  for (const data of state.pools.values()) last = Math.min(last, data.t.length ? data.t[data.t.length - 1] : -Infinity);
  const since = last === Infinity || last === -Infinity ? rangeSeconds() : state.serverNow - last + 2 * state.interval;
  const query = new URLSearchParams({points: "100000", range_s: String(Math.max(0, Math.min(since, state.kept)))});
  const answer = await api("/v1/history?" + query);
  state.serverNow = Number(BigInt(answer.at_unix_ns) / 1000000n) / 1000;
  for (const pool of answer.pools) {
    let data = state.pools.get(pool.name);
    if (!data) state.pools.set(pool.name, data = emptyPool());
    const fresh = columns(pool);
    const end = data.t.length ? data.t[data.t.length - 1] : -Infinity;
    let from = 0;
    while (from < fresh.t.length && fresh.t[from] <= end) from++;
    for (const key of Object.keys(data)) if (fresh[key]) data[key].push(...fresh[key].slice(from));
    bound(data);
  }
}

async function reload() {
  const loading = state.loading = load().catch((err) => {
    if (state.loading === loading) console.warn("the history could not be read", err);
  });
  await loading;
  if (state.loading === loading) {
    state.loading = null;
    draw();
  }
}

// ------------------------------------------------------------------ the charts

// An axis tick: UTC, as the rest of the page; seconds only when the span drawn
// is short (the samples kept may cover less than the range chosen).
function timeLabel(t, span) {
  const text = new Date(t * 1000).toISOString();
  return span > 900 ? text.slice(11, 16) : text.slice(11, 19);
}

function chartWidth(card) {
  return Math.max(200, card.clientWidth - 24);
}

function makeChart(card, kind, holder) {
  const series = [{value: (u, v) => v == null ? "–" : new Date(v * 1000).toISOString().slice(11, 19) + "Z"},
                  ...kind.series.map(([label, , options]) => ({label, value: (u, v) => formatValue(v), ...options,
                                                               points: {show: false}}))];
  const scales = {x: {time: true}};
  if (kind.series.some(([, , options]) => options.scale === "cost")) scales.cost = {auto: true};
  const ink = {stroke: token("--muted"), grid: {stroke: token("--border"), width: 1},
               ticks: {stroke: token("--border"), width: 1}};
  const axes = [{...ink, space: 70, values: (u, splits) => splits.map((t) => timeLabel(t, u.scales.x.max - u.scales.x.min))}, {...ink, size: 44},
                ...(kind.axes || []).slice(1).map((axis) => ({...ink, size: 50, ...axis}))];
  const opts = {
    width: chartWidth(card), height: CHART_HEIGHT, series, scales, axes,
    legend: {live: true},
    cursor: {drag: {x: false, y: false}},
    hooks: {
      setCursor: [(u) => showCursor(u, holder)],
      setScale: [(u, key) => {
        if (key === "x") {
          holder.dataset.xMin = String(u.scales.x.min);
          holder.dataset.xMax = String(u.scales.x.max);
        }
      }],
    },
  };
  return new window.uPlot(opts, [[], ...kind.series.map(() => [])], holder);
}

// The hovered point, for a reader of the page (and its tests): its time and values.
function showCursor(u, holder) {
  const idx = u.cursor.idx;
  if (idx == null) {
    delete holder.dataset.cursorT;
    delete holder.dataset.cursorValues;
    return;
  }
  holder.dataset.cursorT = String(Math.round(u.data[0][idx] * 1000));
  const values = {};
  u.series.slice(1).forEach((s, i) => { values[s.label] = u.data[i + 1][idx]; });
  holder.dataset.cursorValues = JSON.stringify(values);
}

function ensureCharts(card, pool) {
  let entry = state.charts.get(pool);
  if (entry && entry.card === card && card.contains(entry.charts[0].holder)) return entry;
  if (entry) forget(pool);
  const box = document.createElement("div");
  box.className = "history-charts";
  const charts = chartKinds().map((kind) => {
    const figure = document.createElement("figure");
    figure.className = "history-chart";
    const caption = document.createElement("figcaption");
    caption.textContent = kind.title;
    const holder = document.createElement("div");
    holder.className = "history-plot";
    holder.dataset.chart = kind.kind;
    holder.dataset.pool = pool;
    figure.append(caption, holder);
    box.append(figure);
    return {kind, holder};
  });
  card.append(box);
  for (const chart of charts) {
    chart.plot = makeChart(card, chart.kind, chart.holder);
    chart.holder.dataset.colors = JSON.stringify(Object.fromEntries(
      chart.kind.series.map(([label, , options]) => [label, options.stroke])));
  }
  entry = {card, charts, width: chartWidth(card)};
  state.charts.set(pool, entry);
  return entry;
}

function forget(pool) {
  const entry = state.charts.get(pool);
  for (const chart of entry.charts) chart.plot.destroy();
  entry.card.querySelector(".history-charts")?.remove();
  state.charts.delete(pool);
}

function draw() {
  if (!state.enabled || app.page !== "overview" || !window.uPlot) return;
  const max = state.serverNow;
  for (const card of document.querySelectorAll("#pools article.pool")) {
    const pool = card.dataset.pool;
    const data = state.pools.get(pool);
    if (!data || !card.clientWidth) continue;
    // 5 min and 1 h are fixed windows ending now; "all kept" spans what the pool's history holds.
    const min = state.range === "all" && data.t.length ? Math.min(data.t[0], max - 1) : max - rangeSeconds();
    const entry = ensureCharts(card, pool);
    const width = chartWidth(card);
    for (const {kind, plot, holder} of entry.charts) {
      if (width !== entry.width) plot.setSize({width, height: CHART_HEIGHT});
      plot.setData([data.t, ...kind.series.map(([, key]) => data[key])], true);
      plot.setScale("x", {min, max});
      // Away from the cursor, the legend shows the latest values.
      if (!holder.dataset.cursorT && data.t.length) plot.setLegend({idx: data.t.length - 1});
      holder.dataset.points = String(data.t.length);
      holder.dataset.firstT = data.t.length ? String(Math.round(data.t[0] * 1000)) : "";
      const first = {}, last = {};   // (for a reader of the page: the ends of each series)
      kind.series.forEach(([label, key]) => {
        first[label] = data[key][0] ?? null;
        last[label] = data[key][data[key].length - 1] ?? null;
      });
      holder.dataset.firstValues = JSON.stringify(first);
      holder.dataset.lastValues = JSON.stringify(last);
    }
    entry.width = width;
  }
}

// ------------------------------------------------------------------ the range switch

function setRange(range) {
  state.range = range;
  for (const button of document.querySelectorAll("#history-range button")) {
    button.setAttribute("aria-pressed", String(button.dataset.range === range));
  }
  $("#history-range").dataset.range = range;
  if (state.enabled) reload();
}

document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("#history-range button")) {
    button.addEventListener("click", () => setRange(button.dataset.range));
  }
  window.addEventListener("resize", () => draw());
  // Canvas lines take their colours when drawn: a new theme draws the charts anew.
  document.addEventListener("cronoq:theme", () => {
    for (const pool of [...state.charts.keys()]) forget(pool);
    draw();
  });
});

// ------------------------------------------------------------------ the stream's events

on("hello", (data) => {
  state.enabled = Boolean(data.snapshot_s);   // (snapshots and history: the metrics role)
  $("#history-range").hidden = !state.enabled;
  if (state.enabled) reload();
});

on("snapshot", (snap) => {
  if (!state.enabled || state.loading || state.fetching || app.page !== "overview") return;
  state.serverNow = Math.max(state.serverNow, Number(BigInt(snap.at_unix_ns) / 1000000n) / 1000);
  state.fetching = true;
  appendNew().then(draw, (err) => console.warn("the latest history could not be read", err))
    .finally(() => { state.fetching = false; });
});

on("overview", () => draw());

export { formatValue };
