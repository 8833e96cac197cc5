// The cronoq dashboard's shell: sign-in, the event stream and the built-in pages.
// Everything it shows comes from the server's public HTTP API: /v1/events
// (Server-Sent Events, read with fetch so the token travels in the
// authorization header) and the JSON routes. An ES module: the other modules
// (loaded after it by index.html) import what they need from it and register
// hooks and pages, so each feature lives in its own file.

import { route } from "./router.js";

const TOKEN_KEY = "cronoq.token";
const STATUSES = ["blocked", "scheduled", "ready", "running", "retrying", "succeeded", "failed",
                  "dead_lettered", "cancelled", "skipped", "missed", "shed"];
const TERMINAL = new Set(["succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"]);
const CLASSES = ["critical", "high", "normal", "low"];
const EVENT_ROWS = 500;       // rows the event page keeps
const SEEN_TASKS = 5000;      // tasks whose recent events the drawer can show

const $ = (selector) => document.querySelector(selector);

const app = {
  token: null, role: null, pools: [], page: "overview",
  stream: null, retryTimer: null, retryDelay: 500, watchdog: null,
  lastSnapshot: null,
  taskRows: new Map(),        // id -> row element of the task table
  seen: new Map(),            // id -> [events], bounded (insertion order)
  tasks: {filters: {}, after: "0", cursors: [], next: null, refetch: null},
  events: {paused: false, pending: [], frame: 0, count: 0, since: performance.now()},
  recentEvents: [],           // the latest EVENT_ROWS events, for an events page opened later
  replayed: false,            // the first connection asks for the leader's recent events; later ones do not
  drawerId: null,
  pushes: 0,                  // status events applied to rows so far
  missingShards: {snapshot: [], events: []},   // with shards: those that could not be asked
};

// What the feature modules register: a hook runs on each stream event of its
// name (hello, status, snapshot, lagged...) after the shell handled it, and
// "drawer" runs with {id, task} when the drawer opens (task null) and each time
// it read the task (task: GET /v1/tasks/{id}), "drawer-closed" with its id
// however it was closed (button, Escape); a page
// is a section of index.html whose refresh() runs when it is shown or re-read.
const hooks = new Map();
const pages = new Map();

function on(event, handler) {
  if (!hooks.has(event)) hooks.set(event, []);
  hooks.get(event).push(handler);
}

function registerPage(name, page) {
  pages.set(name, page);
}

function runHooks(event, data) {
  for (const handler of hooks.get(event) || []) {
    try { handler(data); } catch (err) { console.error(`the ${event} hook failed`, err); }
  }
}

// ------------------------------------------------------------------ the API

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, options = {}) {
  const headers = Object.assign({accept: "application/json"}, options.headers || {});
  if (app.token) headers.authorization = "Bearer " + app.token;
  let response;
  try {
    response = await fetch(path, Object.assign({}, options, {headers, cache: "no-store"}));
  } catch (err) {
    throw new ApiError(0, "the server cannot be reached");
  }
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (err) { body = null; }
  if (!response.ok) {
    const message = body && body.error ? body.error : text || response.statusText;
    throw new ApiError(response.status, `${response.status}: ${message}`);
  }
  return body;
}

function describe(err) {
  if (err.status === 503) return "this server is not the leader (standby or stopping)";
  return err.message;
}

// ------------------------------------------------------------------ the connection

const BANNERS = {
  standby: "This server is not the leader: it is a standby of a shared store, or it is stopping. The page " +
           "goes live by itself once this server leads; until then what it shows may be out of date.",
  disconnected: "The connection to the server is lost; the page reconnects by itself. What it shows may be " +
                "out of date.",
};

function setState(state, detail) {
  const badge = $("#conn");
  badge.dataset.state = state;
  badge.textContent = detail ? `${state}: ${detail}` : state;
  const banner = $("#banner");
  banner.hidden = !(state in BANNERS);
  banner.dataset.state = state;
  banner.textContent = BANNERS[state] || "";
}

// With shards: the shards this server could not ask, by the latest snapshot and by the event stream.
function setMissingShards(source, names) {
  app.missingShards[source] = names || [];
  const all = [...new Set([...app.missingShards.snapshot, ...app.missingShards.events])].sort();
  const banner = $("#shards-banner");
  banner.hidden = all.length === 0;
  banner.dataset.shards = all.join(",");
  banner.textContent = all.length === 0 ? "" :
    `${all.length === 1 ? "Shard" : "Shards"} ${all.join(", ")} cannot be reached: ` +
    `${all.length === 1 ? "its" : "their"} pools, tasks, workers and events are missing from this page, ` +
    "and the counts leave them out. The other shards are shown as they are.";
}

