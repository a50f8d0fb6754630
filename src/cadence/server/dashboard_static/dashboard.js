// cadence live dashboard: reads /dashboard/events (SSE), keeps the last WINDOW_S seconds in
// bounded arrays and redraws the plotly charts at most every REDRAW_MS.
"use strict";

const WINDOW_S = 60;          // seconds of history drawn
const REDRAW_MS = 500;        // at most two redraws a second: cheap for the host
const MAX_STALL_ROWS = 40;
const LONG_PROMPT = 256;      // prompts at least this long get their prefill window shaded

const state = {
  t0: null,                   // engine clock origin of the x axes
  steps: [],                  // step dicts, oldest first
  ticks: new Map(),           // req_id -> [token times]
  prefill: new Map(),         // req_id -> {start, end, prompt}
  stalls: [],
  requests: [],
  stallMs: {},
  stats: {},
  target: 100,
  dirty: true,
  preemptions: 0,
};

function rel(t) { return t - state.t0; }

// Request ids are long (cmpl-<32 hex>): the charts and tables show their tail.
function short(id) { return id.length > 14 ? "…" + id.slice(-8) : id; }

function addStep(s) {
  if (state.t0 === null) state.t0 = s.t_start;
  state.steps.push(s);
  state.preemptions += s.num_preemptions || 0;
  for (const r of s.sampled_req_ids || []) {
    let list = state.ticks.get(r);
    if (!list) { list = []; state.ticks.set(r, list); }
    list.push(s.t_end);
  }
  const ids = s.prefill_req_ids || [];
  for (let i = 0; i < ids.length; i++) {
    const w = state.prefill.get(ids[i]);
    const prompt = (s.prefill_prompt_tokens || [])[i] || 0;
    if (w) { w.end = Math.max(w.end, s.t_end); }
    else { state.prefill.set(ids[i], {start: s.t_start, end: s.t_end, prompt: prompt}); }
  }
}

function addStall(st) {
  state.stalls.push(st);
  if (state.stalls.length > 300) state.stalls.shift();
}

function trim() {
  // Bounded memory: drop what scrolled out of the window.
  if (!state.steps.length) return;
  const cutoff = state.steps[state.steps.length - 1].t_end - WINDOW_S;
  while (state.steps.length && state.steps[0].t_end < cutoff) state.steps.shift();
  for (const [r, list] of state.ticks) {
    while (list.length && list[0] < cutoff) list.shift();
    if (!list.length) state.ticks.delete(r);
  }
  for (const [r, w] of state.prefill) if (w.end < cutoff) state.prefill.delete(r);
  while (state.stalls.length && state.stalls[0].t_token < cutoff) state.stalls.shift();
}

function handle(ev) {
  if (ev.kind === "step") addStep(ev);
  else if (ev.kind === "stall") addStall(ev);
  else if (ev.kind === "interference") state.requests = ev.requests;
}

function onMessage(msg) {
  if (msg.kind === "snapshot") {  // first message, and again after a reconnect: start afresh
    state.steps = []; state.ticks.clear(); state.prefill.clear(); state.stalls = [];
    state.preemptions = 0; state.t0 = null;
    state.target = msg.target_itl_ms;
    const s = msg.settings || {};
    document.getElementById("settings").textContent =
      `${s.model || ""} · ${s.policy || ""} · budget ${s.max_num_batched_tokens || "?"}`;
    document.getElementById("target").textContent = Math.round(state.target);
    for (const step of msg.steps) addStep(step);
    for (const st of msg.stalls) addStall(st);
    state.requests = msg.requests;
    state.stats = msg.stats || {};
    state.stallMs = msg.stall_ms_by_cause || {};
  } else if (msg.kind === "batch") {
    for (const ev of msg.events) handle(ev);
    state.stats = msg.stats || state.stats;
    for (const ev of msg.events) {
      if (ev.kind === "stall") state.stallMs[ev.cause] = (state.stallMs[ev.cause] || 0) + ev.excess_ms;
    }
  }
  state.dirty = true;
}

function shadedWindows(yref) {
  const shapes = [];
  for (const [r, w] of state.prefill) {
    if (w.prompt < LONG_PROMPT) continue;
    shapes.push({type: "rect", xref: "x", yref: yref, x0: rel(w.start), x1: rel(w.end), y0: 0, y1: 1,
                 fillcolor: "rgba(220,80,60,0.13)", line: {width: 0}, layer: "below"});
  }
  return shapes;
}

