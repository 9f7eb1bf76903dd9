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

  // A wide table scrolls inside its own box (div.table-wrap) on a narrow screen; a keyboard can scroll
  // it only if the box takes focus, so a box that overflows is made a named, focusable region.
  function scrollableTables() {
    document.querySelectorAll(".table-wrap").forEach(function (wrap) {
      if (wrap.scrollWidth > wrap.clientWidth) {
        var caption = wrap.querySelector("caption");
        var section = wrap.closest("section");
        var heading = section ? section.querySelector("h2, h3") : null;
        var named = caption || heading || document.querySelector("main h1");
        wrap.setAttribute("tabindex", "0");
        wrap.setAttribute("role", "region");
        wrap.setAttribute("aria-label", (named ? named.textContent.trim() : "Table") + " (scrolls sideways)");
      } else if (wrap.getAttribute("role") === "region") {
        wrap.removeAttribute("tabindex");
        wrap.removeAttribute("role");
        wrap.removeAttribute("aria-label");
      }
    });
  }

  document.addEventListener("DOMContentLoaded", follow);
  document.addEventListener("DOMContentLoaded", scrollableTables);
  document.addEventListener("htmx:afterSettle", stopWhenFinished);
  document.addEventListener("htmx:afterSettle", scrollableTables);
  window.addEventListener("resize", scrollableTables);
})();
