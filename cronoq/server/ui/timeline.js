// The Timeline page: a Gantt chart of the attempts of the last minutes, one
// lane per worker slot, and the fixed starts ahead of now. It reads
// GET /v1/timeline when shown, on the stream's status events (at most every
// THROTTLE_MS), on hello and lagged (the shell refreshes the page), and every
// REREAD_MS while shown (holds are granted without a status event); between
// reads it redraws every second, so that "now" moves and running bars grow.

import { app, api, describe, $, option, time, dateTime, seconds, openDrawer, on, registerPage } from "./app.js";

const SVG = "http://www.w3.org/2000/svg";
const THROTTLE_MS = 500;
const REREAD_MS = 5000;
const TICK_MS = 1000;
const LABEL_W = 170;       // the lane labels' column
const RIGHT_W = 12;
const AXIS_H = 34;
const LANE_H = 22;
const HEADER_H = 20;       // a pool's heading row
const BAR_PAD = 3;
const STEPS_S = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200];

const view = {
  data: null,          // the latest answer
  offsetMs: 0,         // the server's clock minus this page's, at the latest answer
  loading: false, again: false, timer: null, lastLoad: 0, ticker: null, reread: null,
};

// How far ahead of now the chart reaches: a third of the range, at least 90 s (a fixed start a
// minute ahead shows in the default range).
function aheadOf(rangeS) {
  return Math.max(90, Math.round(rangeS / 3));
}

function nowMs() {
  return Date.now() + view.offsetMs;
}

function ms(ns) {
  return Number(BigInt(ns) / 1000000n);
}

function el(name, attrs = {}, parent = null) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) node.setAttribute(key, String(value));
  }
  if (parent) parent.appendChild(node);
  return node;
}

// ------------------------------------------------------------------ reading

async function load() {
  if (view.loading) {
    view.again = true;
    return;
  }
  view.loading = true;
  view.lastLoad = performance.now();
  const range = Number($("#timeline-range").value);
  const params = new URLSearchParams({range_s: String(range), ahead_s: String(aheadOf(range))});
  const pool = $("#timeline-pool").value;
  if (pool) params.set("pool", pool);
  try {
    const data = await api("/v1/timeline?" + params);
    view.data = data;
    view.offsetMs = ms(data.at_unix_ns) - Date.now();
    $("#timeline-error").textContent = "";
    render();
  } catch (err) {
    $("#timeline-error").textContent = describe(err);
  } finally {
    view.loading = false;
    if (view.again) {
      view.again = false;
      schedule();
    }
  }
}

// A read at most every THROTTLE_MS, however many events arrive.
function schedule() {
  if (view.timer !== null) return;
  const wait = Math.max(0, view.lastLoad + THROTTLE_MS - performance.now());
  view.timer = setTimeout(() => {
    view.timer = null;
    if (app.page === "timeline" && app.token !== null) load();
  }, wait);
}

function refresh() {
  fillPools();
  schedule();
  if (view.ticker === null) {
    view.ticker = setInterval(() => {
      if (app.page !== "timeline" || app.token === null) return stop();
      if (view.data) render();
    }, TICK_MS);
    view.reread = setInterval(() => {
      if (app.page === "timeline" && app.token !== null) schedule();
    }, REREAD_MS);
  }
}

function stop() {
  clearInterval(view.ticker);
  clearInterval(view.reread);
  view.ticker = view.reread = null;
  hideTip();
}

function fillPools() {
  const select = $("#timeline-pool");
  const chosen = select.value;
  select.replaceChildren(option("", "every pool"), ...app.pools.map((p) => option(p, p)));
  select.value = app.pools.includes(chosen) ? chosen : "";
}

// ------------------------------------------------------------------ lanes

