// Finding and acting on tasks: the search box and sort order of the Tasks
// page, sortable columns with a duration column, deep links (the address
// holds the filters, the open task, the highlighted pool), the Submit task
// page, and bulk cancel / submit again of the selected rows.

import {
  app, api, describe, $, dateTime, show, openDrawer, readFilters, option, on, registerPage, TERMINAL,
} from "./app.js";
import { onRoute, setHash } from "./router.js";

const FILTERS = ["pool", "status", "priority", "tenant", "key", "q", "order", "limit"];
const DEFAULTS = {order: "newest", limit: "50"};

// ------------------------------------------------------------------ the address

// The hash of the Tasks page's current filters: #tasks?pool=a&q=x&order=newest.
function tasksHash() {
  const params = new URLSearchParams();
  const f = app.tasks.filters;
  for (const name of FILTERS) {
    const value = f[name] || DEFAULTS[name] || "";
    if (value && (name === "order" || value !== DEFAULTS[name])) params.set(name, value);
  }
  return "#tasks?" + params.toString();
}

// Puts the filters of an address into the form and reads them (a cold open or a link).
function applyFilters(params) {
  const form = $("#task-filters");
  for (const name of FILTERS) {
    const field = form.elements[name];
    if (!field) continue;
    const value = params.get(name) || DEFAULTS[name] || "";
    // A pool not listed yet (the list comes with the stream's hello): offered until then.
    if (field.tagName === "SELECT" && value && ![...field.options].some((o) => o.value === value)) {
      field.append(option(value, value));
    }
    field.value = value;
  }
  readFilters();
}

function showTasks({params}) {
  // "#tasks" alone (the menu) keeps the filters as they are; with a query it sets them.
  if ([...params.keys()].length) applyFilters(params);
  show("tasks");
  setHash(tasksHash());
}

onRoute("tasks", showTasks);

onRoute("task", ({arg}) => {
  if (app.page !== "tasks") show("tasks");
  if (arg && /^[0-9]+$/.test(arg)) openDrawer(arg);
});

onRoute("pool", ({arg}) => {
  app.highlightPool = arg || null;
  app.highlightScrolled = false;
  show("overview");
  highlightPool();
});

// The highlighted pool's card (#pool/NAME): marked, scrolled to once, its tasks a link away.
function highlightPool() {
  const tasksLink = $('#nav a[data-page="tasks"]');
  const name = app.page === "overview" ? app.highlightPool : null;
  tasksLink.href = name ? "#tasks?" + new URLSearchParams({pool: name, order: "newest"}) : "#tasks";
  for (const card of document.querySelectorAll("#pools article.pool")) {
    const chosen = card.dataset.pool === name;
    card.classList.toggle("highlight", chosen);
    if (chosen) card.setAttribute("aria-current", "true");
    else card.removeAttribute("aria-current");
    if (chosen && !app.highlightScrolled) {
      app.highlightScrolled = true;
      card.scrollIntoView({block: "center"});
    }
  }
}

// Every pool card links to its own address and to its tasks.
function linkPoolCards() {
  for (const card of document.querySelectorAll("#pools article.pool")) {
    if (card.querySelector("a.pool-tasks")) continue;
    const name = card.dataset.pool;
    const title = card.querySelector("h2");
    const self = document.createElement("a");
    self.href = "#pool/" + encodeURIComponent(name);
    self.textContent = name;
    self.className = "pool-link";
    title.replaceChildren(self);
    const tasks = document.createElement("a");
    tasks.href = "#tasks?" + new URLSearchParams({pool: name, order: "newest"});
    tasks.className = "pool-tasks";
    tasks.textContent = "its tasks";
    title.append(" ", tasks);
  }
}

on("snapshot", () => {
  if (app.page !== "overview") return;
  linkPoolCards();
  highlightPool();
});

window.addEventListener("hashchange", () => {
  if (!location.hash.startsWith("#pool/")) {
    app.highlightPool = null;
    highlightPool();
  }
});

// ------------------------------------------------------------------ durations and sorting

