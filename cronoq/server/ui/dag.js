// The drawer's DAG view: a task's dependencies (upstream, a few levels up, each
// read with GET /v1/tasks/{id}) and its dependents (downstream, from
// GET /v1/tasks/{id}/dependents), in layers left to right with arrows, each node
// coloured by its status. A click opens that task's drawer; the statuses follow
// the stream's status events.
import { app, api, describe, $, openDrawer, on } from "./app.js";

const SVG = "http://www.w3.org/2000/svg";
const UP_LEVELS = 3;          // dependencies of dependencies..., this many levels up
const DOWN_LEVELS = 3;        // dependents, this many levels down
const PER_LEVEL = 12;         // nodes drawn in one layer at most
const DOWN_LIMIT = 36;        // dependents asked for at most
const NODE_W = 112, NODE_H = 34, COL_W = 140, ROW_H = 42, PAD = 6;
const LABEL_CHARS = 16;   // of a name, on a node's first line
const FIT_WIDTH = 760;    // a view up to this wide shrinks to the drawer's width; a wider one scrolls

// What is drawn now: the drawer's task and its nodes by id (to follow their statuses).
const view = {id: null, nodes: new Map(), build: 0};

on("drawer", ({id, task}) => {
  if (task === null) {
    view.id = id;
    view.nodes = new Map();
    $("#drawer-dag").replaceChildren();
    return;
  }
  draw(id, task);
});

on("status", (events) => {
  for (const e of events) {
    const node = view.nodes.get(e.id);
    if (node && node.status !== e.status) {
      node.status = e.status;
      paint(node);
    }
  }
});

// A dependency as submitted (an id or a key), read; null when it cannot be.
async function readRef(dep) {
  try {
    return await api(dep.id ? `/v1/tasks/${dep.id}` : `/v1/tasks/by-key/${encodeURIComponent(dep.key)}`);
  } catch (err) {
    return null;
  }
}

// Upstream, level by level: [{node, below}] where below is the id of the node it is a dependency of.
async function upstream(task) {
  const found = new Map();   // id or "ref:" + the ref when unreadable -> node
  const edges = [];
  let frontier = [task];
  let more = 0;
  for (let level = 1; level <= UP_LEVELS && frontier.length; level++) {
    const asks = [];
    for (const child of frontier) {
      for (const dep of child.deps || []) asks.push({child, dep});
    }
    const read = await Promise.all(asks.map(({dep}) => readRef(dep)));
    const next = [];
    let drawn = 0;
    asks.forEach(({child, dep}, i) => {
      const parent = read[i];
      const ref = dep.id || dep.key;
      const id = parent ? parent.id : "ref:" + ref;
      let node = found.get(id);
      if (!node) {
        if (id === task.id) return;
        if (drawn >= PER_LEVEL) { more++; return; }
        drawn++;
        node = {id: parent ? parent.id : null, ref, key: parent ? parent.key : dep.key, role: "dependency",
                status: parent ? parent.status : "unknown", column: -level};
        found.set(id, node);
        if (parent) next.push(parent);
      }
      edges.push({from: node, to: child.id, cond: dep.cond});
    });
    frontier = next;
  }
  return {nodes: [...found.values()], edges, more};
}

async function downstream(id) {
  const answer = await api(`/v1/tasks/${id}/dependents?depth=${DOWN_LEVELS}&limit=${DOWN_LIMIT}`);
  const perLevel = new Map();
  const nodes = [];
  let more = answer.truncated ? 1 : 0;
  for (const d of answer.dependents) {
    const count = perLevel.get(d.depth) || 0;
    if (count >= PER_LEVEL) { more++; continue; }
    perLevel.set(d.depth, count + 1);
    nodes.push({id: d.id, key: d.key, role: "dependent", status: d.status, column: d.depth,
                dependsOn: d.depends_on});
  }
  const shown = new Set(nodes.map((n) => n.id).concat([id]));
  const edges = nodes.flatMap((n) => n.dependsOn.filter((p) => shown.has(p)).map((p) => ({from: p, to: n})));
  return {nodes, edges, more, answer};
}

async function draw(id, task) {
  const build = ++view.build;
  let up, down;
  try {
    [up, down] = await Promise.all([upstream(task), downstream(id)]);
  } catch (err) {
    if (build === view.build && app.drawerId === id) $("#drawer-dag").textContent = describe(err);
    return;
  }
  if (build !== view.build || app.drawerId !== id) return;   // another task, or a newer read, took over
  const self = {id, key: task.key, role: "self", status: task.status, column: 0};
  const nodes = [...up.nodes, self, ...down.nodes];
  const byId = new Map(nodes.filter((n) => n.id !== null).map((n) => [n.id, n]));
  const edges = [
    ...up.edges.map((e) => ({from: e.from, to: byId.get(e.to), cond: e.cond})),
    ...down.edges.map((e) => ({from: byId.get(e.from), to: e.to})),
  ].filter((e) => e.from && e.to);
  view.id = id;
  view.nodes = new Map(nodes.filter((n) => n.id !== null && n.role !== "self").map((n) => [n.id, n]));
  view.nodes.set(id, self);
  const holder = $("#drawer-dag");
  if (nodes.length === 1) {
    holder.textContent = "No dependencies, no dependents.";
    return;
  }
  holder.replaceChildren(render(nodes, edges));
  const left = up.more + down.more;
  if (left) {
    const note = document.createElement("p");
    note.className = "note";
    note.textContent = `Not drawn: ${left} more (the view shows ${UP_LEVELS} levels up and ${DOWN_LEVELS} down, ` +
      `${PER_LEVEL} tasks a level).`;
    holder.append(note);
  }
}

