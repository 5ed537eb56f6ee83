// notes-exports console: the little JavaScript the pages need (no framework, no network).
// 1. Times: every <time data-local datetime="…Z"> is shown in the browser's time zone; its
//    title keeps the UTC value, so hovering shows UTC.
// 2. Time filters: a datetime-local input (data-utc-name) holds local wall time; on submit
//    the same instant goes to the server in UTC under the name data-utc-name. Without
//    JavaScript the input is sent as it is and read as UTC (the label says so).
// htmx calls onLoad for the page and for every fragment it swaps in (live panels).
(function () {
  "use strict";
  var formatter = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short"
  });

  function pad(n) { return String(n).padStart(2, "0"); }

  function localInputValue(date) {
    return date.getFullYear() + "-" + pad(date.getMonth() + 1) + "-" + pad(date.getDate()) +
      "T" + pad(date.getHours()) + ":" + pad(date.getMinutes());
  }

  function localise(root) {
    root.querySelectorAll("time[data-local]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (!isNaN(d)) { el.textContent = formatter.format(d); }
    });
    root.querySelectorAll("input[data-utc-name]").forEach(function (input) {
      var utc = input.getAttribute("data-utc");
      var d = utc ? new Date(utc) : null;
      if (d && !isNaN(d)) { input.value = localInputValue(d); }
    });
    root.querySelectorAll("[data-zone-name]").forEach(function (el) {
      el.textContent = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
    });
  }

  document.addEventListener("submit", function (event) {
    event.target.querySelectorAll("input[data-utc-name]").forEach(function (input) {
      var d = input.value ? new Date(input.value) : null;
      if (d && !isNaN(d)) {
        var hidden = document.createElement("input");
        hidden.type = "hidden";
        hidden.name = input.getAttribute("data-utc-name");
        hidden.value = d.toISOString();
        input.form.appendChild(hidden);
      }
      input.disabled = true;  // the server reads the UTC value only
    });
  });
  window.addEventListener("pageshow", function () {
    document.querySelectorAll("input[type=datetime-local]").forEach(function (el) {
      el.disabled = false;
    });
  });

  if (window.htmx) {
    window.htmx.onLoad(localise);
  } else {
    document.addEventListener("DOMContentLoaded", function () { localise(document); });
  }
})();
