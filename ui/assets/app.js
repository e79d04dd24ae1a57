// kvroute dashboard: polls api/state once a second and renders the fleet,
// the decision feed, the charts (inline SVG) and the policy switch. No
// libraries, no build step, nothing from the network but this router.
"use strict";

(() => {
  const POLL_MS = 1000;
  const PALETTE = ["#2f6fed", "#e8590c", "#2b9348", "#9c36b5", "#0b7285", "#c2255c", "#5c940d", "#795548"];
  const SVGNS = "http://www.w3.org/2000/svg";

  const $ = (id) => document.getElementById(id);

  // h builds an element: h("td", {class: "num"}, "text", child...). Text is
  // always set as text, never parsed as HTML.
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "style") Object.assign(el.style, v);
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const kid of kids.flat()) {
      if (kid === undefined || kid === null || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }

  function s(tag, attrs, text) {
    const el = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) el.setAttribute(k, v);
    }
    if (text !== undefined) el.textContent = text;
    return el;
  }

  // ---- formatting --------------------------------------------------------
  const fmtMS = (v) => {
    if (v === null || v === undefined || isNaN(v)) return "–";
    if (v >= 10000) return (v / 1000).toFixed(1) + " s";
    if (v >= 1000) return (v / 1000).toFixed(2) + " s";
    if (v >= 100) return v.toFixed(0) + " ms";
    return v.toFixed(1) + " ms";
  };
  const fmtPct = (v, digits = 0) => (v === null || v === undefined || isNaN(v) ? "–" : (100 * v).toFixed(digits) + "%");
  const fmtNum = (v, digits = 1) => (v === null || v === undefined || isNaN(v) ? "–" : Number(v).toFixed(digits));
  const fmtClock = (ms) => {
    const d = new Date(ms);
    const p = (n, w = 2) => String(n).padStart(w, "0");
    return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
  };
  const fmtAxisTime = (ms) => {
    const d = new Date(ms);
    return `${String(d.getMinutes()).padStart(2, "0")}:${String(d.getSeconds()).padStart(2, "0")}`;
  };

  // ---- state -------------------------------------------------------------
  const ui = {
    model: null,           // the model shown
    state: null,           // last api/state
    decisions: new Map(),  // key -> record (model shown), kept across polls
    selected: null,        // key of the decision open in the detail panel
    colors: new Map(),     // endpoint -> colour
    policiesFilled: false,
    formFor: null,         // "model\npolicy" the policy switch last showed
    failures: 0,
  };

  function color(ep) {
    if (!ui.colors.has(ep)) ui.colors.set(ep, PALETTE[ui.colors.size % PALETTE.length]);
    return ui.colors.get(ep);
  }

  function currentModel(st) {
    if (!st.models.length) return null;
    return st.models.find((m) => m.name === ui.model) || st.models[0];
  }

  // ---- polling -----------------------------------------------------------
  async function poll() {
    try {
      const token = $("admin-token").value.trim();
      const resp = await fetch("api/state", { cache: "no-store", headers: token ? { Authorization: "Bearer " + token } : {} });
      if (resp.status === 401) {
        $("live-dot").className = "dot off";
        $("updated").textContent = "locked: enter the admin token (Routing policy, below) to see the fleet";
        $("admin-token").placeholder = "needed to view";
        return;
      }
      if (resp.status === 403) {
        $("live-dot").className = "dot off";
        $("updated").textContent = "closed: the router has no admin token and its debug mode is off";
        return;
      }
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      const st = await resp.json();
      ui.failures = 0;
      render(st);
      $("live-dot").className = "dot on";
      $("updated").textContent = "live · " + fmtClock(st.now).slice(0, 8);
    } catch (err) {
      ui.failures++;
      $("live-dot").className = "dot off";
      $("updated").textContent = "disconnected (" + err.message + "), retrying";
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  function render(st) {
    ui.state = st;
    document.title = st.title + " · fleet dashboard";
    renderModelPicker(st);
    const m = currentModel(st);
    if (m) {
      if (ui.model !== m.name) {
        ui.model = m.name;
        ui.decisions.clear();
        ui.selected = null;
      }
      // A P/D pool's requests are placed by its P/D plan ("pd", as its
      // decisions say); the configured policy places the prefill stage.
      $("current-policy").textContent = m.pd && m.prefill_policy ? `${m.policy} · prefill: ${m.prefill_policy}` : m.policy;
      m.endpoints.forEach((e) => color(e.id));
      renderFleet(m);
      ingestDecisions(m);
      renderDecisions(m);
    }
    renderTiles(st, m);
    renderRun(st.run);
    renderCharts(st.series, m);
    renderPolicyForm(st);
  }

  function renderModelPicker(st) {
    const sel = $("model-select");
    const names = st.models.map((m) => m.name);
    const have = Array.from(sel.options).map((o) => o.value);
    if (names.join("\n") !== have.join("\n")) {
      sel.replaceChildren(...names.map((n) => h("option", { value: n }, n)));
    }
    if (ui.model) sel.value = ui.model;
  }

  // ---- tiles and banner --------------------------------------------------
  function lastValue(arr) {
    for (let i = (arr || []).length - 1; i >= 0; i--) if (arr[i] !== null) return arr[i];
    return null;
  }

  function renderTiles(st, m) {
    const t = st.totals;
    $("tile-requests").textContent = t.requests.toLocaleString();
    $("totals-label").textContent = t.label ? "· " + t.label : "";
    // Where the figures come from: a demo phase's own measurements (as its
    // row in the comparison will show them), or the router's estimates.
    $("totals-source").textContent = t.source === "client"
      ? "requests finished, TTFT and prefix hit rate as the load generator measured them (the comparison's figures)"
      : "requests the router answered; TTFT estimated from the router's TTFB histogram buckets; prefix hit rate from the engines' counters";
    $("tile-p50").textContent = fmtMS(t.ttft_p50_ms);
    $("tile-p99").textContent = fmtMS(t.ttft_p99_ms);
    $("tile-hit").textContent = fmtPct(t.hit_rate, 1);
    const rps = st.series.rps || [];
    const recent = rps.slice(-5).filter((v) => v !== null);
    $("tile-rps").textContent = recent.length ? fmtNum(recent.reduce((a, b) => a + b, 0) / recent.length, 1) + "/s" : "–";
    $("tile-inflight").textContent = m ? m.endpoints.reduce((a, e) => a + e.in_flight, 0) : "–";
  }

  function renderRun(run) {
    const el = $("run-banner");
    if (!run) {
      el.hidden = true;
      $("compare-card").hidden = true;
      return;
    }
    el.hidden = false;
    if (run.done) {
      el.replaceChildren("demo finished: ", h("b", {}, run.phases + " policies compared"), " · workload " + run.workload);
    } else if (run.phase > 0) {
      // Past its time the phase still waits for its last requests' answers.
      const left = run.remaining_ms > 0 ? Math.ceil(run.remaining_ms / 1000) + " s left" : "answering its last requests";
      el.replaceChildren("demo phase ", h("b", {}, `${run.phase}/${run.phases}`), " · policy ", h("b", {}, run.policy),
        " · " + left + " · workload " + run.workload);
    } else {
      el.replaceChildren("demo starting…");
    }
    renderCompare(run);
  }

  // ---- fleet -------------------------------------------------------------
  function renderFleet(m) {
    const tb = $("fleet").tBodies[0];
    $("fleet-count").textContent = `· ${m.endpoints.length} endpoints of ${m.name}`;
    const rows = m.endpoints.map((e) => {
      const health = !e.healthy
        ? h("span", { class: "health bad" }, e.absent ? "absent rank" : e.ejected ? "ejected" : e.active_ok ? "down" : "failing checks")
        : h("span", { class: "health ok" }, "healthy");
      const kvPct = Math.max(0, Math.min(1, e.kv_usage || 0));
      const kv = h("div", { class: "kv" },
        h("div", { class: "bar" }, h("div", { class: "fill" + (kvPct > 0.9 ? " high" : ""), style: { width: (100 * kvPct).toFixed(1) + "%" } })),
        h("span", { class: "pct" }, fmtPct(kvPct)));
      const age = e.signal_age_ms === null ? "never" : fmtMS(e.signal_age_ms);
      const ageCell = h("td", { class: "num", title: e.last_error ? "last scrape error: " + e.last_error : `${e.scrapes} scrapes, ${e.scrape_errors} errors` },
        age, e.stale ? h("span", { class: "tag stale" }, "stale") : null);
      return h("tr", { "data-endpoint": e.id, class: (e.stale ? "stale " : "") + (e.healthy ? "" : "down") },
        h("td", {}, h("span", { class: "swatch", style: { background: color(e.id) } }), h("b", {}, e.id),
          h("span", { class: "ep-url" }, e.url), e.precise ? h("span", { class: "tag precise", title: "KV events feed the precise index" }, "kv events") : null),
        h("td", {}, e.role),
        h("td", {}, health),
        h("td", { class: "num" }, e.waiting),
        h("td", { class: "num" }, e.running),
        h("td", {}, kv),
        h("td", { class: "num" }, fmtPct(e.hit_rate, 1)),
        ageCell,
        h("td", { class: "num", title: e.in_flight_tokens + " prompt tokens not yet prefilled" }, e.in_flight),
        h("td", { class: "num" }, e.ejections));
    });
    tb.replaceChildren(...rows);
  }

  // ---- decisions ---------------------------------------------------------
  // A decision's key: its time and sequence number (a new router, e.g. the
  // demo's next phase, numbers its decisions from 1 again).
  const keyOf = (d) => d.time + "|" + d.seq;
  const newestFirst = (a, b) => (b._t - a._t) || (b.seq - a.seq);

  function ingestDecisions(m) {
    for (const d of m.decisions) {
      const k = keyOf(d);
      if (!ui.decisions.has(k)) {
        d._key = k;
        d._t = Date.parse(d.time);
        d._fresh = true;
        ui.decisions.set(k, d);
      }
    }
    // Keep the newest 200 (and the selected one).
    const list = Array.from(ui.decisions.values()).sort(newestFirst);
    for (const d of list.slice(200)) if (d._key !== ui.selected) ui.decisions.delete(d._key);
  }

  function scoreChips(d) {
    const scores = d.decision.scores || [];
    if (!scores.length) return h("span", { class: "muted" }, "(no scores)");
    return h("div", { class: "scores" }, scores.map((sc) =>
      h("span", {
        class: "score" + (sc.endpoint === d.decision.endpoint ? " win" : "") + (sc.eligible ? "" : " out"),
        title: sc.eligible ? sc.endpoint : sc.endpoint + ": " + (sc.why || "not eligible"),
      }, h("span", { class: "swatch", style: { background: color(sc.endpoint) } }), fmtScore(sc.score))));
  }

  function fmtScore(v) {
    if (v === null || v === undefined || isNaN(v)) return "–";
    const a = Math.abs(v);
    if (a >= 1000) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1);
    return v.toFixed(2);
  }

  function renderDecisions(m) {
    const tb = $("decisions").tBodies[0];
    const list = Array.from(ui.decisions.values()).sort(newestFirst).slice(0, 60);
    const rows = list.map((d) => {
      const chosen = d.decision.endpoint
        ? h("span", { class: "chosen" }, h("span", { class: "swatch", style: { background: color(d.decision.endpoint) } }), d.decision.endpoint)
        : h("span", { class: "health bad" }, d.decision.shed ? "shed" : "none");
      const tr = h("tr", {
        "data-seq": d.seq,
        "data-key": d._key,
        class: (d._key === ui.selected ? "selected " : "") + (d._fresh ? "fresh" : ""),
        onclick: () => selectDecision(d._key),
      },
      h("td", { class: "mono" }, fmtClock(Date.parse(d.time))),
      h("td", { class: "mono" }, d.request_id),
      h("td", { class: "num" }, d.prompt_tokens),
      h("td", {}, chosen),
      h("td", {}, scoreChips(d)),
      h("td", { class: "reason", title: d.decision.reason }, d.decision.reason));
      d._fresh = false;
      return tr;
    });
    if (!rows.length) rows.push(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No requests routed yet.")));
    tb.replaceChildren(...rows);
  }

  function selectDecision(key) {
    ui.selected = key;
    document.querySelectorAll("#decisions tbody tr").forEach((tr) => tr.classList.toggle("selected", tr.dataset.key === key));
    renderDetail(ui.decisions.get(key));
  }

  function renderDetail(d) {
    const box = $("decision-detail");
    if (!d) return;
    const byEp = new Map((d.decision.scores || []).map((sc) => [sc.endpoint, sc]));
    const head = h("tr", {}, ["Endpoint", "Score", "Score parts", "Cached", "Queue (W/R/IF)", "KV", "Signals"].map((t) => h("th", {}, t)));
    const rows = (d.candidates || []).map((c) => {
      const sc = byEp.get(c.endpoint);
      const parts = sc && sc.parts && sc.parts.length
        ? h("div", { class: "parts" }, sc.parts.map((p) => h("span", { class: "part" }, p.name + " " + fmtScore(p.value))))
        : h("span", { class: "muted" }, sc && !sc.eligible ? (sc.why || "not eligible") : "–");
      return h("tr", { class: c.endpoint === d.decision.endpoint ? "win" : "" },
        h("td", {}, h("span", { class: "swatch", style: { background: color(c.endpoint) } }), c.endpoint, c.healthy ? "" : " (unhealthy)"),
        h("td", { class: "num" }, sc ? fmtScore(sc.score) : "–", sc && !sc.eligible ? " ✕" : ""),
        h("td", {}, parts),
        h("td", { class: "num", title: `tier ${c.tier}, ${c.precise ? "precise (KV events)" : "approximate (routing history)"}` },
          `${c.cached_blocks}/${d.blocks} blk`, h("br"), h("span", { class: "muted" }, c.cached_tokens + " tok")),
        h("td", { class: "num" }, `${c.waiting}/${c.running}/${c.in_flight}`),
        h("td", { class: "num" }, fmtPct(c.kv_usage)),
        h("td", { class: "num", title: c.signal_age_ms === null ? "never scraped: waiting and running are the router's estimates" : "age of the last scrape at the decision" },
          c.signal_age_ms === null ? "never" : fmtMS(c.signal_age_ms), c.stale ? h("span", { class: "tag stale" }, "stale") : null));
    });
    box.replaceChildren(
      h("h3", {}, "Decision #" + d.seq + " · " + d.request_id),
      h("dl", {},
        h("dt", {}, "time"), h("dd", {}, fmtClock(Date.parse(d.time))),
        h("dt", {}, "model"), h("dd", {}, d.model),
        h("dt", {}, "policy"), h("dd", {}, d.decision.policy),
        h("dt", {}, "chosen"), h("dd", {}, h("b", {}, d.decision.endpoint || (d.decision.shed ? "shed" : "none"))),
        h("dt", {}, "reason"), h("dd", {}, d.decision.reason),
        h("dt", {}, "prompt"), h("dd", {}, `${d.prompt_tokens} tokens, ${d.blocks} prefix blocks`),
        d.session_key ? [h("dt", {}, "session"), h("dd", { class: "mono" }, d.session_key)] : null,
        d.tenant ? [h("dt", {}, "tenant"), h("dd", {}, d.tenant)] : null),
      h("table", { class: "grid", id: "detail-candidates" }, h("thead", {}, head), h("tbody", {}, rows)),
      h("p", { class: "muted" }, "Lower score wins unless the policy's reason says otherwise. Queue: waiting / running / router in-flight."));
  }

  // ---- charts ------------------------------------------------------------
  const CH = { w: 560, h: 200, l: 46, r: 12, t: 12, b: 26 };
  const GAP_MS = 5 * POLL_MS;

  // niceMax rounds v up to four equal steps of 1, 2, 2.5 or 5 times a power
  // of ten, so that the axis labels are round numbers.
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const step = v / 4;
    const p = Math.pow(10, Math.floor(Math.log10(step)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= step) return 4 * m * p;
    return 40 * p;
  }

  // decimalsFor is the number of decimals that writes every multiple of step
  // exactly (niceMax's steps: 1, 2, 2.5 or 5 times a power of ten), so that
  // the axis labels of a small range (0.25, 0.5, ...) are not rounded into
  // each other.
  function decimalsFor(step) {
    for (let d = 0; d < 6; d++) {
      const x = step * Math.pow(10, d);
      if (Math.abs(x - Math.round(x)) < 1e-6 * Math.max(1, x)) return d;
    }
    return 6;
  }
  const fmtAxis = (v, step) => String(Number(v.toFixed(decimalsFor(step))));

  // lineChart draws series [{name, color, values}] over times t into svg.
  function lineChart(svg, t, series, opts) {
    const o = Object.assign({ fmt: fmtAxis, max: null, marks: [] }, opts);
    svg.replaceChildren();
    const x0 = CH.l, x1 = CH.w - CH.r, y0 = CH.h - CH.b, y1 = CH.t;
    const n = t.length;
    let vmax = 0;
    for (const se of series) for (const v of se.values) if (v !== null && v > vmax) vmax = v;
    const ymax = o.max !== null ? o.max : niceMax(vmax * 1.1);
    const tmin = n ? t[0] : 0, tmax = n ? Math.max(t[n - 1], tmin + 1000) : 1;
    const X = (ms) => x0 + ((ms - tmin) / (tmax - tmin)) * (x1 - x0);
    const Y = (v) => y0 - (Math.min(v, ymax) / ymax) * (y0 - y1);
    for (let i = 0; i <= 4; i++) {
      const v = (ymax * i) / 4, y = Y(v);
      svg.append(s("line", { x1: x0, x2: x1, y1: y, y2: y, class: i ? "grid-line" : "axis" }));
      svg.append(s("text", { x: x0 - 6, y: y + 4, "text-anchor": "end", class: "y-tick" }, o.fmt(v, ymax / 4)));
    }
    if (n < 2) {
      svg.append(s("text", { x: (x0 + x1) / 2, y: (y0 + y1) / 2, "text-anchor": "middle", class: "empty" }, "collecting data…"));
      return;
    }
    const ticks = 5;
    for (let i = 0; i <= ticks; i++) {
      const ms = tmin + ((tmax - tmin) * i) / ticks;
      svg.append(s("text", { x: X(ms), y: y0 + 16, "text-anchor": i === 0 ? "start" : i === ticks ? "end" : "middle" }, fmtAxisTime(ms)));
    }
    for (const mk of o.marks) {
      if (mk.t < tmin || mk.t > tmax) continue;
      const x = X(mk.t);
      svg.append(s("line", { x1: x, x2: x, y1: y1, y2: y0, class: "mark" }));
      // Below the legend's row; in the right half the label reads leftwards
      // from its line, so that it stays inside the chart.
      const right = x > (x0 + x1) / 2;
      svg.append(s("text", { x: right ? x - 4 : x + 4, y: y1 + 22, "text-anchor": right ? "end" : "start", class: "mark-label" }, mk.label));
    }
    for (const se of series) {
      let d = "", pen = false;
      for (let i = 0; i < n; i++) {
        const v = se.values[i];
        if (v === null || v === undefined) { pen = false; continue; }
        // No point for a while (the router sampled nothing: a lingering demo
        // nobody watched): lift the pen rather than draw a straight line
        // through time without data.
        if (pen && t[i] - t[i - 1] > GAP_MS) pen = false;
        d += (pen ? "L" : "M") + X(t[i]).toFixed(1) + " " + Y(v).toFixed(1);
        pen = true;
      }
      if (d) svg.append(s("path", { d, fill: "none", stroke: se.color, "stroke-width": se.width || 1.8, "stroke-linejoin": "round", "data-series": se.name }));
    }
    // legend, right-aligned on one row: as many series as fit, then "+N
    // more" (a fleet of many endpoints; the fleet table has every colour).
    const items = series.map((se) => {
      const label = se.name + (se.last !== undefined ? " " + se.last : "");
      return { se, label, w: 7 * label.length + 16 };
    });
    let shown = items;
    if (items.reduce((a, it) => a + it.w, 0) > x1 - x0) {
      shown = [];
      let used = 70; // room for "+N more"
      for (const it of items) {
        if (used + it.w > x1 - x0) break;
        used += it.w;
        shown.push(it);
      }
    }
    let lx = x1;
    if (shown.length < items.length) {
      const more = `+${items.length - shown.length} more`;
      lx -= 7 * more.length + 6;
      svg.append(s("text", { x: lx, y: y1 + 2, class: "legend-more" }, more));
    }
    for (const it of shown.slice().reverse()) {
      lx -= it.w;
      svg.append(s("rect", { x: lx, y: y1 - 2, width: 10, height: 3, fill: it.se.color }));
      svg.append(s("text", { x: lx + 13, y: y1 + 2 }, it.label));
    }
  }

  function renderCharts(se, m) {
    const t = se.t || [];
    const marks = se.marks || [];
    lineChart($("chart-ttft"), t, [
      { name: "p50", color: "#2f6fed", values: se.ttft_p50_ms, last: fmtMS(lastValue(se.ttft_p50_ms)) },
      { name: "p99", color: "#e8590c", values: se.ttft_p99_ms, last: fmtMS(lastValue(se.ttft_p99_ms)) },
    ], { fmt: (v, step) => (4 * step >= 1000 ? fmtAxis(v / 1000, step / 1000) + "s" : fmtAxis(v, step) + "ms"), marks });
    lineChart($("chart-rps"), t, [{ name: "req/s", color: "#2b9348", values: se.rps, last: fmtNum(lastValue(se.rps), 1) }],
      { marks });
    lineChart($("chart-hit"), t, [{ name: "hit rate", color: "#9c36b5", values: se.hit_rate, last: fmtPct(lastValue(se.hit_rate)) }],
      { fmt: (v) => fmtPct(v), max: 1, marks });
    // The model shown's endpoints only: IDs are unique per model, and
    // another model may have an endpoint of the same name.
    const name = m ? m.name : null;
    const eps = (name && se.endpoints && se.endpoints[name]) || [];
    const load = (name && se.load && se.load[name]) || {};
    lineChart($("chart-load"), t, eps.map((ep) => ({ name: ep, color: color(ep), values: load[ep] || [], width: 1.5 })),
      { marks });
  }

  // ---- comparison ----------------------------------------------------------
  function renderCompare(run) {
    const card = $("compare-card");
    const rows = run.rows || [];
    card.hidden = rows.length === 0;
    if (!rows.length) return;
    $("compare-sub").textContent = `· same workload (${run.workload}) through each policy on cold caches`;
    // A null figure (no request completed) is never the best.
    const best = (key, lower) => rows.reduce((b, r) => (r[key] === null ? b : b === null || (lower ? r[key] < b[key] : r[key] > b[key]) ? r : b), null);
    const bestP50 = best("ttft_p50_ms", true);
    $("compare").tBodies[0].replaceChildren(...rows.map((r) => h("tr", { class: r === bestP50 && rows.length > 1 ? "best" : "", "data-policy": r.name },
      h("td", {}, r.name),
      h("td", { class: "num" }, r.completed + "/" + r.requests),
      h("td", { class: "num" }, fmtMS(r.ttft_p50_ms)),
      h("td", { class: "num" }, fmtMS(r.ttft_p99_ms)),
      h("td", { class: "num" }, fmtNum(r.throughput_rps, 2) + "/s"),
      h("td", { class: "num" }, fmtPct(r.hit_rate, 1)),
      h("td", { class: "num" }, fmtPct(r.oracle_hit_rate, 1)),
      h("td", { class: "num" }, r.errors))));
    const bars = $("compare-bars");
    bars.replaceChildren(
      barChart("TTFT p50", rows, (r) => r.ttft_p50_ms, fmtMS),
      barChart("TTFT p99", rows, (r) => r.ttft_p99_ms, fmtMS),
      barChart("Prefix hit rate", rows, (r) => r.hit_rate, (v) => fmtPct(v, 1)));
  }

  const BAR_COLORS = ["#2f6fed", "#adb5bd", "#e8590c", "#2b9348", "#9c36b5"];

  function barChart(title, rows, get, fmt) {
    const W = 200, H = 150, top = 24, bottom = 22;
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
    svg.append(s("text", { x: 0, y: 12, class: "title" }, title));
    const vmax = Math.max(...rows.map(get), 0) || 1;
    const bw = Math.min(48, (W - 10) / rows.length - 10);
    rows.forEach((r, i) => {
      const v = get(r), hgt = ((H - top - bottom - 12) * v) / vmax;
      const x = 6 + i * (bw + 12), y = H - bottom - hgt;
      svg.append(s("rect", { x, y, width: bw, height: Math.max(hgt, 1), rx: 3, fill: BAR_COLORS[i % BAR_COLORS.length] }));
      svg.append(s("text", { x: x + bw / 2, y: y - 4, "text-anchor": "middle", class: "val" }, fmt(v)));
      // The name fits its bar's slot (about 6.5 px a character at 11 px),
      // so that neighbours' names do not run into each other.
      const fit = Math.max(3, Math.floor((bw + 10) / 6.5));
      const label = s("text", { x: x + bw / 2, y: H - 6, "text-anchor": "middle", class: "bar-name" }, r.name.length > fit ? r.name.slice(0, fit - 1) + "…" : r.name);
      label.append(s("title", {}, r.name));
      svg.append(label);
    });
    return svg;
  }

  // ---- policy switch -------------------------------------------------------
  function renderPolicyForm(st) {
    if (!ui.policiesFilled && st.policies && st.policies.length) {
      $("policy-select").replaceChildren(...st.policies.map((p) => h("option", { value: p }, p)));
      ui.policiesFilled = true;
    }
    // The switch starts from the shown model's policy, and follows it when
    // another model is picked or the policy changes (the admin API, the
    // demo's next phase); the user's pick stays until then.
    const m = currentModel(st);
    if (m && ui.policiesFilled && ui.formFor !== m.name + "\n" + m.policy) {
      $("policy-select").value = m.pd ? m.prefill_policy : m.policy;
      ui.formFor = m.name + "\n" + m.policy;
    }
    $("admin-note").textContent = m && m.pd
      ? `${m.name} is disaggregated: its P/D plan places every request (policy pd, with ${m.prefill_policy} for the prefill stage), set by its pd configuration; the admin API refuses a switch.`
      : st.admin.enabled
        ? `Switching calls the router's admin API (PUT ${st.admin.path}) with your token; without the right token the router refuses.`
        : `The router has no admin token configured: the dashboard is read-only and the admin API (${st.admin.path}) refuses every switch.`;
  }

  async function switchPolicy(ev) {
    ev.preventDefault();
    const st = ui.state;
    const res = $("policy-result");
    if (!st || !ui.model) return;
    let params = null;
    const raw = $("policy-params").value.trim();
    if (raw) {
      try {
        params = JSON.parse(raw);
      } catch (err) {
        res.className = "result err";
        res.textContent = "Params are not valid JSON: " + err.message;
        return;
      }
    }
    const policy = $("policy-select").value;
    const token = $("admin-token").value.trim();
    const headers = { "Content-Type": "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    $("policy-apply").disabled = true;
    res.className = "result";
    res.textContent = "switching…";
    try {
      const resp = await fetch(st.admin.path, { method: "PUT", headers, body: JSON.stringify({ model: ui.model, policy, params }) });
      let body = null;
      try { body = await resp.json(); } catch (_) { /* not JSON */ }
      if (resp.ok) {
        res.className = "result ok";
        res.textContent = `Switched ${ui.model} to ${policy}.`;
        $("current-policy").textContent = policy;
      } else {
        const msg = body && body.error ? body.error.message : resp.statusText;
        res.className = "result err";
        res.textContent = `Refused by the router (HTTP ${resp.status}): ${msg}`;
      }
    } catch (err) {
      res.className = "result err";
      res.textContent = "Request failed: " + err.message;
    } finally {
      $("policy-apply").disabled = false;
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("policy-form").addEventListener("submit", switchPolicy);
    $("model-select").addEventListener("change", (ev) => {
      ui.model = ev.target.value;
      ui.decisions.clear();
      ui.selected = null;
      if (ui.state) render(ui.state);
    });
    poll();
  });
})();
