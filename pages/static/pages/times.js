// Times on the pages: the server writes them in UTC and says so (pages.templatetags.pages.utc);
// here each is shown in the browser's own time zone, to the second, with the zone's name
// ("2026-11-26 06:18:28 GMT+1"), the UTC time kept as its title. Again after htmx swaps a
// part in.
(function () {
  "use strict";
  var format = new Intl.DateTimeFormat("en-GB", {
    year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit",
    hourCycle: "h23", timeZoneName: "short"
  });

  function local(time) {
    if (time.dataset.local) { return; }
    var moment = new Date(time.getAttribute("datetime"));
    if (isNaN(moment.getTime())) { return; }
    var part = {};
    format.formatToParts(moment).forEach(function (p) { part[p.type] = p.value; });
    time.title = time.textContent;
    time.textContent = part.year + "-" + part.month + "-" + part.day + " " + part.hour + ":" +
      part.minute + ":" + part.second + " " + part.timeZoneName;
    time.dataset.local = "true";
  }

  function all() { document.querySelectorAll("time[datetime]").forEach(local); }
  document.addEventListener("DOMContentLoaded", all);
  document.addEventListener("htmx:afterSettle", all);
  document.addEventListener("relay:part-loaded", all);
})();
