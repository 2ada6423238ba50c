// A tenant's replays page: times in the browser's zone (to the second), and the list's
// progress refreshed every 5 s while a replay runs. The rows come from our own server,
// rendered and escaped by its templates; nothing from elsewhere is written to the page.
(function () {
  "use strict";
  const table = document.getElementById("replays-table");
  const body = document.getElementById("replay-jobs");
  if (!table || !body) return;
  const REFRESH_MS = 5000;

  function localTime(iso) {
    const when = new Date(iso);
    if (isNaN(when)) return null;
    const time = when.toLocaleTimeString([], {
      hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23",
    });
    const sameDay = when.toDateString() === new Date().toDateString();
    return sameDay ? time : when.toLocaleDateString([], { day: "numeric", month: "short", year: "numeric" }) + ", " + time;
  }

  function formatTimes(scope) {
    scope.querySelectorAll("time[datetime]").forEach((el) => {
      const text = localTime(el.getAttribute("datetime"));
      if (text) {
        el.title = el.textContent;  // the server's rendering, with its zone, on hover
        el.textContent = text;
      }
    });
  }

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
        formatTimes(body);
      }
    } catch (error) {
      // A missed refresh is retried at the next tick; the page stays as it was.
    }
    setTimeout(refresh, REFRESH_MS);
  }

  formatTimes(document);
  setTimeout(refresh, REFRESH_MS);
})();
