// Live numbers for a tenant dashboard: poll status.json, update the page in place.
// No library and nothing from the internet; every value is written with textContent.
(function () {
  "use strict";
  const root = document.getElementById("dashboard");
  if (!root) return;
  const statusUrl = root.dataset.statusUrl;
  const pollMs = Math.max(1, Number(root.dataset.pollSeconds || 3)) * 1000;
  const charts = {
    "backlog-age": [root.dataset.chartBacklogAge, document.getElementById("chart-backlog-age")],
    delivered: [root.dataset.chartDelivered, document.getElementById("chart-delivered")],
  };
  let sampledAt = root.dataset.sampledAt || "";
  let lastOk = Date.now();
  let failures = 0;

  function get(obj, path) {
    return path.split(".").reduce((value, key) => (value == null ? value : value[key]), obj);
  }

  function localTime(iso) {
    if (!iso) return "-";
    const when = new Date(iso);
    if (isNaN(when)) return iso;
    const sameDay = when.toDateString() === new Date().toDateString();
    const time = when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
    return sameDay ? time : when.toLocaleDateString([], { day: "numeric", month: "short" }) + ", " + time;
  }

  function formatTimes(scope) {
    scope.querySelectorAll("time[datetime]").forEach((el) => {
      const iso = el.getAttribute("datetime");
      if (iso) el.textContent = localTime(iso);
    });
  }

  function cell(text, className) {
    const td = document.createElement("td");
    if (className) td.className = className;
    td.textContent = text;
    return td;
  }

  function timeCell(iso) {
    const td = document.createElement("td");
    const el = document.createElement("time");
    el.setAttribute("datetime", iso || "");
    el.textContent = localTime(iso);
    td.appendChild(el);
    return td;
  }

  // A retry whose time has come waits for its turn and a free slot: "due now", never a
  // time already past.
  function retryCell(iso, dueNow) {
    return dueNow ? cell(dueNow === true ? "due now" : "due now (" + dueNow + ")") : timeCell(iso);
  }

  // A URL that wraps after "/", "?", "&" and "=", never mid-host (the breakable filter's
  // rule, dashboards/templatetags/urls_text.py).
  function breakable(text, className) {
    const td = document.createElement("td");
    if (className) td.className = className;
    (text || "").split(/(\/\/|\/|\?|&|=)/).forEach((part) => {
      td.appendChild(document.createTextNode(part));
      if (/^(\/\/|\/|\?|&|=)$/.test(part)) td.appendChild(document.createElement("wbr"));
    });
    return td;
  }

  function emptyRow(body, columns, text) {
    const tr = document.createElement("tr");
    const td = cell(text, "muted");
    td.colSpan = columns;
    tr.appendChild(td);
    body.replaceChildren(tr);
  }

  function renderEndpoints(endpoints) {
    const body = document.getElementById("endpoints");
    if (!endpoints.length) return emptyRow(body, 5, "No endpoints yet.");
    body.replaceChildren(
      ...endpoints.map((e) => {
        const tr = document.createElement("tr");
        tr.appendChild(breakable(e.label, "mono wrap-any"));
        const state = document.createElement("td");
        const pill = document.createElement("span");
        pill.className = "state state-" + e.state;
        pill.textContent = e.state_text;
        state.appendChild(pill);
        tr.appendChild(state);
        tr.appendChild(cell(e.in_flight + " / " + e.limit, "num"));
        tr.appendChild(cell(String(e.consecutive_failures), "num"));
        tr.appendChild(retryCell(e.next_retry_at, e.retries_due > 1 ? e.retries_due : e.retries_due === 1));
        return tr;
      })
    );
  }

  function renderFailures(items) {
    const body = document.getElementById("failures");
    if (!items.length) return emptyRow(body, 6, "No failed deliveries waiting.");
    body.replaceChildren(
      ...items.map((f) => {
        const tr = document.createElement("tr");
        tr.appendChild(timeCell(f.attempted_at));
        tr.appendChild(cell(f.event_type || "event", "mono"));
        tr.appendChild(breakable(f.endpoint, "mono wrap-any"));
        const result = cell(f.status_code ? "HTTP " + f.status_code : f.error || "-", "wrap-any");
        result.appendChild(document.createElement("br"));
        const note = document.createElement("span");
        note.className = "muted";
        note.textContent = f.status + ", " + f.attempts + " attempt" + (f.attempts === 1 ? "" : "s");
        result.appendChild(note);
        tr.appendChild(result);
        const excerpt = document.createElement("td");
        const code = document.createElement("code");
        code.className = "excerpt";
        code.textContent = f.response_excerpt || "-";
        excerpt.appendChild(code);
        tr.appendChild(excerpt);
        tr.appendChild(retryCell(f.next_retry_at, f.retry_due_now));
        return tr;
      })
    );
  }

  function render(s) {
    root.querySelectorAll("[data-field]").forEach((el) => {
      const value = get(s, el.dataset.field);
      if (value != null) el.textContent = value;
    });
    const banner = document.getElementById("status-banner");
    banner.className = "banner status-" + s.status.code;
    const b = s.backlog;
    document.getElementById("waiting-detail").textContent =
      `${b.fresh.toLocaleString("en-US")} new · ${b.retry.toLocaleString("en-US")} retrying · ` +
      `${b.delayed.toLocaleString("en-US")} due later · ${b.in_flight.toLocaleString("en-US")} in flight` +
      (b.held ? ` · ${b.held.toLocaleString("en-US")} held` : "") +
      (b.dead ? ` · ${b.dead.toLocaleString("en-US")} dead letter${b.dead === 1 ? "" : "s"}` : "");
    document.getElementById("delivered-detail").textContent =
      `at the current pace · ${s.delivered_per_minute.toLocaleString("en-US")} in the last 60 s`;
    const others = s.share_of_turns.other_backlogged_tenants;
    document.getElementById("share-detail").textContent =
      `weight ${s.share_of_turns.weight} · ${others} other tenant${others === 1 ? "" : "s"} waiting`;
    document.getElementById("drain-detail").textContent = s.drain.clears_at
      ? "clears around " + localTime(s.drain.clears_at)
      : s.drain.detail;
    renderEndpoints(s.endpoints);
    renderFailures(s.failures);
    const sampled = s.history.last_sampled_at || "";
    if (sampled && sampled !== sampledAt) {
      sampledAt = sampled;
      refreshCharts();
    }
  }

  async function refreshCharts() {
    for (const [url, box] of Object.values(charts)) {
      if (!url || !box) continue;
      try {
        const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
        if (response.ok) box.innerHTML = await response.text(); // our own server-rendered SVG
      } catch (err) {
        /* the next sample will try again */
      }
    }
  }

  function showFreshness() {
    const seconds = Math.round((Date.now() - lastOk) / 1000);
    const dot = document.getElementById("live-dot");
    const label = document.getElementById("updated");
    const stale = failures > 0;
    dot.className = "dot" + (stale ? " stale" : "");
    label.textContent = stale
      ? `Reconnecting… last update ${seconds} s ago`
      : `Live · updated ${seconds < 2 ? "just now" : seconds + " s ago"}`;
  }

  async function poll() {
    try {
      const response = await fetch(statusUrl, {
        credentials: "same-origin",
        cache: "no-store",
        headers: { Accept: "application/json" },
      });
      const type = response.headers.get("Content-Type") || "";
      if (!response.ok || !type.includes("json")) throw new Error("status " + response.status);
      render(await response.json());
      lastOk = Date.now();
      failures = 0;
    } catch (err) {
      failures += 1;
    }
    showFreshness();
    // Back off while the server is away, up to a minute between tries.
    setTimeout(poll, Math.min(60000, pollMs * Math.pow(2, Math.min(failures, 5))));
  }

  formatTimes(document);
  setInterval(showFreshness, 1000);
  setTimeout(poll, pollMs);
})();