// Packs items (each with start and end in ms, end Infinity while running) into at most
// `most` lanes, earliest first: each goes to the first lane free at its start, or, when
// none is (the slots overlap in what the server saw), to the lane that frees up first.
function pack(items, most) {
  const ends = [];
  const placed = [];
  for (const item of [...items].sort((a, b) => a.start - b.start || a.end - b.end)) {
    let lane = ends.findIndex((end) => end <= item.start);
    if (lane < 0 && ends.length < most) lane = ends.length;
    if (lane < 0) lane = ends.indexOf(Math.min(...ends));
    ends[lane] = Math.max(ends[lane] === undefined ? -Infinity : ends[lane], item.end);
    placed.push([item, lane]);
  }
  return {placed, lanes: Math.max(ends.length, 1)};
}

// The rows of the chart, pool by pool: each connected worker (its slots as lanes), the workers
// gone since (or unknown) that ran attempts of the window, then the pool's reserved lanes.
function layout(data) {
  const pools = new Map();
  const poolOf = (name) => {
    if (!pools.has(name)) pools.set(name, {name, workers: new Map(), reservations: [], held: 0});
    return pools.get(name);
  };
  for (const w of data.workers) {
    poolOf(w.pool).workers.set(w.id, {id: w.id, name: w.name, slots: w.slots, connected: true, attempts: []});
  }
  for (const a of data.attempts) {
    const pool = poolOf(a.pool);
    const id = a.worker_id || "";
    if (!pool.workers.has(id)) {
      pool.workers.set(id, {id, name: a.worker_name || "worker not recorded", slots: 1, connected: false,
                            attempts: []});
    }
    pool.workers.get(id).attempts.push({a, start: ms(a.started_unix_ns),
                                        end: a.ended_unix_ns ? ms(a.ended_unix_ns) : Infinity});
  }
  for (const r of data.reservations) {
    const start = ms(r.start_unix_ns);
    const tolerance = r.tolerance_s * 1000;
    poolOf(r.pool).reservations.push({r, start: start - tolerance, end: start + tolerance, at: start});
  }
  for (const h of data.holds) poolOf(h.pool).held = h.held;
  const rows = [];
  let y = AXIS_H;
  for (const pool of [...pools.values()].sort((a, b) => a.name.localeCompare(b.name))) {
    rows.push({kind: "pool", pool, y});
    y += HEADER_H;
    for (const worker of pool.workers.values()) {
      const packed = pack(worker.attempts, worker.connected ? Math.max(worker.slots, 1) : Infinity);
      const lanes = worker.connected ? Math.max(worker.slots, packed.lanes) : packed.lanes;
      rows.push({kind: "worker", pool, worker, packed, lanes, y});
      y += lanes * LANE_H;
    }
    if (pool.reservations.length || pool.held) {
      const packed = pack(pool.reservations, Infinity);
      rows.push({kind: "reserved", pool, packed, lanes: packed.lanes, y});
      y += packed.lanes * LANE_H;
    }
  }
  return {rows, height: y + 6};
}

// ------------------------------------------------------------------ drawing

function tickStep(spanS, width) {
  const wanted = Math.max(2, Math.floor(width / 90));
  return STEPS_S.find((step) => spanS / step <= wanted) || STEPS_S[STEPS_S.length - 1];
}

// Times of day in UTC, as the rest of the dashboard shows them.
function clock(msValue) {
  return new Date(msValue).toISOString().slice(11, 19);
}

function day(msValue) {
  return new Date(msValue).toISOString().slice(0, 10);
}