function formatDuration(ms) {
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

// Finished - started, or "running for ..." (null: it has not started).
function durationOf(row) {
  const started = row.dataset.started;
  if (!started) return null;
  const finished = row.dataset.finished;
  const end = finished ? BigInt(finished) : BigInt(Date.now()) * 1000000n;
  const ms = Number((end - BigInt(started)) / 1000000n);
  return {ms, running: !finished};
}

function showDuration(row) {
  const td = row.querySelector("td.duration");
  if (!td) return;
  const d = durationOf(row);
  td.textContent = d === null ? "" : (d.running ? "running for " : "") + formatDuration(d.ms);
}

on("task-row", ({row, task}) => {
  if (task.created_unix_ns) row.dataset.created = task.created_unix_ns;
  if (task.started_unix_ns) row.dataset.started = task.started_unix_ns;
  if (task.finished_unix_ns && TERMINAL.has(task.status)) row.dataset.finished = task.finished_unix_ns;
  const first = row.firstElementChild;
  const box = document.createElement("input");
  box.type = "checkbox";
  box.className = "pick";
  box.checked = picked.has(task.id);
  box.setAttribute("aria-label", "select task " + task.id);
  first.prepend(box, " ");
  const created = row.children[8];
  if (created) created.className = "created";
  const td = document.createElement("td");
  td.className = "duration";
  row.append(td);
  showDuration(row);
});

// Status events move the durations: a start, an end.
on("status", (events) => {
  for (const e of events) {
    const row = app.taskRows.get(e.id);
    if (!row || !e.at_unix_ns) continue;
    if (e.status === "running") {
      row.dataset.started = e.at_unix_ns;
      delete row.dataset.finished;
    } else if (TERMINAL.has(e.status) && row.dataset.started && !row.dataset.finished) {
      row.dataset.finished = e.at_unix_ns;
    }
    showDuration(row);
  }
  if (sorting.column) sortRows();
  showSelection();
});

setInterval(() => {
  if (app.page !== "tasks") return;
  for (const row of app.taskRows.values()) if (row.dataset.started && !row.dataset.finished) showDuration(row);
}, 1000);

// The page's rows sorted by one column (a click on its header); null: the server's order.
const sorting = {column: null, descending: false};

const SORT_KEYS = {
  id: (row) => BigInt(row.dataset.id),
  key: (row) => row.children[2].textContent,
  kind: (row) => row.children[3].textContent,
  status: (row) => row.dataset.status || "",
  created: (row) => BigInt(row.dataset.created || "0"),
  duration: (row) => { const d = durationOf(row); return d === null ? -1 : d.ms; },
};

function compare(a, b) {
  if (typeof a === "string") return a.localeCompare(b);
  return a < b ? -1 : a > b ? 1 : 0;
}

function sortRows() {
  const body = $("#task-table tbody");
  const rows = [...body.children];
  if (sorting.column) {
    const keyOf = SORT_KEYS[sorting.column];
    const sign = sorting.descending ? -1 : 1;
    const keyed = rows.map((row) => [keyOf(row), row]);
    keyed.sort((x, y) => sign * compare(x[0], y[0]) || compare(BigInt(x[1].dataset.id), BigInt(y[1].dataset.id)));
    const sorted = keyed.map(([, row]) => row);
    if (sorted.some((row, i) => row !== rows[i])) body.replaceChildren(...sorted);
  }
  showSortState();
}

function showSortState() {
  const newest = (app.tasks.filters.order || "newest") === "newest";
  for (const th of document.querySelectorAll("#task-table th[data-sort]")) {
    let state = null;
    if (sorting.column === th.dataset.sort) state = sorting.descending ? "descending" : "ascending";
    else if (!sorting.column && th.dataset.sort === "id") state = newest ? "descending" : "ascending";
    if (state) th.setAttribute("aria-sort", state);
    else th.removeAttribute("aria-sort");
  }
}

function setUpSortHeaders() {
  for (const th of document.querySelectorAll("#task-table th[data-sort]")) {
    const name = th.dataset.sort;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "sort";
    button.dataset.sort = name;
    button.textContent = name;
    // (the header's own text becomes the button; the id header keeps its select-all box)
    for (const node of [...th.childNodes]) if (node.nodeType === Node.TEXT_NODE) node.remove();
    th.append(button);
    button.addEventListener("click", () => {
      sorting.descending = sorting.column === name ? !sorting.descending : false;
      sorting.column = name;
      sortRows();
    });
  }
}

on("tasks-rendered", () => {
  sortRows();
  showSelection();
});

// ------------------------------------------------------------------ bulk actions

const picked = new Set();   // ids of the selected rows (kept while they are shown)

function showSelection() {
  for (const id of [...picked]) if (!app.taskRows.has(id)) picked.delete(id);
  const rows = [...app.taskRows.values()];
  const n = picked.size;
  $("#bulk-count").textContent = n ? `${n} selected` : "none selected";
  $("#bulk-cancel").disabled = !n;
  const dead = rows.filter((row) => picked.has(row.dataset.id) && row.dataset.status === "dead_lettered");
  $("#bulk-resubmit").disabled = !dead.length;
  const all = $("#pick-all");
  all.checked = rows.length > 0 && n === rows.length;
  all.indeterminate = n > 0 && n < rows.length;
}

function pickedRows() {
  return [...app.taskRows.values()].filter((row) => picked.has(row.dataset.id));
}

// Asks with the <dialog>; resolves to true on Confirm.
function confirmAction(question, detail) {
  const dialog = $("#bulk-dialog");
  $("#bulk-question").textContent = question;
  $("#bulk-detail").textContent = detail || "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "confirm"), {once: true});
    dialog.returnValue = "";
    dialog.showModal();
  });
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

