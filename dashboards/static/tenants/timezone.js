// Tell the server the browser's time zone (an IANA name in the `tz` cookie), so it shows
// times in it and reads times typed into forms in it (dashboards/timezones.py). Set on
// every portal page; the first page a browser ever opens still shows the server's zone.
(function () {
  "use strict";
  let zone;
  try {
    zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  } catch (error) {
    return;
  }
  // IANA names (letters, digits, "/", "_", "+", "-") are valid cookie values as they are.
  if (!zone || !/^[A-Za-z0-9_+\-\/]+$/.test(zone)) return;
  const cookie = "tz=" + zone;
  if (document.cookie.split("; ").indexOf(cookie) === -1) {
    document.cookie = cookie + "; path=/; max-age=31536000; samesite=lax";
  }
})();