// Layers left to right: the furthest dependencies, ..., this task, ..., the furthest dependents.
function render(nodes, edges) {
  const columns = [...new Set(nodes.map((n) => n.column))].sort((a, b) => a - b);
  const rows = Math.max(...columns.map((c) => nodes.filter((n) => n.column === c).length));
  const width = columns.length * COL_W - (COL_W - NODE_W) + 2 * PAD;
  const height = rows * ROW_H - (ROW_H - NODE_H) + 2 * PAD;
  for (const c of columns) {
    const layer = nodes.filter((n) => n.column === c);
    const top = PAD + (height - 2 * PAD - (layer.length * ROW_H - (ROW_H - NODE_H))) / 2;
    layer.forEach((n, i) => {
      n.x = PAD + columns.indexOf(c) * COL_W;
      n.y = top + i * ROW_H;
    });
  }
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", width <= FIT_WIDTH ? "dag fit" : "dag");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", String(width));
  svg.setAttribute("height", String(height));
  svg.append(arrowHead());
  for (const e of edges) svg.append(edge(e));
  for (const n of nodes) svg.append(nodeElement(n));
  return svg;
}

function arrowHead() {
  const defs = document.createElementNS(SVG, "defs");
  const marker = document.createElementNS(SVG, "marker");
  Object.entries({id: "dag-arrow", viewBox: "0 0 8 8", refX: "8", refY: "4", markerWidth: "7", markerHeight: "7",
                  orient: "auto-start-reverse"}).forEach(([k, v]) => marker.setAttribute(k, v));
  const tip = document.createElementNS(SVG, "path");
  tip.setAttribute("d", "M0,0 L8,4 L0,8 z");
  marker.append(tip);
  defs.append(marker);
  return defs;
}

function edge({from, to, cond}) {
  const path = document.createElementNS(SVG, "path");
  const x1 = from.x + NODE_W, y1 = from.y + NODE_H / 2, x2 = to.x, y2 = to.y + NODE_H / 2;
  const bend = (x2 - x1) / 2;
  path.setAttribute("d", `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`);
  path.setAttribute("class", "edge");
  path.setAttribute("marker-end", "url(#dag-arrow)");
  path.dataset.from = String(from.id ?? from.ref);
  path.dataset.to = String(to.id);
  if (cond) {
    const title = document.createElementNS(SVG, "title");
    title.textContent = `runs on ${cond.replace("on_", "")}`;
    path.append(title);
  }
  return path;
}

function nodeElement(n) {
  const g = document.createElementNS(SVG, "g");
  g.dataset.role = n.role;
  if (n.id !== null) g.dataset.id = n.id;
  if (n.ref !== undefined) g.dataset.ref = n.ref;
  const box = document.createElementNS(SVG, "rect");
  Object.entries({x: n.x, y: n.y, width: NODE_W, height: NODE_H, rx: 4}).forEach(([k, v]) => box.setAttribute(k, v));
  const name = document.createElementNS(SVG, "text");
  name.setAttribute("class", "name");
  name.setAttribute("x", String(n.x + 6));
  name.setAttribute("y", String(n.y + NODE_H / 3));
  const status = document.createElementNS(SVG, "text");
  status.setAttribute("class", "status");
  status.setAttribute("x", String(n.x + 6));
  status.setAttribute("y", String(n.y + 2 * NODE_H / 3 + 1));
  const title = document.createElementNS(SVG, "title");
  g.append(title, box, name, status);
  n.element = g;
  paint(n);
  if (n.id !== null && n.role !== "self") {
    g.setAttribute("tabindex", "0");   // (keys.js presses it on Enter or Space)
    g.setAttribute("role", "button");
    g.addEventListener("click", () => openDrawer(n.id));
  }
  return g;
}

// A node's colour, its two lines (key or id, then status) and its tooltip.
function paint(n) {
  const g = n.element;
  if (!g) return;
  g.setAttribute("class", `node status-${n.status}`);
  g.dataset.status = n.status;
  const name = String(n.key || (n.id !== null ? "#" + n.id : n.ref));
  g.querySelector("text.name").textContent = name.length > LABEL_CHARS ? name.slice(0, LABEL_CHARS - 1) + "…" : name;
  g.querySelector("text.status").textContent = n.status;
  const what = {dependency: "a dependency", dependent: "a dependent", self: "this task"}[n.role];
  g.querySelector("title").textContent = `${n.key ? n.key + " " : ""}${n.id !== null ? "(task " + n.id + ")" : ""}` +
    `: ${n.status}, ${what}`;
}