function resultItem(text, ok) {
  const li = document.createElement("li");
  li.textContent = text;
  li.className = ok ? "ok" : "error";
  return li;
}

async function bulkCancel() {
  const ids = pickedRows().map((row) => row.dataset.id);
  if (!ids.length) return;
  const live = pickedRows().filter((row) => !TERMINAL.has(row.dataset.status)).length;
  const sure = await confirmAction(`Cancel ${plural(ids.length, "task")}?`,
    live === ids.length ? "" : `${ids.length - live} of them already finished: those stay as they are.`);
  if (!sure) return;
  const list = $("#bulk-results");
  list.replaceChildren();
  try {
    const answer = await api("/v1/tasks:cancel", {method: "POST", headers: {"content-type": "application/json"},
                                                  body: JSON.stringify({ids})});
    list.dataset.action = "cancel";
    list.replaceChildren(...answer.results.map((r) => {
      const li = resultItem(`task ${r.id}: ${r.error ? r.error : r.cancelled ? "cancelled" : "had already finished"}`,
                            !r.error);
      li.dataset.id = r.id;
      li.dataset.result = r.error ? "error" : r.cancelled ? "cancelled" : "finished";
      return li;
    }));
    picked.clear();
  } catch (err) {
    list.replaceChildren(resultItem(describe(err), false));
  }
  refreshTasks();
}

async function bulkResubmit() {
  const rows = pickedRows();
  const ids = rows.filter((row) => row.dataset.status === "dead_lettered").map((row) => row.dataset.id);
  if (!ids.length) return;
  const skipped = rows.length - ids.length;
  const sure = await confirmAction(`Submit ${plural(ids.length, "dead-lettered task")} again?`,
    "Each becomes a new task with its payload and options, without its key, dependencies or fixed start." +
    (skipped ? ` ${plural(skipped, "selected task")} not dead-lettered ${skipped === 1 ? "is" : "are"} left out.` : ""));
  if (!sure) return;
  const list = $("#bulk-results");
  list.replaceChildren();
  try {
    const answer = await api("/v1/tasks:resubmit", {method: "POST", headers: {"content-type": "application/json"},
                                                    body: JSON.stringify({ids})});
    list.dataset.action = "resubmit";
    list.replaceChildren(...answer.results.map((r) => {
      const li = resultItem(r.error ? `task ${r.id}: ${r.error}` : `task ${r.id}: submitted again as `, !r.error);
      if (!r.error) li.append(taskLink(r.new_id));
      li.dataset.id = r.id;
      li.dataset.result = r.error ? "error" : "resubmitted";
      return li;
    }));
    picked.clear();
  } catch (err) {
    list.replaceChildren(resultItem(describe(err), false));
  }
  refreshTasks();
}

