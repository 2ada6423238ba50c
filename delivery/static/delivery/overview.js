// The operations overview refreshes itself: fetch this same URL (sort and filter kept)
// and swap the live region. Skipped while an operator is using a form in it.
(function () {
  "use strict";
  const root = document.getElementById("overview");
  if (!root) return;
  const seconds = Math.max(2, Number(root.dataset.refreshSeconds || 5));

  function busy(region) {
    const active = document.activeElement;
    return active && region.contains(active) && active.closest("form") !== null;
  }

  async function refresh() {
    const region = document.getElementById("overview-live");
    if (region && !busy(region) && !document.hidden) {
      try {
        const response = await fetch(window.location.href, {
          credentials: "same-origin",
          cache: "no-store",
          headers: { "X-Requested-With": "overview-refresh" },
        });
        if (response.ok && !response.redirected) {
          const page = new DOMParser().parseFromString(await response.text(), "text/html");
          const fresh = page.getElementById("overview-live");
          if (fresh) region.replaceWith(fresh);
        }
      } catch (err) {
        /* try again next time */
      }
    }
    setTimeout(refresh, seconds * 1000);
  }

  setTimeout(refresh, seconds * 1000);
})();
