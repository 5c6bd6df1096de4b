// MathJax 3 settings for the notebook edition; MathJax itself is in assets/mathjax/.
// Pandoc has already decided what is maths and writes it as \( \) and \[ \], as it does for
// Quarto: a dollar sign it left as text stays text here too.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: false,
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