function refreshTasks() {
  for (const row of app.taskRows.values()) {
    const box = row.querySelector("input.pick");
    if (box) box.checked = false;
  }
  showSelection();
  if (app.page === "tasks") show("tasks");
}

function taskLink(id) {
  const a = document.createElement("a");
  a.href = "#task/" + id;
  a.textContent = "task " + id;
  a.dataset.id = id;
  return a;
}

// ------------------------------------------------------------------ the submit form

// The form is made from the server's own description of POST /v1/tasks, so it offers every option.
let submitSchema = null;

async function loadSubmitForm() {
  if (submitSchema) return;
  const form = $("#submit-form");
  try {
    const doc = await api("/v1/openapi.json");
    submitSchema = doc.components.schemas;
  } catch (err) {
    $("#submit-error").textContent = "The form needs /v1/openapi.json: " + describe(err);
    return;
  }
  const fields = submitSchema.SubmitRequest.properties;
  const parts = [payloadField(fields)];
  for (const [name, schema] of Object.entries(fields)) {
    if (name === "payload" || name === "payload_b64" || name === "payload_text") continue;
    parts.push(fieldFor(name, schema, ""));
  }
  const send = document.createElement("button");
  send.type = "submit";
  send.textContent = "Submit";
  form.replaceChildren(...parts, send);
}

function labelled(name, control, help) {
  const label = document.createElement("label");
  label.className = "field";
  label.dataset.field = name;
  const title = document.createElement("span");
  title.textContent = name;
  label.append(title, control);
  if (help) {
    const note = document.createElement("small");
    note.textContent = help;
    label.append(note);
  }
  return label;
}

function payloadField(fields) {
  const box = document.createElement("fieldset");
  box.className = "payload";
  const legend = document.createElement("legend");
  legend.textContent = "payload";
  const as = document.createElement("select");
  as.name = "payload_as";
  as.append(option("payload", "JSON"), option("payload_text", "text"), option("payload_b64", "base64"));
  const text = document.createElement("textarea");
  text.name = "payload_value";
  text.rows = 4;
  text.placeholder = '{"report": 42}';
  const help = document.createElement("small");
  help.textContent = "JSON: " + (fields.payload.description || "") + " Empty: no payload.";
  as.addEventListener("change", () => {
    const chosen = fields[as.value];
    help.textContent = (chosen && chosen.description) || "";
  });
  box.append(legend, labelled("as", as), text, help);
  return box;
}

function resolve(schema) {
  if (schema && schema.$ref) return submitSchema[schema.$ref.split("/").pop()];
  return schema;
}

// One input per option; its name is the option's path (retry.max_attempts) and data-kind says how to read it.
function fieldFor(name, schema, prefix) {
  const path = prefix + name;
  const described = schema.description || "";
  const target = resolve(schema);
  if (target && target.type === "object" && target.properties) {
    const box = document.createElement("fieldset");
    box.dataset.field = path;
    const legend = document.createElement("legend");
    legend.textContent = name;
    box.append(legend);
    if (target.description || described) {
      const note = document.createElement("small");
      note.textContent = described || target.description;
      box.append(note);
    }
    for (const [inner, innerSchema] of Object.entries(target.properties)) box.append(fieldFor(inner, innerSchema, path + "."));
    return box;
  }
  let control, kind;
  if (schema.enum) {
    control = document.createElement("select");
    control.append(option("", "(default)"), ...schema.enum.map((v) => option(v, v)));
    kind = "text";
  } else if (schema.type === "boolean") {
    control = document.createElement("select");
    control.append(option("", "(default)"), option("true", "true"), option("false", "false"));
    kind = "boolean";
  } else if (schema.type === "number" || schema.type === "integer") {
    control = document.createElement("input");
    control.type = "number";
    control.step = schema.type === "integer" ? "1" : "any";
    kind = schema.type;
  } else if (name.endsWith("_unix_ns")) {
    control = document.createElement("input");
    control.type = "datetime-local";
    control.step = "1";
    kind = "time";
  } else if (schema.type === "object") {
    control = document.createElement("textarea");
    control.rows = 2;
    control.placeholder = "name=value, one a line";
    kind = schema.additionalProperties && schema.additionalProperties.type === "integer" ? "map-int" : "map";
  } else if (schema.type === "array") {
    const items = resolve(schema.items) || {};
    if (items.properties && items.properties.cond) {
      control = document.createElement("textarea");
      control.rows = 2;
      control.placeholder = "a key or an id, then on_success, on_failure or on_complete; one a line";
      kind = "deps";
    } else {
      control = document.createElement("input");
      control.placeholder = items.oneOf ? "keys or ids, comma-separated" : "comma-separated";
      kind = items.oneOf ? "refs" : "list";
    }
  } else {
    control = document.createElement("input");
    kind = "text";
  }
  control.name = path;
  control.dataset.kind = kind;
  return labelled(name, control, described);
}