function connect() {
  clearTimeout(app.retryTimer);
  if (app.stream) app.stream.abort();
  const controller = new AbortController();
  app.stream = controller;
  setState("connecting");
  readStream(controller).catch(() => {}).finally(() => {
    clearTimeout(app.watchdog);
    if (app.stream !== controller || controller.signal.aborted && !controller.stale) return;
    if (!app.token && app.token !== "") return;
    app.retryTimer = setTimeout(connect, app.retryDelay);
    app.retryDelay = Math.min(app.retryDelay * 2, 5000);
  });
}

// No byte for this long (the server sends a comment every 15 s): the connection is dead.
function armWatchdog(controller) {
  clearTimeout(app.watchdog);
  app.watchdog = setTimeout(() => { controller.stale = true; controller.abort(); setState("disconnected", "no data"); },
                            40000);
}

async function readStream(controller) {
  const headers = {accept: "text/event-stream"};
  if (app.token) headers.authorization = "Bearer " + app.token;
  let response;
  try {
    // (a reconnection asks for no replay: what it showed is still there, re-read by refreshPage)
    const replay = app.replayed ? "" : "&recent=" + EVENT_ROWS;
    response = await fetch("/v1/events?snapshot_s=1" + replay, {headers, signal: controller.signal,
                                                               cache: "no-store"});
  } catch (err) {
    if (!controller.signal.aborted) setState("disconnected", "the server cannot be reached");
    return;
  }
  if (response.status === 401) {
    signOut("The token was refused: " + (await errorText(response)));
    return;
  }
  if (response.status === 503) {
    setState("standby", "this server is not the leader; retrying");
    app.retryDelay = 1000;
    return;
  }
  if (!response.ok) {
    setState("disconnected", await errorText(response));
    return;
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  armWatchdog(controller);
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    armWatchdog(controller);
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data += line.slice(5).trim();
      }
      if (data) dispatch(event, JSON.parse(data));
    }
  }
  if (!controller.signal.aborted && $("#conn").dataset.state === "live") setState("disconnected", "the stream ended");
}

async function errorText(response) {
  try { return (await response.json()).error; } catch (err) { return response.statusText; }
}

function dispatch(event, data) {
  if (event === "hello") {
    app.replayed = true;
    app.retryDelay = 500;
    setMissingShards("events", []);   // (a new stream says again which shards it is missing)
    app.role = data.role;
    app.pools = data.pools;
    setState("live");
    $("#who").textContent = "role " + data.role;
    document.body.dataset.role = data.role;
    fillPoolChoices();
    for (const row of app.taskRows.values()) row.dataset.push = "0";   // missed events: the re-read decides
    $("#overview-note").textContent = data.snapshot_s ? "" :
      "The charts need a token with the metrics (or admin) role.";
    refreshPage();   // reconcile: events before this connection were not seen
  } else if (event === "status") {
    onStatus(data);
  } else if (event === "snapshot") {
    setMissingShards("snapshot", data.unavailable_shards);
    onSnapshot(data);
  } else if (event === "shards") {
    setMissingShards("events", data.unavailable_shards);
  } else if (event === "lagged") {
    for (const row of app.taskRows.values()) row.dataset.push = "0";
    refreshPage();
  } else if (event === "state") {
    setState("standby", `the server is ${data.state}; retrying`);
    app.retryDelay = 1000;
  }
  runHooks(event, data);
}

// ------------------------------------------------------------------ sign in and out

function signIn(token) {
  app.token = token;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("#login").hidden = true;
  $("#nav").hidden = false;
  $("#logout").hidden = false;
  $("#login-error").textContent = "";
  route(location.hash, show);
  connect();
}

function signOut(message) {
  app.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  if (app.stream) app.stream.abort();
  app.stream = null;
  clearTimeout(app.retryTimer);
  setState("signed-out", "");
  $("#conn").textContent = "signed out";
  $("#who").textContent = "";
  $("#nav").hidden = true;
  $("#logout").hidden = true;
  for (const page of document.querySelectorAll(".page")) page.hidden = true;
  closeDrawer();
  $("#login").hidden = false;
  $("#login-error").textContent = message || "";
  $("#token").value = "";
}

// ------------------------------------------------------------------ pages

function show(page) {
  if (!document.getElementById(page) || page === "login") page = "overview";
  app.page = page;
  for (const section of document.querySelectorAll(".page")) section.hidden = section.id !== page;
  for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("current", link.dataset.page === page);
  refreshPage();
}

