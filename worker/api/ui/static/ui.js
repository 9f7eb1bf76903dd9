// reactq operator UI: the only script besides htmx (the CSP allows no inline script).
// A run page holds <section id="live" data-events="/ui/runs/ID/events" data-fragment="/ui/runs/ID/live">:
// each event of the run's stream (server-sent events) makes htmx fetch the server-rendered fragment again,
// so all run text is escaped by the server's templates; no run data is put into the page by this script.
(function () {
  "use strict";
  var source = null;
  var pending = false;

  // Someone typing in the live part (a reason for rejecting) keeps it: the redraw waits until they leave.
  function typing() {
    var active = document.activeElement;
    var live = document.getElementById("live");
    return live !== null && active !== null && live.contains(active) &&
      (active.tagName === "INPUT" || active.tagName === "TEXTAREA") && active.value !== "";
  }

  function refresh(section) {
    if (pending) { return; }
    pending = true;
    window.setTimeout(function redraw() {
      if (typing()) { window.setTimeout(redraw, 1000); return; }
      pending = false;
      htmx.ajax("GET", section.getAttribute("data-fragment"), { target: "#live", swap: "outerHTML" });
    }, 150);
  }

  function follow() {
    var section = document.getElementById("live");
    if (!section || !section.hasAttribute("data-events") || source !== null) { return; }
    source = new EventSource(section.getAttribute("data-events"));
    var onEvent = function () { refresh(document.getElementById("live") || section); };
    ["queued", "step", "approval_requested", "approval_decided", "message"].forEach(function (name) {
      source.addEventListener(name, onEvent);
    });
    source.addEventListener("finished", function () {
      source.close();
      onEvent();
    });
    source.addEventListener("error", function (event) {
      if (event.data) { source.close(); }  // the stream's own error event (signed out): stop following
    });
  }

  function stopWhenFinished() {
    var section = document.getElementById("live");
    if (source !== null && section && !section.hasAttribute("data-events")) {
      source.close();
    }
  }

  document.addEventListener("DOMContentLoaded", follow);
  document.addEventListener("htmx:afterSettle", stopWhenFinished);
})();