// The request body from the form: empty fields left out. Errors of the form itself say which field.
function readSubmitForm(form) {
  const body = {};
  const as = form.elements.payload_as.value;
  const raw = form.elements.payload_value.value;
  if (raw.trim()) {
    if (as === "payload") {
      try { body.payload = JSON.parse(raw); } catch (err) { throw new Error(`payload: not JSON (${err.message})`); }
    } else {
      body[as] = as === "payload_b64" ? raw.trim() : raw;
    }
  }
  for (const control of form.querySelectorAll("[data-kind]")) {
    const text = control.value.trim();
    if (!text) continue;
    const path = control.name.split(".");
    const value = readValue(control.name, control.dataset.kind, text);
    let holder = body;
    for (const part of path.slice(0, -1)) holder = holder[part] = holder[part] || {};
    holder[path[path.length - 1]] = value;
  }
  return body;
}

function readValue(name, kind, text) {
  if (kind === "number" || kind === "integer") {
    const n = Number(text);
    if (!Number.isFinite(n)) throw new Error(`${name}: not a number`);
    return n;
  }
  if (kind === "boolean") return text === "true";
  if (kind === "time") {
    const ms = new Date(text).getTime();
    if (!Number.isFinite(ms)) throw new Error(`${name}: not a date and time`);
    return String(BigInt(ms) * 1000000n);
  }
  if (kind === "list") return text.split(",").map((s) => s.trim()).filter(Boolean);
  if (kind === "refs") {
    return text.split(",").map((s) => s.trim()).filter(Boolean).map((s) => /^[0-9]+$/.test(s) ? {id: s} : s);
  }
  if (kind === "deps") {
    return text.split("\n").map((line) => line.trim()).filter(Boolean).map((line) => {
      const [ref, cond] = line.split(/\s+/);
      const dep = /^[0-9]+$/.test(ref) ? {id: ref} : {key: ref};
      if (cond) dep.cond = cond;
      return dep;
    });
  }
  if (kind === "map" || kind === "map-int") {
    const out = {};
    for (const line of text.split("\n")) {
      if (!line.trim()) continue;
      const at = line.indexOf("=");
      if (at <= 0) throw new Error(`${name}: write name=value, one a line (got ${JSON.stringify(line.trim())})`);
      const value = line.slice(at + 1).trim();
      out[line.slice(0, at).trim()] = kind === "map-int" ? Number(value) : value;
    }
    return out;
  }
  return text;
}

// The server's refusal points at a field ("key: ..." , "retry.max_attempts: ..."): mark it.
function markField(message) {
  for (const label of document.querySelectorAll("#submit-form [aria-invalid]")) label.removeAttribute("aria-invalid");
  const found = message.replace(/^\d+: /, "").match(/^([A-Za-z_][\w.]*)/);
  const name = found ? found[1] : "";
  const control = $("#submit-form").elements[name] ||
    (PAYLOAD_NAMES.includes(name) ? $("#submit-form").elements.payload_value : null);
  if (control && control.setAttribute) {
    control.setAttribute("aria-invalid", "true");
    control.focus();
  }
}