function refreshPage() {
  if (app.token === null) return;
  if (app.page === "tasks") loadTasks();
  else if (app.page === "workers") loadWorkers();
  else if (app.page === "recurring") loadRecurring();
  else if (app.page === "dead") loadDead(true);
  else if (app.page === "overview" && app.lastSnapshot) renderOverview(app.lastSnapshot);
  else if (app.page === "events" && !$("#event-table tbody").children.length) queueEvents(app.recentEvents);
  else if (pages.has(app.page)) pages.get(app.page).refresh();
}

function fillPoolChoices() {
  for (const select of [$("#task-filters [name=pool]"), $("#event-pool")]) {
    const chosen = select.value;
    select.replaceChildren(option("", "any"), ...app.pools.map((p) => option(p, p)));
    select.value = app.pools.includes(chosen) ? chosen : "";
  }
}

function option(value, text) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = text;
  return o;
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null ? "" : String(text);
  if (className) td.className = className;
  return td;
}

// A moment with its date and milliseconds, in UTC as dateTime: "2026-12-02 18:31:05.123Z".
function time(ns) {
  if (!ns) return "";
  return new Date(Number(BigInt(ns) / 1000000n)).toISOString().replace("T", " ");
}

function dateTime(ns) {
  if (!ns) return "";
  return new Date(Number(BigInt(ns) / 1000000n)).toISOString().replace("T", " ").slice(0, 19) + "Z";
}

// ------------------------------------------------------------------ overview

function onSnapshot(snap) {
  app.lastSnapshot = snap;
  if (app.page === "overview") renderOverview(snap);
  if (app.page === "workers" && workersChanged(snap)) loadWorkers();
}

// The workers page follows the snapshots: it re-reads the list when their figures move.
function workersChanged(snap) {
  const key = snap.pools.map((p) => `${p.name}:${p.workers_connected}:${p.capacity}:${p.busy}`).join(",");
  const changed = key !== app.workersKey;
  app.workersKey = key;
  return changed;
}

// What each total counts: beside a pool's window counts (attempts), most totals are tasks.
const TOTAL_UNITS = [
  ["tasks", ["submitted", "succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"]],
  ["attempts", ["dispatched", "retries", "timeouts", "lease_expiries", "stale_completions"]],
  ["schedule occurrences", ["recurring_conflicts", "recurring_invalid"]],
];

// "last 60 s": the span of a snapshot's window counts and rates (an older server does not say).
function windowText(snap) {
  return snap.metrics_window_s > 0 ? `last ${snap.metrics_window_s} s` : "the metrics window";
}

function attemptText(attempt, maxAttempts) {
  return maxAttempts ? `${attempt}/${maxAttempts}` : String(attempt);
}

function renderOverview(snap) {
  const totals = $("#totals");
  const groups = [["now", [["live tasks", snap.live_tasks], ["running", snap.running], ["pending", snap.pending],
                           ["workers", snap.workers_connected]]]];
  const listed = new Set();
  for (const [unit, names] of TOTAL_UNITS) {
    const present = names.filter((name) => name in snap.totals);
    present.forEach((name) => listed.add(name));
    if (present.length) groups.push([`since start, ${unit}`, present.map((name) => [name, snap.totals[name]])]);
  }
  const others = Object.keys(snap.totals).filter((name) => !listed.has(name)).sort();
  if (others.length) groups.push(["since start, other", others.map((name) => [name, snap.totals[name]])]);
  totals.replaceChildren(...groups.map(([label, items]) => {
    const group = document.createElement("div");
    group.className = "total-group";
    const heading = document.createElement("span");
    heading.className = "unit";
    heading.textContent = label + ":";
    group.append(heading, ...items.map(([name, value]) => {
      const span = document.createElement("span");
      span.dataset.total = name;
      span.append(name + " ");
      const b = document.createElement("b");
      b.textContent = value;
      span.append(b);
      return span;
    }));
    return group;
  }));
  const holder = $("#pools");
  for (const pool of snap.pools) {
    let card = holder.querySelector(`[data-pool="${CSS.escape(pool.name)}"]`);
    if (!card) {
      card = poolCard(pool.name);
      holder.append(card);
    }
    fillPoolCard(card, pool, windowText(snap));
    card.classList.remove("unavailable");
  }
  // A pool the snapshot left out (its shard cannot be asked): its last figures, marked as such.
  const present = new Set(snap.pools.map((pool) => pool.name));
  for (const card of holder.querySelectorAll("article.pool")) {
    if (present.has(card.dataset.pool)) continue;
    card.classList.add("unavailable");
    card.querySelector(".window").textContent = "its shard cannot be reached: the last figures seen";
  }
  runHooks("overview", snap);   // (the cards are drawn: charts.js fills in their charts)
}

