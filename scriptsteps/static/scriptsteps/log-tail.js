// The admin's run page and the pages' (pages/): each script step's log grows while the step runs. It asks the API
// (the admin's own session) for what came after what it shows, every 1.5 s, until the step
// has ended and everything was read.
(function () {
  "use strict";
  var KEEP = 20000; // characters kept on the page: a tail, not the whole log

  function follow(pre) {
    var url = pre.dataset.logUrl;
    var offset = parseInt(pre.dataset.offset, 10) || 0;
    function poll() {
      fetch(url + "?offset=" + offset, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (response) { return response.ok ? response.json() : null; })
        .then(function (body) {
          if (body === null) { return; }
          if (body.text) {
            var text = pre.textContent + body.text;
            pre.textContent = text.length > KEEP ? text.slice(text.length - KEEP) : text;
            pre.scrollTop = pre.scrollHeight;
          }
          offset = body.next_offset;
          var status = pre.parentNode.querySelector(".log-status");
          if (status) { status.textContent = body.status; }
          if (!body.complete) { setTimeout(poll, 1500); }
        })
        .catch(function () { setTimeout(poll, 5000); });
    }
    poll();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("pre[data-log-url][data-follow]").forEach(follow);
    // A log in a closed <details> (the run pages: one per step, 50 steps would be 50 pollers)
    // is followed from when it is first opened.
    document.querySelectorAll("details > pre[data-log-url][data-follow-when-open]").forEach(function (pre) {
      var details = pre.parentNode;
      function start() {
        if (details.open && !pre.dataset.followed) {
          pre.dataset.followed = "true";
          follow(pre);
        }
      }
      details.addEventListener("toggle", start);
      start();
    });
  });
})();
