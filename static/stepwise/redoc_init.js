// ReDoc's start (templates/drf_spectacular/redoc.html), from a file: the Content-Security-Policy
// runs no inline script. The settings come from the page's JSON script element.
(function () {
  const container = document.getElementById("redoc-container");
  const settings = JSON.parse(document.getElementById("redoc-settings").textContent);
  Redoc.init(container.dataset.schemaUrl, settings, container);
})();