function poolCard(name) {
  const card = document.createElement("article");
  card.className = "pool";
  card.dataset.pool = name;
  const title = document.createElement("h2");
  title.textContent = name;
  const span = document.createElement("p");
  span.className = "window note";
  const fields = document.createElement("dl");
  card.append(title, span, fields);
  return card;
}

function fillPoolCard(card, pool, span) {
  const pct = (x) => (100 * x).toFixed(1) + "%";
  const secs = (x) => x < 1 ? (1000 * x).toFixed(0) + " ms" : x.toFixed(2) + " s";
  card.querySelector(".window").textContent =
    `waits, rates and attempts: ${span}; cost: since start; the rest: now`;
  const labels = {succeeded: "attempts succeeded", failed: "attempts failed"};   // (attempts, not tasks)
  const fields = [
    ["capacity", pool.capacity], ["desired", pool.desired], ["busy", pool.busy], ["pending", pool.pending],
    ...CLASSES.map((c) => ["pending " + c, pool.pending_by_class[c]]),
    ["wait p50", secs(pool.wait_p50_s)], ["wait p90", secs(pool.wait_p90_s)], ["wait p99", secs(pool.wait_p99_s)],
    ["workers", pool.workers_connected], ["priority adherence", pct(pool.priority_adherence)],
    ["fixed-start hits", pct(pool.fixed_start_hit_rate)], ["utilization", pct(pool.utilization)],
    ["cost", pool.cost.toFixed(2)], ["succeeded", pool.succeeded], ["failed", pool.failed],
  ];
  const dl = card.querySelector("dl");
  dl.replaceChildren(...fields.flatMap(([name, value]) => {
    const dt = document.createElement("dt");
    dt.textContent = labels[name] || name;
    const dd = document.createElement("dd");
    dd.dataset.field = name;
    dd.textContent = value;
    return [dt, dd];
  }));
}

// ------------------------------------------------------------------ tasks

function pageSize() {
  return Number(app.tasks.filters.limit || 50);
}

function taskQuery(after, limit) {
  const f = app.tasks.filters;
  const params = new URLSearchParams();
  if (f.pool) params.set("pool", f.pool);
  if (f.status) params.set("status", f.status);
  if (f.priority) params.set("priority", f.priority);
  if (f.tenant) params.set("tenant", f.tenant);
  if (f.q) params.set("q", f.q);
  params.set("limit", String(limit || pageSize()));
  // Newest first (the default) pages down with before; oldest first pages up with after.
  if (newestFirst()) params.set("order", "newest");
  if (after && after !== "0") params.set(newestFirst() ? "before" : "after", after);
  return params.toString();
}

function newestFirst() {
  return (app.tasks.filters.order || "newest") === "newest";
}

async function loadTasks() {
  clearTimeout(app.tasks.refetch);
  app.tasks.refetch = null;
  const since = app.pushes;   // rows patched by events after this are newer than the answer
  const f = app.tasks.filters;
  $("#tasks-error").textContent = "";
  try {
    let tasks, next = null;
    if (f.key) {
      try {
        const task = await api("/v1/tasks/by-key/" + encodeURIComponent(f.key));
        tasks = matches(task) ? [task] : [];
      } catch (err) {
        if (err.status !== 404) throw err;
        tasks = [];
      }
    } else {
      const page = await api("/v1/tasks?" + taskQuery(app.tasks.after));
      tasks = page.tasks;
      next = page.next_before || page.next_after || null;
    }
    app.tasks.next = next;
    renderTasks(tasks, since);
  } catch (err) {
    $("#tasks-error").textContent = describe(err);
  }
}

// New tasks on the last page: read only those after the last row shown, and append them.
async function appendTasks() {
  app.tasks.refetch = null;
  if (app.tasks.filters.key || app.tasks.next || newestFirst()) return loadTasks();
  const room = pageSize() - app.taskRows.size;
  if (room <= 0) return loadTasks();   // the page is full: re-read it, which sets "Next page"
  const ids = [...app.taskRows.keys()];
  const last = ids.length ? ids[ids.length - 1] : app.tasks.after;
  const since = app.pushes;
  try {
    const page = await api("/v1/tasks?" + taskQuery(last, room));
    if (app.tasks.next || app.page !== "tasks") return;
    const body = $("#task-table tbody");
    const fresh = page.tasks.filter((task) => !app.taskRows.has(task.id)).map((task) => taskRow(task, since));
    body.append(...fresh);
    if (page.next_after) {
      app.tasks.next = ids.concat(fresh.map((row) => row.dataset.id)).pop() || null;
      $("#next-page").disabled = !app.tasks.next;
    }
    showCount();
    runHooks("tasks-rendered", app.taskRows);
  } catch (err) {
    $("#tasks-error").textContent = describe(err);
  }
}

