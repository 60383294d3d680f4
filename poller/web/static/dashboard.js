// Live refresh: every few seconds, fetch this page's main part again and swap it in.
// Paused while the tab is hidden, while a field in it has the focus, or when "live" is off.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !live.dataset.refresh) return;
  var toggle = document.getElementById("refresh-toggle");
  var every = Math.max(1, Number(live.dataset.refresh)) * 1000;
  var busy = false;
  function tick() {
    if (busy || document.hidden || (toggle && !toggle.checked)) return;
    var focused = document.activeElement;
    if (focused && focused !== document.body && live.contains(focused)) return;
    busy = true;
    fetch(window.location.href, { headers: { "X-Poller-Refresh": "1" }, credentials: "same-origin", redirect: "manual" })
      .then(function (response) {
        var type = response.headers.get("content-type") || "";
        if (response.ok && type.indexOf("text/html") === 0) return response.text();
        return null;
      })
      .then(function (html) { if (html !== null) live.innerHTML = html; })
      .catch(function () { /* the next tick tries again */ })
      .then(function () { busy = false; });
  }
  window.setInterval(tick, every);
})();
