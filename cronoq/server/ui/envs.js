// Environments: the header says which deployment this page shows
// ("prod · eu-west-1", from the stream's hello and snapshots), and a switcher
// lists the catalog's environments (GET /v1/environments). Choosing one
// navigates this tab to that environment's own dashboard, {http}/ui/, with
// the same hash (the page and its state). Each environment is its own origin:
// its token lives in that origin's sessionStorage for this tab, so signing
// in on one never shows its token to another, and coming back finds the
// first one still signed in. Navigation only: no request ever leaves this
// origin (the CSP's connect-src 'self' stays as it is).

import {api, on, $} from "./app.js";

function showIdentity(data) {
  const text = [data.environment, data.region].filter(Boolean).join(" · ");
  const badge = $("#env-identity");
  badge.textContent = text;
  badge.hidden = !text;
  badge.dataset.environment = data.environment || "";
  badge.dataset.region = data.region || "";
  document.title = text ? `cronoq ${text}` : "cronoq dashboard";
}

// The dashboard of an environment, at the same place (hash) as this page; null without an http URL.
function dashboardOf(http) {
  if (!http) return null;
  let url;
  try { url = new URL("/ui/", http); } catch (err) { return null; }
  if (url.protocol !== "http:" && url.protocol !== "https:") return null;
  url.hash = location.hash;
  return url.href;
}

function label(env) {
  const name = env.region ? `${env.name} · ${env.region}` : env.name;
  if (env.current) return `${name} (this server)`;
  return env.http ? name : `${name} (no HTTP URL)`;
}

async function loadCatalog() {
  const picker = $("#env-picker");
  let answer;
  try {
    answer = await api("/v1/environments");
  } catch (err) {
    picker.hidden = true;   // (a role without it, or an older server: the page works without a switcher)
    return;
  }
  showIdentity(answer);
  const select = $("#env-switch");
  const options = [];
  if (!answer.environments.some((env) => env.current)) {
    const here = document.createElement("option");
    here.value = "";
    here.textContent = "this server";   // (an unnamed one: a named server is in its catalog)
    here.selected = true;
    options.push(here);
  }
  for (const env of answer.environments) {
    const option = document.createElement("option");
    option.value = env.name;
    option.textContent = label(env);
    option.selected = env.current;
    const target = env.current ? null : dashboardOf(env.http);
    if (target) option.dataset.target = target;
    option.disabled = !env.current && !target;
    options.push(option);
  }
  select.replaceChildren(...options);
  picker.hidden = answer.environments.length === 0;
}

on("hello", (data) => {
  showIdentity(data);
  loadCatalog();
});
on("snapshot", showIdentity);

document.addEventListener("DOMContentLoaded", () => {
  $("#env-switch").addEventListener("change", (event) => {
    const option = event.target.selectedOptions[0];
    if (!option || !option.dataset.target) return;
    const target = new URL(option.dataset.target);
    target.hash = location.hash;   // (the hash as it is now, not as it was when the list was drawn)
    location.assign(target.href);
  });
});