function render() {
  const data = view.data;
  const svg = $("#timeline-svg");
  const holder = $("#timeline-chart");
  const width = Math.max(480, holder.clientWidth || 960);
  const rangeS = data.range_s;
  const aheadS = aheadOf(rangeS);
  const now = nowMs();
  const from = now - rangeS * 1000;
  const to = now + aheadS * 1000;
  const plotW = width - LABEL_W - RIGHT_W;
  const x = (t) => LABEL_W + Math.max(0, Math.min(1, (t - from) / (to - from))) * plotW;
  const {rows, height} = layout(data);
  svg.replaceChildren();
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const defs = el("defs", {}, svg);
  const hatch = el("pattern", {id: "timeline-hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse",
                               patternTransform: "rotate(45)"}, defs);
  el("line", {x1: 0, y1: 0, x2: 0, y2: 6, class: "hatch"}, hatch);

  drawAxis(svg, from, to, x, height);
  const bars = new Map();   // "id/attempt" -> {x1, x2, y}
  for (const row of rows) {
    if (row.kind === "pool") {
      const g = el("g", {class: "pool-head", "data-pool": row.pool.name}, svg);
      el("rect", {x: 0, y: row.y, width, height: HEADER_H, class: "pool-band"}, g);
      el("text", {x: 6, y: row.y + HEADER_H / 2, class: "pool-name"}, g).textContent = `pool ${row.pool.name}`;
    } else if (row.kind === "worker") {
      drawWorker(svg, row, x, now, from, width, bars);
    } else {
      drawReserved(svg, row, x, from, to, width);
    }
  }
  drawRetryLinks(svg, data.attempts, bars);
  const nowX = x(now);
  el("line", {x1: nowX, y1: AXIS_H - 6, x2: nowX, y2: height, class: "now", "data-at": Math.round(now)}, svg);
  el("text", {x: nowX + 3, y: AXIS_H - 8, class: "now-label"}, svg).textContent = "now";
  summarize(data);
}

function drawAxis(svg, from, to, x, height) {
  const g = el("g", {class: "axis"}, svg);
  const plotW = Number(svg.getAttribute("width")) - LABEL_W - RIGHT_W;
  const step = tickStep((to - from) / 1000, plotW) * 1000;
  let lastDay = null;
  for (let t = Math.ceil(from / step) * step; t <= to; t += step) {
    const tx = x(t);
    el("line", {x1: tx, y1: AXIS_H - 4, x2: tx, y2: height, class: "tick"}, g);
    if (tx > LABEL_W + plotW - 24) continue;   // its label would not fit
    el("text", {x: tx, y: 12, class: "tick-label"}, g).textContent = clock(t);
    const today = day(t);
    if (today !== lastDay) {   // the date under the first tick and wherever the day changes
      el("text", {x: tx, y: 24, class: "tick-date"}, g).textContent = today;
      lastDay = today;
    }
  }
}

function laneLabel(g, text, y, className) {
  el("text", {x: 10, y: y + LANE_H / 2, class: className}, g).textContent = text;
}

function drawWorker(svg, row, x, now, from, width, bars) {
  const {worker, packed, lanes, y} = row;
  const g = el("g", {class: "worker" + (worker.connected ? "" : " gone"), "data-worker-id": worker.id,
                     "data-worker-name": worker.name, "data-pool": row.pool.name, "data-lanes": lanes}, svg);
  for (let lane = 0; lane < lanes; lane++) {
    el("rect", {x: LABEL_W, y: y + lane * LANE_H, width: width - LABEL_W - RIGHT_W, height: LANE_H,
                class: "lane" + (lane % 2 ? " odd" : "")}, g);
    const name = worker.id ? `${worker.name} · ${worker.id}` : worker.name;   // (names need not be unique)
    laneLabel(g, lane === 0 ? name + (worker.connected ? "" : " (gone)") : "", y + lane * LANE_H, "worker-name");
    el("text", {x: LABEL_W - 6, y: y + lane * LANE_H + LANE_H / 2, class: "slot-name"}, g).textContent =
      worker.connected ? `slot ${lane + 1}` : "";
  }
  for (const [item, lane] of packed.placed) {
    const a = item.a;
    const x1 = x(item.start);
    const x2 = Math.max(x1 + 2, x(Math.min(item.end, now)));
    const top = y + lane * LANE_H + BAR_PAD;
    const status = a.status || (a.ended_unix_ns ? "handed_over" : "running");
    const rect = el("rect", {x: x1, y: top, width: x2 - x1, height: LANE_H - 2 * BAR_PAD, rx: 2,
                             class: `attempt status-${status}` + (a.missed_deadline ? " missed" : ""),
                             "data-id": a.id, "data-attempt": a.attempt, "data-status": status,
                             "data-worker": a.worker_id || "", "data-lane": lane}, g);
    hoverable(rect, () => attemptTip(a, status));
    rect.addEventListener("click", () => openDrawer(a.id));
    if (x2 - x1 > 60) {
      const label = el("text", {x: x1 + 4, y: top + (LANE_H - 2 * BAR_PAD) / 2, class: "bar-label"}, g);
      label.textContent = `${a.key || a.kind} #${a.attempt}`;
    }
    if (a.deadline_unix_ns) {
      const d = ms(a.deadline_unix_ns);
      if (d >= from) {
        const dx = x(d);
        el("rect", {x: dx - 1.5, y: top - 2, width: 3, height: LANE_H - 2 * BAR_PAD + 4,
                    class: "deadline" + (a.missed_deadline ? " missed" : ""), "data-id": a.id,
                    "data-attempt": a.attempt}, g);
      }
    }
    bars.set(`${a.id}/${a.attempt}`, {x1, x2, y: top + (LANE_H - 2 * BAR_PAD) / 2});
  }
}

