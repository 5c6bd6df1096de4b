// Small behaviours for the notebook edition: the Contents button, section links, Mermaid diagrams.
(function () {
  "use strict";
  function ready(fn) {
    if (document.readyState !== "loading") { fn(); } else { document.addEventListener("DOMContentLoaded", fn); }
  }
  ready(function () {
    var toggle = document.querySelector(".sidebar-toggle");
    if (toggle) {
      toggle.addEventListener("click", function () {
        var open = document.body.classList.toggle("sidebar-open");
        toggle.setAttribute("aria-expanded", open ? "true" : "false");
      });
    }
    // A "#" after each section heading links to it (shown on hover), as Quarto's pages do.
    document.querySelectorAll("article h2[id], article h3[id], article h4[id]").forEach(function (heading) {
      var anchor = document.createElement("a");
      anchor.className = "anchor-link";
      anchor.href = "#" + heading.id;
      anchor.setAttribute("aria-label", "Link to this section");
      anchor.textContent = "#";
      heading.appendChild(anchor);
    });
    if (window.mermaid && document.querySelector("pre.mermaid")) {
      window.mermaid.initialize({ startOnLoad: false, securityLevel: "strict", theme: "neutral" });
      window.mermaid.run({ querySelector: "pre.mermaid" }).then(function () {
        document.body.setAttribute("data-mermaid", "done");
      }, function (error) {
        document.body.setAttribute("data-mermaid", "failed");
        console.error("mermaid: " + error);
      });
    } else {
      document.body.setAttribute("data-mermaid", "none");
    }
  });
})();