function showCount() {
  const n = app.taskRows.size;
  $("#page-info").textContent = `${n} task${n === 1 ? "" : "s"}` +
    (app.tasks.cursors.length ? `, page ${app.tasks.cursors.length + 1}` : "");
}

function matches(task) {
  const f = app.tasks.filters;
  return (!f.pool || task.pool === f.pool) && (!f.status || task.status === f.status) &&
         (!f.priority || (task.priority || "normal") === f.priority) && (!f.tenant || task.tenant === f.tenant) &&
         (!f.key || task.key === f.key);
}

function renderTasks(tasks, since) {
  const body = $("#task-table tbody");
  const before = app.taskRows;
  app.taskRows = new Map();
  // Rows already shown are kept: a re-read does not rebuild the table, and it
  // never overwrites a status that an event set after the read began.
  const rows = tasks.map((task) => {
    const row = before.get(task.id);
    if (!row) return taskRow(task, since);
    if (row.dataset.status !== task.status && !(Number(row.dataset.push || 0) > since)) {
      setStatus(row, task.status, task.attempt, task.max_attempts);
    }
    app.taskRows.set(task.id, row);
    return row;
  });
  const same = rows.length === body.children.length && rows.every((row, i) => body.children[i] === row);
  if (!same) body.replaceChildren(...rows);
  $("#next-page").disabled = !app.tasks.next;
  showCount();
  runHooks("tasks-rendered", app.taskRows);
}

// A row from an answer read since event number ``since``: an event that came meanwhile is newer.
function taskRow(task, since) {
  const row = document.createElement("tr");
  row.dataset.id = task.id;
  row.tabIndex = 0;   // (Enter opens its drawer: keys.js)
  row.append(cell(task.id), cell(task.pool), cell(task.key), cell(task.kind),
             cell(task.status, "status status-" + task.status),
             cell(attemptText(task.attempt, task.max_attempts), "attempt"),
             cell(task.priority || "normal"),
             cell(task.tenant), cell(dateTime(task.created_unix_ns)));
  row.dataset.status = task.status;
  if (task.max_attempts) row.dataset.maxAttempts = task.max_attempts;
  const seen = app.seen.get(task.id);
  const last = seen && seen[seen.length - 1];
  if (since !== undefined && last && last.seq > since) {
    setStatus(row, last.status, last.attempt, last.max_attempts);
    row.dataset.push = String(last.seq);
  }
  app.taskRows.set(task.id, row);
  runHooks("task-row", {row, task});
  return row;
}

function setStatus(row, status, attempt, maxAttempts) {
  const cell = row.querySelector("td.status");
  cell.textContent = status;
  cell.className = "status status-" + status;
  if (maxAttempts) row.dataset.maxAttempts = maxAttempts;
  row.querySelector("td.attempt").textContent = attemptText(attempt, Number(row.dataset.maxAttempts || 0));
  row.dataset.status = status;
}

function onStatus(events) {
  let unknown = false;
  app.recentEvents.push(...events);
  if (app.recentEvents.length > EVENT_ROWS) app.recentEvents.splice(0, app.recentEvents.length - EVENT_ROWS);
  for (const e of events) {
    remember(e);
    const row = app.taskRows.get(e.id);
    if (row) {
      setStatus(row, e.status, e.attempt, e.max_attempts);
      row.dataset.push = String(e.seq);
    } else if ((!app.tasks.filters.pool || e.pool === app.tasks.filters.pool) &&
               (!app.tasks.filters.status || e.status === app.tasks.filters.status)) {
      unknown = true;
    }
    if (app.drawerId === e.id) drawerEvent(e);
  }
  if (app.page === "tasks") {
    // New tasks (or tasks entering the filter) show up on the last page (the first, newest first),
    // read at most every 150 ms.
    const edge = newestFirst() ? !app.tasks.cursors.length : !app.tasks.next;
    if (unknown && edge && !app.tasks.refetch) app.tasks.refetch = setTimeout(appendTasks, 150);
  } else if (app.page === "events") {
    queueEvents(events);
  } else if (app.page === "dead" && events.some((e) => e.status === "dead_lettered")) {
    if (!app.deadRefetch) app.deadRefetch = setTimeout(() => { app.deadRefetch = null; loadDead(true); }, 500);
  }
}

