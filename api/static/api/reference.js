// The API reference page (templates/api/redoc.html): ReDoc, started from a file rather
// than an inline script, which the Content-Security-Policy refuses.
(function () {
  const container = document.getElementById("redoc-container");
  Redoc.init(container.dataset.specUrl, {}, container);
})();
