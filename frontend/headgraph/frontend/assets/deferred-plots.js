/* headgraph: no plotting into hidden figures until they are shown, nor into figures below the
 * fold before the browser is idle.
 *
 * dcc.Graph draws its figure when it mounts, visible or not: on a page load the ten figures of
 * the hidden views and panels each cost Plotly a full draw and a resize (~20 ms each, ~0.2 s
 * of the browser's single main thread before the visible view's own figure can draw). Here a
 * figure that was never drawn and whose element is not rendered (display: none here or above it: no client rects)
 * is only remembered; it is drawn with its latest figure when its element is shown (a
 * ResizeObserver sees it get a size). A figure that is rendered but lies wholly below (or
 * above) the window, such as the tokens view's pattern grid under a tall token grid, waits the
 * same way until it nears the window (an IntersectionObserver) or the page is idle
 * (requestIdleCallback), so the figure in sight draws first. The event handlers dcc.Graph binds
 * in the meantime are kept and bound to the real plot once it exists. A figure already drawn
 * (its placeholder, while the page was still short) that gets new data out of sight keeps its
 * old drawing until then. Everything else goes straight to Plotly as before.
 *
 * window.__headgraphPlots keeps the last 100 decisions ([figure id, "drawn" | "waiting: hidden"
 * | "waiting: out of sight"]) for tests and for anyone debugging a page in the console.
 */
(function () {
  "use strict";
  const PENDING = "__headgraphPending";
  const MARGIN = 150; // px around the window that count as "in sight"

  const LOG = (window.__headgraphPlots = window.__headgraphPlots || []);

  function note(gd, what) {
    const box = gd && gd.closest ? gd.closest(".dash-graph") : null;
    LOG.push([box ? box.id : "?", what]);
    if (LOG.length > 100) LOG.shift();
  }

  function hidden(gd) {
    return !!gd && !gd._fullLayout && gd.getClientRects().length === 0;
  }

  function outOfSight(gd) {
    if (!gd || !gd.getClientRects().length) return false;
    const r = gd.getBoundingClientRect();
    return r.top > window.innerHeight + MARGIN || r.bottom < -MARGIN;
  }

  function watch(gd, pending, offscreen) {
    if (offscreen) {
      // In sight or idle: draw, unless the element was hidden meanwhile (then wait to be shown).
      const later = function () {
        if (gd[PENDING] !== pending) return;
        if (gd.getClientRects().length) { flush(gd); return; }
        pending.stop();
        watch(gd, pending, false);
      };
      const io = new IntersectionObserver(function (entries) {
        if (entries.some(function (e) { return e.isIntersecting; })) later();
      }, { rootMargin: MARGIN + "px" });
      io.observe(gd);
      const idle = window.requestIdleCallback
        ? window.requestIdleCallback(later, { timeout: 2000 })
        : window.setTimeout(later, 300);
      pending.stop = function () {
        io.disconnect();
        if (window.cancelIdleCallback) window.cancelIdleCallback(idle); else window.clearTimeout(idle);
      };
    } else {
      const ro = new ResizeObserver(function () {
        if (gd.getClientRects().length) flush(gd);
      });
      ro.observe(gd);
      pending.stop = function () { ro.disconnect(); };
    }
  }

  function defer(real, gd, args, offscreen) {
    let pending = gd[PENDING];
    if (!pending) {
      // A never-drawn figure: dcc.Graph binds its click / hover / relayout handlers right after
      // the (deferred) plot; they are kept for the real one. A drawn one has Plotly's own.
      pending = gd[PENDING] = { args: null, handlers: [], stop: null, fresh: !gd._fullLayout };
      if (pending.fresh) {
        gd.on = function (event, fn) { pending.handlers.push([event, fn]); return gd; };
        gd.removeAllListeners = function () { pending.handlers = []; };
      }
      watch(gd, pending, offscreen);
      note(gd, offscreen ? "waiting: out of sight" : "waiting: hidden");
    }
    pending.args = args;
    pending.real = real;
    return Promise.resolve(gd);
  }

  function release(gd) {
    const pending = gd[PENDING];
    pending.stop();
    delete gd[PENDING];
    if (pending.fresh) {
      delete gd.on;
      delete gd.removeAllListeners;
    }
    return pending;
  }

  function flush(gd) {
    if (!gd[PENDING]) return Promise.resolve(gd);
    const pending = release(gd);
    note(gd, "drawn");
    return Promise.resolve(pending.real.apply(window.Plotly, [gd].concat(pending.args))).then(function () {
      if (pending.fresh) for (const [event, fn] of pending.handlers) gd.on(event, fn);
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
          // Still waiting (hidden, or out of sight): keep the latest figure for later.
          if (hidden(gd) || outOfSight(gd)) return defer(real, gd, args);
          gd[PENDING].args = args;
          gd[PENDING].real = real;
          return flush(gd);
        }
        if (hidden(gd)) return defer(real, gd, args, false);
        if (outOfSight(gd)) return defer(real, gd, args, true);
        note(gd, "drawn");
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
        if (gd && gd[PENDING]) release(gd);
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