function remember(e) {
  let list = app.seen.get(e.id);
  if (!list) {
    if (app.seen.size >= SEEN_TASKS) app.seen.delete(app.seen.keys().next().value);
    app.seen.set(e.id, list = []);
  }
  e.seq = ++app.pushes;
  list.push(e);
  if (list.length > 50) list.shift();
}

// ------------------------------------------------------------------ the drawer

async function openDrawer(id) {
  app.drawerId = id;
  $("#drawer").hidden = false;
  $("#drawer-title").textContent = "Task " + id;
  $("#drawer-message").textContent = "";
  $("#drawer-attempts").replaceChildren(...(app.seen.get(id) || []).map(eventItem));
  runHooks("drawer", {id, task: null});   // a new task: the feature parts clear what they drew
  showStages([], []);
  showExplanation(null);
  await fillDrawer(id);
}

async function fillDrawer(id) {
  try {
    const task = await api("/v1/tasks/" + id);
    if (app.drawerId !== id) return;
    const fields = $("#drawer-fields");
    const rows = [["status", task.status], ["pool", task.pool], ["key", task.key], ["kind", task.kind],
                  ["attempt", `${task.attempt}${task.max_attempts ? " of " + task.max_attempts : ""}`],
                  ["class", task.priority || "normal"], ["tenant", task.tenant],
                  ["tags", task.tags ? Object.entries(task.tags).map(([k, v]) => `${k}=${v}`).join(", ") : ""],
                  ["created", dateTime(task.created_unix_ns)], ["started", dateTime(task.started_unix_ns)],
                  ["finished", dateTime(task.finished_unix_ns)], ["message", task.message]];
    fields.replaceChildren(...rows.filter(([, v]) => v !== undefined && v !== "").flatMap(([name, value]) => {
      const dt = document.createElement("dt");
      dt.textContent = name;
      const dd = document.createElement("dd");
      dd.dataset.field = name;
      dd.textContent = value;
      return [dt, dd];
    }));
    $("#drawer-cancel").disabled = TERMINAL.has(task.status);
    if (task.attempts) $("#drawer-attempts").replaceChildren(...task.attempts.map(attemptItem));
    runHooks("drawer", {id, task});
    showStages(task.stages || [], task.checkpoints || []);
    explainTask(id, task.status);
  } catch (err) {
    $("#drawer-message").textContent = describe(err);
  }
}

// Why a task that has not run yet waits: the leader's explanation (its reasons, score and place in line).
async function explainTask(id, status) {
  if (TERMINAL.has(status) || status === "running") {
    showExplanation(null);
    return;
  }
  try {
    const answer = await api(`/v1/tasks/${id}:explain`);
    if (app.drawerId === id) showExplanation(answer);
  } catch (err) {
    if (app.drawerId === id) showExplanation(null);
  }
}

function showExplanation(answer) {
  $("#drawer-why-part").hidden = !(answer && answer.waiting);
  if (!answer || !answer.waiting) {
    $("#drawer-reasons").replaceChildren();
    return;
  }
  const place = answer.position ? ` Number ${answer.position} of ${answer.queued} in line, score ` +
    `${answer.score.toFixed(0)}.` : "";
  $("#drawer-why").textContent = answer.summary + place;
  $("#drawer-reasons").replaceChildren(...answer.reasons.map((r) => {
    const li = document.createElement("li");
    li.dataset.code = r.code;
    li.textContent = r.message;
    return li;
  }));
}

// Declared stages in order, each with the checkpoint that completed it.
function showStages(stages, checkpoints) {
  $("#drawer-stages-part").hidden = !stages.length;
  const saved = new Map(checkpoints.map((c) => [c.stage, c]));
  $("#drawer-stages").replaceChildren(...stages.map((stage) => {
    const li = document.createElement("li");
    const c = saved.get(stage);
    li.dataset.stage = stage;
    li.dataset.state = c ? "done" : "open";
    li.textContent = c ? `${stage}: checkpointed by attempt ${c.attempt} at ${time(c.saved_unix_ns)}`
                       : `${stage}: not yet`;
    return li;
  }));
}

// The drawer lists the attempts the server reports; until it has (or when it
// no longer remembers the task), the transitions this page saw.
function eventItem(e) {
  const li = document.createElement("li");
  li.textContent = `${time(e.at_unix_ns)} attempt ${e.attempt}: ${e.status}${e.message ? " — " + e.message : ""}`;
  return li;
}

