// Keyboard use of the dashboard: the shortcuts (and their help dialog, "?"),
// rows and other custom controls that open with Enter, the drawer's focus
// (moved into it when it opens, kept in it while it is open, given back to
// where it came from when it closes), the skip link and the page sections'
// labels. Generic on purpose, so it applies to what other modules add:
// - an element with tabindex="0" that is not a native control (a table row, an
//   SVG node, a div with role="button") is pressed by Enter or Space: it gets a
//   click event, so its click handler is all it needs;
// - the rows j and k move through are the focusable rows (tabindex) of the page
//   shown;
// - a module adds its own shortcut with addShortcut("g l", "Open the timeline", run).

import {app, closeDrawer} from "./app.js";

const SEQUENCE_MS = 1500;   // how long "g" waits for its second key
const shortcuts = [];       // {keys: ["g", "t"], description, run}
let pending = [];           // the keys typed so far of a sequence
let pendingTimer = 0;
let opener = null;          // where the focus was when the drawer opened
let openedId = null;

function addShortcut(keys, description, run) {
  shortcuts.push({keys: keys.split(" "), description, run});
}

const signedIn = () => app.token !== null && !document.getElementById("nav").hidden;
const drawer = () => document.getElementById("drawer");
const drawerOpen = () => !drawer().hidden;
const openDialog = () => document.querySelector("dialog[open]");

function goTo(page) {
  return () => {
    if (!signedIn()) return;
    if (location.hash === "#" + page) return;
    location.hash = "#" + page;
  };
}

addShortcut("g o", "Go to the overview", goTo("overview"));
addShortcut("g t", "Go to the tasks", goTo("tasks"));
addShortcut("g e", "Go to the events", goTo("events"));
addShortcut("g w", "Go to the workers", goTo("workers"));
addShortcut("g r", "Go to the recurring schedules", goTo("recurring"));
addShortcut("g d", "Go to the dead letters", goTo("dead"));
addShortcut("j", "Next row (with the drawer open: the next row's task)", () => moveRow(1));
addShortcut("k", "Previous row (with the drawer open: the previous row's task)", () => moveRow(-1));
addShortcut("?", "Show these shortcuts", () => showHelp());

// ------------------------------------------------------------------ rows

function rows() {
  const page = document.querySelector(".page:not([hidden])");
  if (!page) return [];
  return [...page.querySelectorAll("tbody tr[tabindex]")].filter((row) => row.getClientRects().length);
}

function moveRow(step) {
  const all = rows();
  if (!all.length) return;
  const from = drawerOpen() && all.includes(opener) ? opener : document.activeElement;
  const at = all.indexOf(from);
  const next = at < 0 ? all[step > 0 ? 0 : all.length - 1]
                      : all[Math.min(all.length - 1, Math.max(0, at + step))];
  if (drawerOpen()) {
    // The drawer stays open and keeps the focus: it shows the next row's task.
    if (next === from) return;
    opener = next;
    next.scrollIntoView({block: "nearest"});
    press(next);
  } else {
    next.focus();
    next.scrollIntoView({block: "nearest"});
  }
}

function press(element) {
  element.dispatchEvent(new MouseEvent("click", {bubbles: true, cancelable: true, view: window}));
}

const NATIVE = new Set(["A", "BUTTON", "INPUT", "SELECT", "TEXTAREA", "SUMMARY", "OPTION"]);

// Inputs that take no text (a checkbox of a row...) leave the shortcuts on.
const NOT_TYPED = new Set(["checkbox", "radio", "button", "submit", "reset", "range", "color", "file", "image"]);

function typing(target) {
  if (!(target instanceof Element)) return false;
  const field = target.closest("input, textarea, select, [contenteditable]:not([contenteditable=false])");
  return field !== null && !(field.tagName === "INPUT" && NOT_TYPED.has(field.type));
}

// ------------------------------------------------------------------ the drawer's focus

const FOCUSABLE = "a[href], button:not([disabled]), input:not([disabled]), select:not([disabled]), " +
                  "textarea:not([disabled]), summary, [tabindex]:not([tabindex='-1'])";

function focusables(container) {
  return [...container.querySelectorAll(FOCUSABLE)]
    .filter((el) => el.getClientRects().length && !el.closest("[hidden]"));
}

function drawerShown() {
  const active = document.activeElement;
  opener = active && active !== document.body && !drawer().contains(active) ? active : opener;
  openedId = app.drawerId;
  drawer().focus({preventScroll: true});
}

function drawerHidden() {
  let back = opener;
  if (!back || !back.isConnected || !back.getClientRects().length) {
    back = openedId === null ? null :
      document.querySelector(`.page:not([hidden]) tr[data-id="${CSS.escape(String(openedId))}"]`);
  }
  opener = null;
  openedId = null;
  if (back && back.getClientRects().length) back.focus();
}

// Tab and Shift+Tab go round the drawer's controls while it is open.
function trapTab(event) {
  const inside = focusables(drawer());
  if (!inside.length) {
    event.preventDefault();
    drawer().focus();
    return;
  }
  const first = inside[0], last = inside[inside.length - 1];
  const active = document.activeElement;
  if (!drawer().contains(active)) {
    event.preventDefault();
    (event.shiftKey ? last : first).focus();
  } else if (event.shiftKey && (active === first || active === drawer())) {
    event.preventDefault();
    last.focus();
  } else if (!event.shiftKey && active === last) {
    event.preventDefault();
    first.focus();
  }
}

// ------------------------------------------------------------------ the help dialog

function keyCaps(keys) {
  const holder = document.createElement("span");
  keys.forEach((key, i) => {
    if (i) holder.append(" then ");
    const kbd = document.createElement("kbd");
    kbd.textContent = key;
    holder.append(kbd);
  });
  return holder;
}

