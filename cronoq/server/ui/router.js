// The dashboard's addresses: the URL hash is the state. "#name" shows a page,
// "#name?a=1&b=2" a page with its state (filters), "#name/arg" one thing
// (a task, a pool). A feature module claims a name with onRoute; any other
// name is a page shown by the shell (app.js show).

const routes = new Map();

// {name, arg, params} of a hash such as "#tasks?pool=a", "#task/12", "#overview".
function parseHash(hash) {
  const text = String(hash || "").replace(/^#/, "");
  const mark = text.indexOf("?");
  const path = mark >= 0 ? text.slice(0, mark) : text;
  const params = new URLSearchParams(mark >= 0 ? text.slice(mark + 1) : "");
  const slash = path.indexOf("/");
  let arg = null;
  if (slash >= 0) {
    try { arg = decodeURIComponent(path.slice(slash + 1)); } catch (err) { arg = path.slice(slash + 1); }
  }
  return {name: slash >= 0 ? path.slice(0, slash) : path, arg, params};
}

function onRoute(name, handler) {
  routes.set(name, handler);
}

// Shows what ``hash`` names: a claimed route's handler, else fallback(page name).
function route(hash, fallback) {
  const parsed = parseHash(hash);
  const handler = routes.get(parsed.name);
  if (handler) handler(parsed);
  else fallback(parsed.name || "overview");
}

// Records the state in the address without showing anything again (no hashchange).
function setHash(hash, push = false) {
  if (location.hash === hash || (location.hash === "" && hash === "#")) return;
  history[push ? "pushState" : "replaceState"](null, "", hash);
}

export { parseHash, onRoute, route, setHash };