function attemptItem(a) {
  const li = document.createElement("li");
  li.value = a.attempt;
  li.dataset.status = a.status || (a.ended_unix_ns ? "" : "running");
  const took = a.ended_unix_ns ? ` (${seconds(a.started_unix_ns, a.ended_unix_ns)})` : "";
  if (a.worker_id) li.dataset.worker = a.worker_name;
  li.textContent = `${time(a.started_unix_ns)} ${a.status || (a.ended_unix_ns ? "handed over" : "running")}` +
    `${took}${a.worker_id ? " on " + a.worker_name : ""}${a.message ? " — " + a.message : ""}`;
  return li;
}

function seconds(fromNs, toNs) {
  const ms = Number((BigInt(toNs) - BigInt(fromNs)) / 1000000n);
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(2)} s`;
}

function drawerEvent(e) {
  clearTimeout(app.drawerRefill);
  app.drawerRefill = setTimeout(() => fillDrawer(e.id), 100);
}

function closeDrawer() {
  const id = app.drawerId;
  app.drawerId = null;
  $("#drawer").hidden = true;
  if (id !== null) runHooks("drawer-closed", id);
}

async function cancelTask() {
  const id = app.drawerId;
  const message = $("#drawer-message");
  message.textContent = "";
  try {
    const answer = await api("/v1/tasks/" + id, {method: "DELETE"});
    message.textContent = answer.cancelled ? "cancelled" : "it had already finished";
    await fillDrawer(id);
  } catch (err) {
    message.textContent = describe(err);
  }
}

// ------------------------------------------------------------------ events (batched: one render per frame)

function queueEvents(events) {
  if (app.events.paused) return;
  const filter = $("#event-pool").value;
  for (const e of events) if (!filter || e.pool === filter) app.events.pending.push(e);
  if (app.events.pending.length > EVENT_ROWS) app.events.pending.splice(0, app.events.pending.length - EVENT_ROWS);
  if (!app.events.frame) app.events.frame = requestAnimationFrame(renderEvents);
}

function renderEvents() {
  app.events.frame = 0;
  const pending = app.events.pending;
  app.events.pending = [];
  const body = $("#event-table tbody");
  const fragment = document.createDocumentFragment();
  for (let i = pending.length - 1; i >= 0; i--) {
    const e = pending[i];
    const row = document.createElement("tr");
    row.dataset.id = e.id;
    row.tabIndex = 0;   // (drawer.js opens its task on a click, keys.js on Enter)
    row.append(cell(time(e.at_unix_ns)), cell(e.id), cell(e.pool), cell(e.key),
               cell(e.status, "status status-" + e.status), cell(attemptText(e.attempt, e.max_attempts)),
               cell(e.message, "message"));
    fragment.append(row);
  }
  body.prepend(fragment);
  while (body.children.length > EVENT_ROWS) body.lastChild.remove();
  app.events.count += pending.length;
  const seconds = (performance.now() - app.events.since) / 1000;
  if (seconds > 2) {
    $("#event-rate").textContent = `${(app.events.count / seconds).toFixed(1)} events/s`;
    app.events.count = 0;
    app.events.since = performance.now();
  }
}

// ------------------------------------------------------------------ workers, recurring, dead letters

async function loadWorkers() {
  $("#workers-error").textContent = "";
  try {
    const answer = await api("/v1/workers");
    $("#worker-table tbody").replaceChildren(...answer.workers.map((w) => {
      const row = document.createElement("tr");
      row.dataset.id = w.id;
      if (w.health === "suspect") row.classList.add("suspect");
      row.append(cell(w.id), cell(w.name), cell(w.pool),
                 cell(Object.entries(w.labels).map(([k, v]) => `${k}=${v}`).join(", ")), cell(w.slots), cell(w.busy),
                 cell(w.health), cell(w.lease_expiries), cell(dateTime(w.connected_unix_ns)));
      return row;
    }));
  } catch (err) {
    $("#workers-error").textContent = describe(err);
  }
}

async function loadRecurring() {
  $("#recurring-error").textContent = "";
  try {
    const answer = await api("/v1/recurring");
    $("#recurring-table tbody").replaceChildren(...answer.schedules.map((s) => {
      const row = document.createElement("tr");
      row.dataset.name = s.name;
      const remove = document.createElement("button");
      remove.type = "button";
      remove.textContent = "Remove";
      remove.title = "admin role";
      remove.addEventListener("click", () => removeSchedule(s.name));
      const actions = cell("");
      actions.append(remove);
      row.append(cell(s.name), cell(s.cron), cell(s.tz || "UTC"), cell(s.pool), cell(s.kind), cell(s.overlap),
                 cell(dateTime(s.next_unix_ns)), cell(s.last_task_id), actions);
      return row;
    }));
  } catch (err) {
    $("#recurring-error").textContent = describe(err);
  }
}

async function removeSchedule(name) {
  $("#recurring-error").textContent = "";
  try {
    await api("/v1/recurring/" + encodeURIComponent(name), {method: "DELETE"});
    await loadRecurring();
  } catch (err) {
    $("#recurring-error").textContent = describe(err);
  }
}

app.dead = {after: "0", next: null, again: new Map()};   // again: dead letter -> its new task

async function loadDead(first) {
  if (first) app.dead.after = "0";
  $("#dead-error").textContent = "";
  try {
    const params = new URLSearchParams({status: "dead_lettered", limit: "50"});
    if (app.dead.after !== "0") params.set("after", app.dead.after);
    const page = await api("/v1/tasks?" + params);
    app.dead.next = page.next_after || null;
    $("#dead-next").disabled = !app.dead.next;
    $("#dead-table tbody").replaceChildren(...page.tasks.map((t) => {
      const row = document.createElement("tr");
      row.dataset.id = t.id;
      const again = document.createElement("button");
      again.type = "button";
      again.textContent = "Submit again";
      again.title = "admin role";
      again.addEventListener("click", () => resubmit(t.id, row));
      const actions = cell("");
      if (app.dead.again.has(t.id)) actions.textContent = "submitted again as task " + app.dead.again.get(t.id);
      else actions.append(again);
      row.append(cell(t.id), cell(t.pool), cell(t.key), cell(t.kind), cell(attemptText(t.attempt, t.max_attempts)),
                 cell(t.message, "message"),
                 cell(dateTime(t.finished_unix_ns)), actions);
      return row;
    }));
  } catch (err) {
    $("#dead-error").textContent = describe(err);
  }
}

async function resubmit(id, row) {
  $("#dead-error").textContent = "";
  try {
    const answer = await api(`/v1/tasks/${id}:resubmit`, {method: "POST"});
    app.dead.again.set(id, answer.id);
    row.lastChild.textContent = "submitted again as task " + answer.id;
  } catch (err) {
    $("#dead-error").textContent = describe(err);
  }
}

// ------------------------------------------------------------------ wiring

function readFilters() {
  const form = $("#task-filters");
  const data = new FormData(form);
  app.tasks.filters = Object.fromEntries([...data.entries()].map(([k, v]) => [k, String(v).trim()]));
  app.tasks.after = "0";
  app.tasks.cursors = [];
}

document.addEventListener("DOMContentLoaded", () => {
  const status = $("#task-filters [name=status]");
  for (const s of STATUSES) status.append(option(s, s));
  readFilters();
  $("#login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("#token").value.trim());
  });
  $("#logout").addEventListener("click", () => signOut());
  window.addEventListener("hashchange", () => { if (app.token !== null) route(location.hash, show); });
  $("#task-filters").addEventListener("submit", (event) => {
    event.preventDefault();
    readFilters();
    loadTasks();
  });
  $("#next-page").addEventListener("click", () => {
    if (!app.tasks.next) return;
    app.tasks.cursors.push(app.tasks.after);
    app.tasks.after = app.tasks.next;
    loadTasks();
  });
  $("#first-page").addEventListener("click", () => {
    app.tasks.after = "0";
    app.tasks.cursors = [];
    loadTasks();
  });
  $("#task-table tbody").addEventListener("click", (event) => {
    const row = event.target.closest("tr");
    if (row) openDrawer(row.dataset.id);
  });
  $("#drawer-close").addEventListener("click", closeDrawer);
  $("#drawer-cancel").addEventListener("click", cancelTask);
  $("#event-pause").addEventListener("click", () => {
    app.events.paused = !app.events.paused;
    $("#event-pause").textContent = app.events.paused ? "Resume" : "Pause";
  });
  $("#dead-next").addEventListener("click", () => {
    if (app.dead.next) { app.dead.after = app.dead.next; loadDead(false); }
  });
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved !== null) signIn(saved);
});

export {
  app, api, ApiError, describe, $, cell, option, time, dateTime, seconds, show, refreshPage, openDrawer, closeDrawer,
  on, registerPage, readFilters, STATUSES, TERMINAL, CLASSES,
};