function drawReserved(svg, row, x, from, to, width) {
  const {pool, packed, lanes, y} = row;
  const g = el("g", {class: "reserved", "data-pool": pool.name, "data-held": pool.held}, svg);
  for (let lane = 0; lane < lanes; lane++) {
    el("rect", {x: LABEL_W, y: y + lane * LANE_H, width: width - LABEL_W - RIGHT_W, height: LANE_H,
                class: "lane reserved-lane"}, g);
  }
  laneLabel(g, "reserved" + (pool.held ? ` · ${pool.held} held` : ""), y, "reserved-name");
  const minW = 8;
  for (const [item, lane] of packed.placed) {
    const r = item.r;
    const x1 = x(item.start);
    const x2 = Math.max(x1 + minW, x(item.end));
    const top = y + lane * LANE_H + BAR_PAD;
    const h = LANE_H - 2 * BAR_PAD;
    const rect = el("rect", {x: x1, y: top, width: x2 - x1, height: h, rx: 2, fill: "url(#timeline-hatch)",
                             class: "reservation" + (r.held ? " held" : "") + (item.at > to ? " beyond" : ""),
                             "data-id": r.id, "data-held": r.held ? "true" : "false",
                             "data-start": r.start_unix_ns}, g);
    hoverable(rect, () => reservationTip(r));
    rect.addEventListener("click", () => openDrawer(r.id));
    const at = x(item.at);
    el("line", {x1: at, y1: top - 2, x2: at, y2: top + h + 2, class: "reservation-start"}, g);
    const text = `${r.key || r.kind} ${clock(item.at)}${r.held ? " (held)" : ""}`;
    const room = x2 + 4 + text.length * 6 <= width - RIGHT_W;   // else before the block, or inside it
    const lx = room ? x2 + 4 : x1 - 4 - text.length * 6 >= LABEL_W ? x1 - 4 : x1 + 4;
    el("text", {x: lx, y: top + h / 2, class: "reservation-label",
                "text-anchor": room || lx === x1 + 4 ? "start" : "end"}, g).textContent = text;
    if (r.deadline_unix_ns) {
      const d = ms(r.deadline_unix_ns);
      if (d >= from && d <= to) {
        const dx = x(d);
        el("rect", {x: dx - 1.5, y: top - 2, width: 3, height: h + 4, class: "deadline", "data-id": r.id}, g);
      }
    }
  }
}

