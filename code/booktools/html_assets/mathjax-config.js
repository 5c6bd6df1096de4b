// MathJax 3 settings for the notebook edition; MathJax itself is in assets/mathjax/.
window.MathJax = {
  tex: {
    inlineMath: [["$", "$"], ["\\(", "\\)"]],
    displayMath: [["$$", "$$"], ["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
    tags: "none"
  },
  svg: { fontCache: "global" },
  options: {
    skipHtmlTags: ["script", "noscript", "style", "textarea", "pre", "code"],
    enableMenu: true
  },
  startup: {
    // After typesetting, each displayed equation sits in its own sideways-scrolling box, so a
    // wide equation never makes the whole page scroll (on a phone, or in a list item).
    pageReady: function () {
      return MathJax.startup.defaultPageReady().then(function () {
        document.querySelectorAll('mjx-container[display="true"]').forEach(function (math) {
          var parent = math.parentNode;
          if (!parent || (parent.classList && parent.classList.contains("math-scroll"))) { return; }
          var box = document.createElement("span");
          box.className = "math-scroll";
          parent.insertBefore(box, math);
          box.appendChild(math);
        });
      });
    }
  }
};