function showHelp() {
  let dialog = document.getElementById("shortcuts");
  if (!dialog) {
    dialog = document.createElement("dialog");
    dialog.id = "shortcuts";
    dialog.setAttribute("aria-labelledby", "shortcuts-title");
    document.body.append(dialog);
  }
  const title = document.createElement("h2");
  title.id = "shortcuts-title";
  title.textContent = "Keyboard shortcuts";
  const table = document.createElement("table");
  const head = table.createTHead().insertRow();
  for (const name of ["keys", "does"]) {
    const th = document.createElement("th");
    th.textContent = name;
    th.scope = "col";
    head.append(th);
  }
  const body = table.createTBody();
  const fixed = [[["Tab"], "Next control (Shift+Tab: the previous one)"], [["Enter"], "Open the focused row"],
                 [["Esc"], "Close the drawer or this dialog"]];
  for (const [keys, description] of [...shortcuts.map((s) => [s.keys, s.description]), ...fixed]) {
    const row = body.insertRow();
    row.dataset.keys = keys.join(" ");
    row.insertCell().append(keyCaps(keys));
    row.insertCell().textContent = description;
  }
  const note = document.createElement("p");
  note.className = "note";
  note.textContent = "Shortcuts are ignored while you type in a field.";
  const form = document.createElement("form");
  form.method = "dialog";
  const close = document.createElement("button");
  close.textContent = "Close";
  close.value = "close";
  form.append(close);
  dialog.replaceChildren(title, table, note, form);
  if (!dialog.open) dialog.showModal();
  close.focus();
}

// ------------------------------------------------------------------ the keys

function onKey(event) {
  if (event.defaultPrevented) return;
  if (event.key === "Tab" && drawerOpen() && !openDialog()) {
    trapTab(event);
    return;
  }
  if (event.key === "Escape") {
    pending = [];
    if (drawerOpen() && !openDialog()) {
      event.preventDefault();
      closeDrawer();
    }
    return;
  }
  const target = event.target;
  if ((event.key === "Enter" || event.key === " ") && target instanceof Element &&
      target.getAttribute("tabindex") === "0" && !NATIVE.has(target.tagName) && !typing(target)) {
    event.preventDefault();
    press(target);
    return;
  }
  if (event.ctrlKey || event.metaKey || event.altKey || typing(target) || event.key.length !== 1) return;
  if (openDialog()) return;   // (a dialog has the keyboard: Escape or its buttons close it)
  const typed = [...pending, event.key];
  const starts = shortcuts.filter((s) => typed.every((key, i) => s.keys[i] === key));
  clearTimeout(pendingTimer);
  if (!starts.length) {
    pending = [];
    return;
  }
  const done = starts.find((s) => s.keys.length === typed.length);
  if (done) {
    pending = [];
    event.preventDefault();
    done.run();
  } else {
    pending = typed;
    pendingTimer = setTimeout(() => { pending = []; }, SEQUENCE_MS);
  }
}

// ------------------------------------------------------------------ wiring

function labelPages() {
  // A page section is a region landmark named as its link in the header.
  for (const section of document.querySelectorAll("main > section.page")) {
    if (section.hasAttribute("aria-label") || section.hasAttribute("aria-labelledby")) continue;
    const link = document.querySelector(`#nav a[data-page="${CSS.escape(section.id)}"]`);
    const heading = section.querySelector("h2");
    const name = link ? link.textContent.trim() : heading ? heading.textContent.trim() : "";
    if (name) section.setAttribute("aria-label", name);
  }
}

// On a phone the page links are a strip that scrolls sideways: keep the current one in sight
// (a page reached by a shortcut too), without scrolling the page itself.
function revealCurrentLink() {
  const nav = document.getElementById("nav");
  const link = nav.querySelector("a.current");
  if (!link || nav.scrollWidth <= nav.clientWidth) return;
  const box = link.getBoundingClientRect(), strip = nav.getBoundingClientRect();
  if (box.left < strip.left) nav.scrollLeft -= strip.left - box.left + 8;
  else if (box.right > strip.right) nav.scrollLeft += box.right - strip.right + 8;
}

function start() {
  document.addEventListener("keydown", onKey);
  const skip = document.querySelector(".skip-link");
  if (skip) {
    // (the address's #... names the page shown: the link moves the focus without changing it)
    skip.addEventListener("click", (event) => {
      event.preventDefault();
      const main = document.getElementById("main");
      main.focus();
      main.scrollIntoView();
    });
  }
  // A click outside the open drawer (another row) is where Escape returns.
  document.addEventListener("focusin", (event) => {
    if (drawerOpen() && !drawer().contains(event.target) && !openDialog()) opener = event.target;
  });
  new MutationObserver(() => {
    const open = drawerOpen();
    if (open && drawer().dataset.wasOpen !== "1") drawerShown();
    if (!open && drawer().dataset.wasOpen === "1") drawerHidden();
    drawer().dataset.wasOpen = open ? "1" : "0";
  }).observe(drawer(), {attributes: true, attributeFilter: ["hidden"]});
  // Signed in: the form is gone, the focus goes to the content (not lost on the body).
  const login = document.getElementById("login-form");
  if (login) {
    login.addEventListener("submit", () => setTimeout(() => {
      if (document.getElementById("login").hidden) document.getElementById("main").focus();
    }));
  }
  labelPages();
  window.addEventListener("hashchange", () => requestAnimationFrame(revealCurrentLink));
  const help = document.getElementById("shortcuts-button");
  if (help) help.addEventListener("click", showHelp);
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();

export {addShortcut, showHelp};