const PAYLOAD_NAMES = ["payload", "payload_b64", "payload_text", "content_type"];

async function submitTask(event) {
  event.preventDefault();
  const form = event.target;
  const error = $("#submit-error");
  const done = $("#submit-done");
  error.textContent = "";
  done.replaceChildren();
  let body;
  try {
    body = readSubmitForm(form);
  } catch (err) {
    error.textContent = err.message;
    markField(err.message);
    return;
  }
  try {
    const answer = await api("/v1/tasks", {method: "POST", headers: {"content-type": "application/json"},
                                           body: JSON.stringify(body)});
    for (const label of form.querySelectorAll("[aria-invalid]")) label.removeAttribute("aria-invalid");
    done.append(answer.duplicate ? "That key's task already exists: " : "Submitted: ", taskLink(answer.id));
    if (answer.result) done.append(` (${answer.result.status})`);
  } catch (err) {
    // A refusal of the request (400) is the server's own words, naming the field.
    error.textContent = err.status === 400 ? err.message.replace(/^400: /, "") : describe(err);
    markField(err.message);
  }
}

registerPage("submit", {refresh: loadSubmitForm});

// ------------------------------------------------------------------ wiring

const filters = $("#task-filters");
// Filters apply as they change; the address follows (replaceState: no new history entry per keystroke).
filters.addEventListener("submit", () => { setTimeout(() => setHash(tasksHash()), 0); });
filters.addEventListener("change", (event) => {
  if (event.target.tagName === "SELECT") filters.requestSubmit();
});
let typing = null;
$("#task-search").addEventListener("input", () => {
  clearTimeout(typing);
  typing = setTimeout(() => filters.requestSubmit(), 300);
});

// "/" focuses the search box (unless one is typing in a field already).
document.addEventListener("keydown", (event) => {
  if (event.key !== "/" || event.ctrlKey || event.metaKey || event.altKey) return;
  const target = event.target;
  if (target.closest && target.closest("input, textarea, select, [contenteditable]")) return;
  if ($("#nav").hidden) return;
  event.preventDefault();
  if (app.page !== "tasks") {
    show("tasks");
    setHash(tasksHash());
  }
  $("#task-search").focus();
  $("#task-search").select();
});

const table = $("#task-table");
// A click on a row's box selects it; it does not open the drawer.
table.addEventListener("click", (event) => {
  if (event.target.matches && event.target.matches("input.pick, #pick-all")) event.stopPropagation();
}, true);
table.addEventListener("change", (event) => {
  const target = event.target;
  if (target.id === "pick-all") {
    for (const row of app.taskRows.values()) {
      const box = row.querySelector("input.pick");
      if (box) box.checked = target.checked;
      if (target.checked) picked.add(row.dataset.id);
      else picked.delete(row.dataset.id);
    }
  } else if (target.matches("input.pick")) {
    const id = target.closest("tr").dataset.id;
    if (target.checked) picked.add(id);
    else picked.delete(id);
  }
  showSelection();
});
// The open task is in the address, #task/ID, however it was opened (a row, the
// graph, an event, the timeline); closed, the address is the page's again.
on("drawer", ({id, task}) => {
  if (!task) setHash("#task/" + id);
});
on("drawer-closed", () => {
  if (location.hash.startsWith("#task/")) setHash(app.page === "tasks" ? tasksHash() : "#" + app.page);
});
$("#bulk-cancel").addEventListener("click", bulkCancel);
$("#bulk-resubmit").addEventListener("click", bulkResubmit);
$("#submit-form").addEventListener("submit", submitTask);
// A link to a task from a result: opens its drawer over the Tasks page.
document.addEventListener("click", (event) => {
  const link = event.target.closest && event.target.closest("#submit-done a, #bulk-results a");
  if (!link) return;
  event.preventDefault();
  setHash(link.getAttribute("href"));
  if (app.page !== "tasks") show("tasks");
  openDrawer(link.dataset.id);
});
setUpSortHeaders();
showSortState();

export { tasksHash, formatDuration };