function windowAnnotations() {
  const notes = [];
  for (const [r, w] of state.prefill) {
    if (w.prompt < LONG_PROMPT) continue;
    notes.push({x: rel(w.start), y: 1, xref: "x", yref: "paper", yanchor: "bottom", xanchor: "left",
                text: `${short(r)}: prompt ${w.prompt} tok`, showarrow: false, font: {size: 10, color: "#b33"}});
  }
  return notes;
}

const layoutBase = {margin: {l: 90, r: 60, t: 28, b: 30}, showlegend: true,
                    legend: {orientation: "h", x: 1, xanchor: "right", y: 1.2, font: {size: 11}},
                    paper_bgcolor: "white", plot_bgcolor: "white"};

// The three charts share one time range, so a stall lines up with its step.
function xRange() {
  if (!state.steps.length) return undefined;
  return [rel(state.steps[0].t_start), rel(state.steps[state.steps.length - 1].t_end)];
}

function drawSteps() {
  // One bar per step, as wide as the step ran: a long prefill is a wide bar.
  const mid = state.steps.map(s => rel((s.t_start + s.t_end) / 2));
  const width = state.steps.map(s => Math.max(s.t_end - s.t_start, 0.002));
  const traces = [
    {type: "bar", name: "prefill tokens", x: mid, width: width,
     y: state.steps.map(s => s.num_prefill_tokens), marker: {color: "#e4572e"}},
    {type: "bar", name: "decode tokens", x: mid, width: width,
     y: state.steps.map(s => s.num_decode_tokens), marker: {color: "#4c8bf5"}},
    {type: "scatter", mode: "lines", name: "step time (ms)", x: state.steps.map(s => rel(s.t_end)),
     yaxis: "y2", y: state.steps.map(s => (s.t_end - s.t_start) * 1000),
     line: {color: "#333", width: 1, shape: "vh"}},
  ];
  const layout = Object.assign({}, layoutBase, {
    title: {text: "steps: prefill vs decode tokens, step time", font: {size: 13}},
    barmode: "stack", xaxis: {title: {text: "s"}, range: xRange()},
    yaxis: {title: {text: "tokens"}},
    yaxis2: {title: {text: "ms"}, overlaying: "y", side: "right", rangemode: "tozero"},
    shapes: shadedWindows("paper"), annotations: windowAnnotations()});
  Plotly.react("steps", traces, layout, {displayModeBar: false});
}

function drawStreams() {
  const ids = [...state.ticks.keys()];
  const traces = [{type: "scatter", mode: "markers", name: "tokens", hoverinfo: "x+y",
    x: [], y: [], marker: {symbol: "line-ns-open", size: 9, color: "#4c8bf5"}}];
  for (const r of ids) for (const t of state.ticks.get(r)) { traces[0].x.push(rel(t)); traces[0].y.push(short(r)); }
  const sx = [], sy = [], stext = [];
  for (const st of state.stalls) {
    const who = st.causes.map(c => `${short(c.req_id)} (prompt ${c.prompt_tokens} tok)`).join(", ");
    sx.push(rel(st.t_prev), rel(st.t_token), null); sy.push(short(st.req_id), short(st.req_id), null);
    const text = `stall ${st.gap_ms} ms: ${st.cause}${who ? " — " + who : ""}`;
    stext.push(text, text, null);
  }
  traces.push({type: "scatter", mode: "lines", name: `stalls > ${Math.round(state.target)} ms`,
               x: sx, y: sy, text: stext, hoverinfo: "text", line: {color: "#d62728", width: 5}});
  const layout = Object.assign({}, layoutBase, {
    title: {text: "streams: token ticks, gaps over the target in red (hover: cause)", font: {size: 13}},
    xaxis: {title: {text: "s"}, range: xRange()}, yaxis: {type: "category"},
    shapes: shadedWindows("paper")});
  Plotly.react("streams", traces, layout, {displayModeBar: false});
}

