// A tenant's replays page: the list's progress refreshed every 5 s while a replay runs
// (times come from the server, in the viewer's zone: dashboards/timezones.py). The rows come from our own server,
// rendered and escaped by its templates; nothing from elsewhere is written to the page.
(function () {
  "use strict";
  const table = document.getElementById("replays-table");
  const body = document.getElementById("replay-jobs");
  if (!table || !body) return;
  const REFRESH_MS = 5000;

  function running() {
    return body.querySelector('tr[data-state="running"]') !== null;
  }

  async function refresh() {
    const url = table.dataset.refresh;
    if (!url || !running()) return;
    try {
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (response.ok) {
        const rows = document.createElement("tbody");
        rows.innerHTML = await response.text();
        body.replaceChildren(...rows.children);
      }
    } catch (error) {
      // A missed refresh is retried at the next tick; the page stays as it was.
    }
    setTimeout(refresh, REFRESH_MS);
  }

  setTimeout(refresh, REFRESH_MS);
})();