// Each retry's bar linked to its previous attempt's: from the end of one to the start of the next.
function drawRetryLinks(svg, attempts, bars) {
  const g = el("g", {class: "retry-links"}, svg);
  for (const a of attempts) {
    if (a.attempt < 2) continue;
    const before = bars.get(`${a.id}/${a.attempt - 1}`);
    const after = bars.get(`${a.id}/${a.attempt}`);
    if (!before || !after) continue;
    // An arc over the bars: it shows even when the retry starts right where the attempt ended.
    const top = Math.min(before.y, after.y) - LANE_H / 2;
    const d = `M ${before.x2} ${before.y} C ${before.x2 + 8} ${top}, ${after.x1 - 8} ${top}, ${after.x1} ${after.y}`;
    el("path", {d, class: "retry-link", "data-id": a.id, "data-from": a.attempt - 1, "data-to": a.attempt}, g);
  }
}

function summarize(data) {
  const running = data.attempts.filter((a) => !a.ended_unix_ns).length;
  const missed = data.attempts.filter((a) => a.missed_deadline).length;
  const held = data.holds.map((h) => `${h.held} in ${h.pool}`).join(", ");
  $("#timeline-note").textContent = `${data.attempts.length} attempts (${running} running` +
    `${missed ? `, ${missed} past their deadline` : ""}), ${data.reservations.length} fixed starts ahead` +
    `${held ? `; slots held: ${held}` : ""}.` +
    (data.unavailable_shards.length ? ` Not shown: shards ${data.unavailable_shards.join(", ")}.` : "");
}

// ------------------------------------------------------------------ the tooltip

function hoverable(node, lines) {
  node.addEventListener("mouseenter", (event) => showTip(event, lines()));
  node.addEventListener("mousemove", (event) => placeTip(event));
  node.addEventListener("mouseleave", hideTip);
}

function showTip(event, lines) {
  const tip = $("#timeline-tip");
  tip.replaceChildren(...lines.map(([name, value]) => {
    const line = document.createElement("div");
    const b = document.createElement("b");
    b.textContent = name + " ";
    line.append(b, String(value));
    return line;
  }));
  tip.hidden = false;
  placeTip(event);
}

function placeTip(event) {
  const tip = $("#timeline-tip");
  tip.style.left = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 8) + "px";
  tip.style.top = event.clientY + 16 + "px";
}

function hideTip() {
  $("#timeline-tip").hidden = true;
}

function attemptTip(a, status) {
  const lines = [["task", `${a.id}${a.key ? " (" + a.key + ")" : ""}, ${a.kind}, ${a.priority}`],
                 ["attempt", `${a.attempt} of ${a.max_attempts}`],
                 ["worker", a.worker_name ? `${a.worker_name} (id ${a.worker_id})` : "not recorded"],
                 ["started", time(a.started_unix_ns)]];
  if (a.ended_unix_ns) {
    lines.push(["ended", `${time(a.ended_unix_ns)}, after ${seconds(a.started_unix_ns, a.ended_unix_ns)}`]);
  }
  lines.push(["outcome", status === "handed_over" ? "handed to another worker" : status]);
  if (a.message) lines.push(["message", a.message]);
  if (a.deadline_unix_ns) {
    lines.push(["deadline", `${time(a.deadline_unix_ns)}${a.missed_deadline ? " — missed" : ""}`]);
  }
  return lines;
}

function reservationTip(r) {
  const lines = [["task", `${r.id}${r.key ? " (" + r.key + ")" : ""}, ${r.kind}`], ["pool", r.pool],
                 ["starts", `${dateTime(r.start_unix_ns)}, tolerance ${r.tolerance_s} s`],
                 ["slot", r.held ? "held for it now" : "not held yet"]];
  if (r.deadline_unix_ns) lines.push(["deadline", time(r.deadline_unix_ns)]);
  return lines;
}

// ------------------------------------------------------------------ wiring

registerPage("timeline", {refresh});
on("status", () => {
  if (app.page === "timeline") schedule();
});

$("#timeline-pool").addEventListener("change", () => load());
$("#timeline-range").addEventListener("change", () => load());
$("#timeline-svg").addEventListener("mouseleave", hideTip);
window.addEventListener("resize", () => {
  if (app.page === "timeline" && view.data) render();
});