function drawEngine() {
  const x = state.steps.map(s => rel(s.t_end));
  const kv = state.steps.map(s => s.num_blocks_total ? 100 * s.num_blocks_used / s.num_blocks_total : 0);
  const pre = state.steps.filter(s => s.num_preemptions > 0);
  const traces = [
    {type: "scatter", mode: "lines", name: "queued", x: x, y: state.steps.map(s => s.num_waiting),
     line: {shape: "hv", color: "#ff9f1c"}},
    {type: "scatter", mode: "lines", name: "running", x: x, y: state.steps.map(s => s.num_running),
     line: {shape: "hv", color: "#4c8bf5"}},
    {type: "scatter", mode: "lines", name: "KV %", x: x, y: kv, yaxis: "y2",
     line: {shape: "hv", color: "#7b2cbf"}},
    {type: "scatter", mode: "markers", name: "preemptions", x: pre.map(s => rel(s.t_end)),
     y: pre.map(s => s.num_preemptions), marker: {symbol: "x", size: 9, color: "black"}},
  ];
  const layout = Object.assign({}, layoutBase, {
    title: {text: "engine: queue, running, KV occupancy, preemptions", font: {size: 13}},
    xaxis: {title: {text: "s"}, range: xRange()}, yaxis: {title: {text: "requests"}, rangemode: "tozero"},
    yaxis2: {title: {text: "KV %"}, overlaying: "y", side: "right", range: [0, 100]},
    shapes: shadedWindows("paper")});
  Plotly.react("engine", traces, layout, {displayModeBar: false});
}

function cell(row, text, cls) {
  const td = row.insertCell(); td.textContent = text; if (cls) td.className = cls; return td;
}

function drawTables() {
  const body = document.querySelector("#stall-table tbody");
  body.innerHTML = "";
  for (const st of state.stalls.slice(-MAX_STALL_ROWS).reverse()) {
    const row = body.insertRow();
    row.dataset.cause = st.cause;
    row.dataset.req = st.req_id;
    cell(row, rel(st.t_token).toFixed(2));
    cell(row, short(st.req_id));
    cell(row, st.gap_ms.toFixed(0), "num");
    cell(row, st.solo_ms.toFixed(0), "num");
    cell(row, st.cause, "cause");
    cell(row, st.causes.map(c => `${short(c.req_id)} (prompt ${c.prompt_tokens} tok, ${c.prefill_tokens} in gap)`).join(", "), "who");
  }
  const ibody = document.querySelector("#interference-table tbody");
  ibody.innerHTML = "";
  for (const r of state.requests.slice(0, 25)) {
    const row = ibody.insertRow();
    cell(row, short(r.req_id)); cell(row, r.prompt_tokens, "num"); cell(row, r.suffered_ms.toFixed(0), "num");
    cell(row, r.caused_ms.toFixed(0), "num"); cell(row, r.num_stalls, "num");
  }
  const s = state.stats;
  document.getElementById("running").textContent = s.num_running || 0;
  document.getElementById("waiting").textContent = s.num_waiting || 0;
  document.getElementById("kv").textContent =
    s.num_blocks_total ? (100 * s.num_blocks_used / s.num_blocks_total).toFixed(1) : "0";
  document.getElementById("preemptions").textContent = s.num_preemptions_total || state.preemptions;
  if (s.split_decode_threads !== undefined) {  // --core-split: the split and team utilisation
    document.getElementById("core-split").hidden = false;
    document.getElementById("split-threads").textContent =
      `${s.split_prefill_threads}/${s.split_decode_threads}`;
    document.getElementById("split-busy").textContent =
      `${Math.round(100 * (s.prefill_team_utilisation || 0))}/${Math.round(100 * (s.decode_team_utilisation || 0))}`;
  }
  document.getElementById("stall-count").textContent = state.stalls.length;
  document.getElementById("stall-ms").textContent = Object.entries(state.stallMs)
    .filter(([, v]) => v > 0).map(([k, v]) => `${k} ${Math.round(v)} ms`).join(" · ");
}

function redraw() {
  if (!state.dirty) return;
  state.dirty = false;
  trim();
  drawSteps();
  drawStreams();
  drawEngine();
  drawTables();
  document.body.dataset.redraws = String(Number(document.body.dataset.redraws || 0) + 1);
}

function connect() {
  const key = new URLSearchParams(location.search).get("key");
  const url = "/dashboard/events" + (key ? "?key=" + encodeURIComponent(key) : "");
  const source = new EventSource(url);
  const status = document.getElementById("status");
  source.onopen = () => { status.textContent = "live"; status.className = "stat live"; };
  source.onerror = () => { status.textContent = "reconnecting…"; status.className = "stat down"; };
  source.onmessage = (e) => onMessage(JSON.parse(e.data));
}

connect();
setInterval(redraw, REDRAW_MS);
