// Typeset the formulas that pymdownx.arithmatex (generic mode) leaves as \( \) and \[ \],
// on every page the theme shows.
document$.subscribe(({ body }) => {
  renderMathInElement(body, {
    delimiters: [
      { left: "$$", right: "$$", display: true },
      { left: "\\[", right: "\\]", display: true },
      { left: "\\(", right: "\\)", display: false },
    ],
    ignoredClasses: ["highlight"],
    throwOnError: false,
  });
});
