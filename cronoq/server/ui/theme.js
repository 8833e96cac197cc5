// The colour theme: the system's (prefers-color-scheme, the default), light or
// dark, chosen with the header's #theme-toggle and kept in localStorage
// ("cronoq.theme": a display preference, nothing sensitive). A classic script,
// not a module, loaded first in <head>: it runs before the page is drawn, so a
// page reloaded with a chosen theme never flashes the other one (a module
// would run only after the document is parsed).
//
// The palettes are in app.css; this only sets data-theme="light" or "dark" on
// <html>, or removes it for the system's. A script that draws with colours it
// cannot take from CSS can listen to the "cronoq:theme" event on document
// (detail: {choice, dark}), sent when the choice or the system's scheme changes.
(function () {
  "use strict";
  var KEY = "cronoq.theme";
  var CHOICES = ["system", "light", "dark"];
  var LABELS = {system: "system", light: "light", dark: "dark"};
  var root = document.documentElement;
  var system = window.matchMedia ? window.matchMedia("(prefers-color-scheme: dark)") : null;

  function stored() {
    try {
      var value = window.localStorage.getItem(KEY);
      return CHOICES.indexOf(value) > 0 ? value : "system";
    } catch (err) {
      return "system";   // storage refused (privacy settings): follow the system
    }
  }

  function isDark(choice) {
    return choice === "dark" || (choice === "system" && !!system && system.matches);
  }

  function apply(choice) {
    if (choice === "system") root.removeAttribute("data-theme");
    else root.setAttribute("data-theme", choice);
    var button = document.getElementById("theme-toggle");
    if (button) {
      var next = CHOICES[(CHOICES.indexOf(choice) + 1) % CHOICES.length];
      button.dataset.choice = choice;
      button.textContent = "Theme: " + LABELS[choice];
      button.title = (choice === "system" ? "The colour theme follows this device's setting" :
        "The colour theme is " + choice) + "; press for " + LABELS[next];
    }
    document.dispatchEvent(new CustomEvent("cronoq:theme", {detail: {choice: choice, dark: isDark(choice)}}));
  }

  function choose(choice) {
    try {
      if (choice === "system") window.localStorage.removeItem(KEY);
      else window.localStorage.setItem(KEY, choice);
    } catch (err) {
      // not kept: it applies to this page until it is reloaded
    }
    apply(choice);
  }

  apply(stored());
  if (system && system.addEventListener) {
    system.addEventListener("change", function () { apply(current()); });
  }
  // Another tab chose: follow it.
  window.addEventListener("storage", function (event) { if (event.key === KEY) apply(stored()); });

  function current() {
    var button = document.getElementById("theme-toggle");
    return button && button.dataset.choice ? button.dataset.choice : stored();
  }

  document.addEventListener("DOMContentLoaded", function () {
    var button = document.getElementById("theme-toggle");
    if (!button) return;
    apply(stored());
    button.addEventListener("click", function () {
      var choice = current();
      choose(CHOICES[(CHOICES.indexOf(choice) + 1) % CHOICES.length]);
    });
  });
})();
