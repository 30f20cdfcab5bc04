/* headgraph: pin a head with a modifier-click (Ctrl, Cmd or Shift + click) on a node of the head
 * graph ("graph") or of the subgraph ("subgraph-fig"); the same click on a pinned head unpins it.
 *
 * Plotly's click data carries no modifier keys, and a plain click already opens a head's panel,
 * so the modified mousedown is caught here, before Plotly sees it (capture phase): the node under
 * the pointer is the one Plotly hovers (gd._hoverdata, whose customdata is ["node", name]). The
 * pin becomes one record of the "sub-action" store, which the URL writer applies (pins live in
 * the URL). The record says what the click means from the pins the page shows when it happens
 * (on: pin, or off: unpin), so a second click sent before a slow server has written the first
 * one's URL repeats it rather than undoing it. A modified click elsewhere (an edge, the
 * background) is left to Plotly.
 */
(function () {
  "use strict";
  const FIGURES = ["graph", "subgraph-fig"];

  function hoveredNode(gd) {
    const points = gd && gd._hoverdata;
    if (!points || !points.length) return null;
    for (const p of points) {
      const cd = p.customdata;
      if (Array.isArray(cd) && cd[0] === "node" && typeof cd[1] === "string") return cd[1];
    }
    return null;
  }

  function pinnedNow(head) {
    const pins = new URLSearchParams(window.location.search).get("pins") || "";
    return pins.split(",").indexOf(head) >= 0;
  }

  function onMouseDown(e) {
    if (e.button !== 0 || !(e.ctrlKey || e.metaKey || e.shiftKey)) return;
    const gd = e.target && e.target.closest ? e.target.closest(".js-plotly-plot") : null;
    const box = gd ? gd.closest(".dash-graph") : null;
    if (!box || FIGURES.indexOf(box.id) < 0) return;
    const head = hoveredNode(gd);
    if (!head || !window.dash_clientside || !window.dash_clientside.set_props) return;
    e.stopPropagation();
    e.preventDefault();
    window.dash_clientside.set_props("sub-action", {
      data: {op: "pin", head: head, on: !pinnedNow(head), t: Date.now()},
    });
  }

  document.addEventListener("mousedown", onMouseDown, true);
})();
