/* headgraph: no plotting into hidden figures until they are shown.
 *
 * dcc.Graph draws its figure when it mounts, visible or not: on a page load the ten figures of
 * the hidden views and panels each cost Plotly a full draw and a resize (~20 ms each, ~0.2 s
 * of the browser's single main thread before the visible view's own figure can draw). Here a
 * figure that was never drawn and whose element is not rendered (display: none here or above it: no client rects)
 * is only remembered; it is drawn with its latest figure when its element is shown (a
 * ResizeObserver sees it get a size). The event handlers dcc.Graph binds in the meantime are
 * kept and bound to the real plot once it exists. Figures already drawn, or drawn while
 * visible, go straight to Plotly as before.
 */
(function () {
  "use strict";
  const PENDING = "__headgraphPending";

  function hidden(gd) {
    return !!gd && !gd._fullLayout && gd.getClientRects().length === 0;
  }

  function defer(real, gd, args) {
    let pending = gd[PENDING];
    if (!pending) {
      pending = gd[PENDING] = { args: null, handlers: [], observer: null };
      // dcc.Graph binds its click / hover / relayout handlers right after the (deferred) plot.
      gd.on = function (event, fn) { pending.handlers.push([event, fn]); return gd; };
      gd.removeAllListeners = function () { pending.handlers = []; };
      pending.observer = new ResizeObserver(function () {
        if (gd.getClientRects().length) flush(gd);
      });
      pending.observer.observe(gd);
    }
    pending.args = args;
    pending.real = real;
    return Promise.resolve(gd);
  }

  function flush(gd) {
    const pending = gd[PENDING];
    if (!pending) return Promise.resolve(gd);
    pending.observer.disconnect();
    delete gd[PENDING];
    delete gd.on;
    delete gd.removeAllListeners;
    return Promise.resolve(pending.real.apply(window.Plotly, [gd].concat(pending.args))).then(function () {
      for (const [event, fn] of pending.handlers) gd.on(event, fn);
      return gd;
    });
  }

  function wrap(Plotly) {
    if (!Plotly || Plotly.__headgraphDeferred) return Plotly;
    Plotly.__headgraphDeferred = true;
    for (const name of ["react", "newPlot"]) {
      const real = Plotly[name];
      if (typeof real !== "function") continue;
      Plotly[name] = function (gd) {
        const args = Array.prototype.slice.call(arguments, 1);
        if (gd && gd[PENDING]) {
          if (hidden(gd)) return defer(real, gd, args);
          gd[PENDING].args = args;
          gd[PENDING].real = real;
          return flush(gd);
        }
        if (hidden(gd)) return defer(real, gd, args);
        return real.apply(this, arguments);
      };
    }
    const resize = Plotly.Plots && Plotly.Plots.resize;
    if (typeof resize === "function") {
      Plotly.Plots.resize = function (gd) {
        return gd && gd[PENDING] ? Promise.resolve(gd) : resize.apply(this, arguments);
      };
    }
    const purge = Plotly.purge;
    if (typeof purge === "function") {
      Plotly.purge = function (gd) {
        if (gd && gd[PENDING]) {
          gd[PENDING].observer.disconnect();
          delete gd[PENDING];
          delete gd.on;
          delete gd.removeAllListeners;
        }
        return purge.apply(this, arguments);
      };
    }
    return Plotly;
  }

  if (window.Plotly) {
    wrap(window.Plotly);
  } else {
    // plotly.js arrives later (dcc.Graph loads it lazily) and sets window.Plotly.
    let value;
    Object.defineProperty(window, "Plotly", {
      configurable: true,
      enumerable: true,
      get: function () { return value; },
      set: function (v) { value = wrap(v); },
    });
  }
})();
