// The run page (pages/templates/pages/run_detail.html): its live part asks again and again;
// a step's part (why it ended, outputs,
// spec, Puppet run) is asked for when its <details> opens, and again when its status changes
// while it is open (the live part swaps the status labels in: htmx's out-of-band swaps). A
// step chosen in the picture (its link, #step-<name>) opens.
(function () {
  "use strict";

  function label(details) {
    var status = details.querySelector("summary .log-status");
    return status ? status.textContent : "";
  }

  function load(details) {
    var part = details.querySelector(".step-detail");
    if (!part) { return; }
    part.dataset.status = label(details);
    fetch(part.dataset.url, { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : ""; })
      .then(function (html) {
        part.innerHTML = html;
        part.dispatchEvent(new CustomEvent("relay:part-loaded", { bubbles: true }));
      });
  }

  function openChosen() {
    var id = decodeURIComponent(window.location.hash.slice(1));
    var details = id ? document.getElementById(id) : null;
    if (details && details.matches("details.step")) { details.open = true; }
  }

  // <details> toggle events do not bubble: caught on their way down.
  document.addEventListener("toggle", function (event) {
    var details = event.target;
    if (details.matches && details.matches("details.step") && details.open) { load(details); }
  }, true);
  document.addEventListener("htmx:afterSettle", function () {
    document.querySelectorAll("details.step[open]").forEach(function (details) {
      var part = details.querySelector(".step-detail");
      if (part && part.dataset.status !== label(details)) { load(details); }
    });
  });
  // The live part asks again (its hx-trigger "again") when an ask changed nothing (204): at
  // once after the server waited for a change (pages.live), else a second later; and five
  // seconds after a failure. A changed part is swapped in and asks by itself ("load").
  document.addEventListener("htmx:afterRequest", function (event) {
    var live = event.detail.elt;
    if (!live || live.id !== "live" || !document.body.contains(live)) { return; }
    var xhr = event.detail.xhr;
    if (xhr && xhr.status === 204) {
      var waited = xhr.getResponseHeader("X-Live-Waited") === "1";
      setTimeout(function () { htmx.trigger(live, "again"); }, waited ? 0 : 1000);
    } else if (event.detail.failed || !xhr || xhr.status === 0) {
      setTimeout(function () { htmx.trigger(live, "again"); }, 5000);
    }
  });
  // A live part the server rendered once for every page watching the run has no CSRF token
  // in its forms (pages.views.live_part): each page adds its own as the form is sent.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.method.toLowerCase() !== "post" || form.querySelector("[name=csrfmiddlewaretoken]")) { return; }
    var token = document.createElement("input");
    token.type = "hidden";
    token.name = "csrfmiddlewaretoken";
    token.value = document.body.dataset.csrfToken;
    form.appendChild(token);
  }, true);
  window.addEventListener("hashchange", openChosen);
  document.addEventListener("DOMContentLoaded", openChosen);
})();
