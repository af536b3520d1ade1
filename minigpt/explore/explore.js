// minigpt explore: the page's state, its requests and its views. The server computes (the trace,
// the norms, the reshaped next-token distribution, the next token, the attribution, the patching
// sweeps); this file only lays out and draws what it answers (draw.js). The stage order comes from
// the trace itself, never from here.
"use strict";

const $ = (id) => document.getElementById(id);
const S = {
  model: null,
  source: null, // {prompt: text} or {ids: [...]}: what is traced
  position: null, // the traced position asked for (null: the last)
  block: 0, // the block the diagram, the attention maps and the controls show
  view: { kind: "block", stage: "output" }, // the row shown: a block's stage, "embedding" or "final"
  edits: { scale: {}, replace: new Set(), ablate: new Set(), atPosition: false, setInput: "" },
  sampling: null, // temperature, top_k, top_p, greedy, seed: start as `minigpt sample` does for this run
  data: null, // the last trace answer
  request: null, // the request it answered
  next: null, // the last /api/next answer
  appendedFrom: null, // chips from here on were appended by "next token"
  attribute: null, // {id, token}: the next token whose logit the attribution splits (chosen from the bars)
  versus: null, // {id, token}: the token whose logit it is compared with (null: the logit alone)
  head: null, // {block, head}: the head an attribution part or a patching cell points at
  clean: null, // what the patching card patches: the prompt traced from the prompt box, never a patch click's
  patching: null, // the /api/patch answers: {stage, head}
  patched: null, // {block, stage, position, head, ids, clean}: the patch a patching cell applies to the corrupt prompt's traces
  patchPosition: "all", // the position whose head effects the head map shows ("all": every one at once)
  grad: false, // whether the trace asks for the gradient of the next token's loss (trace --grad)
  compareRun: false, // whether the trace compares with the server's --compare-run (its pass before, this run's after)
};

// ---------------------------------------------------------------- requests

// One request of each kind in flight; settings changed meanwhile are sent once it returns.
function coalesced(send) {
  let busy = false, again = false;
  return async function run() {
    if (busy) { again = true; return; }
    busy = true;
    try { do { again = false; await send(); } while (again); } finally { busy = false; }
  };
}

async function post(path, body) {
  const response = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  const data = await response.json();
  return { ok: response.ok, data, timing: response.headers.get("Server-Timing") };
}

function traceRequest() {
  const e = S.edits, body = { ...S.source, scale: [], replace_residual: [], ablate_head: [], at_position: e.atPosition };
  if (S.position !== null) body.position = S.position;
  for (let b = 0; b < S.model.n_layer; b++) {
    for (const stage of S.model.scalable) {
      const v = (e.scale[b] || {})[stage];
      if (v !== undefined && v !== 1) body.scale.push(`${b}.${stage}=${v}`);
    }
    if (e.replace.has(b)) body.replace_residual.push(String(b));
    for (let h = 0; h < S.model.n_head; h++) if (e.ablate.has(`${b}.${h}`)) body.ablate_head.push(`${b}.${h}`);
  }
  if (e.setInput.trim()) body.set_input = e.setInput.trim();
  if (S.patched) {
    const { clean, block, stage, position, head } = S.patched;
    body.patch = { clean, block, stage, position, head };
  }
  if (S.attribute && !attributionRefused()) {
    body.attribute = `#${S.attribute.id}`;
    if (S.versus) body.versus = `#${S.versus.id}`;
  }
  if (S.grad) body.grad = true;
  // A patch puts back one run's clean activation: a patched trace is of this run alone.
  if (S.compareRun && !S.patched) body.compare_run = true;
  return body;
}

// Why this trace has no attribution, in the library's words (null: it has one): a post-norm model
// has no residual-stream sum to split, replacing the residual sums removes it, and a patch of some
// stages breaks it at the positions it puts the clean value back (null: every position).
function attributionRefused() {
  const a = S.model.attribution, pt = S.patched;
  const at = S.position === null && pt ? pt.ids.length - 1 : S.position;
  const patched = pt && (pt.position === null || pt.position === at) ? a.refused_patching[pt.stage] : null;
  return a.refused || (S.edits.replace.size ? a.refused_replacing : null) || patched;
}

const trace = coalesced(async () => {
  const body = traceRequest();
  document.body.dataset.state = "busy";
  const start = performance.now();
  const { ok, data, timing } = await post("/api/trace", { ...body, views: true });
  const fetched = performance.now();
  if (!ok) { showError(data.error); return; }
  showError("");
  S.data = data; S.request = body;
  S.position = shown().position;
  const drawn = render();
  document.body.dataset.fetchMs = (fetched - start).toFixed(1);
  document.body.dataset.renderMs = drawn.toFixed(1);
  document.body.dataset.serverMs = timing ? timing.replace(/.*dur=/, "") : "";
  $("timing").textContent = `traced in ${Math.round(fetched - start)} ms (server ${document.body.dataset.serverMs} ms), drawn in ${Math.round(drawn)} ms`;
  document.body.dataset.request = JSON.stringify(body);
  document.body.dataset.state = "ready";
  nextTokens();
});

const nextTokens = coalesced(async () => {
  if (!S.request) return;
  const body = { ...S.request, temperature: S.sampling.temperature, top_k: S.sampling.top_k, top_p: S.sampling.top_p };
  const { ok, data } = await post("/api/next", body);
  if (!ok) { showError(data.error); return; }
  S.next = data;
  keepingFocus(renderBars);
  document.body.dataset.next = JSON.stringify(body);
  // The attribution starts on the likeliest next token, as the bars show it first.
  if (!S.attribute && !attributionRefused() && data.candidates.length) chooseToken(data.candidates[0]);
});

// A next-token bar clicked: the first chooses the token whose logit is split, another the token it
// is compared with; with both chosen, a click starts again from the token clicked.
function chooseToken(c) {
  if (attributionRefused()) return;
  const token = { id: c.id, token: c.token };
  if (!S.attribute || (S.versus && c.id !== S.attribute.id)) { S.attribute = token; S.versus = null; }
  else if (c.id !== S.attribute.id) S.versus = token;
  else return;
  trace();
}

async function step() {
  const s = S.sampling;
  const body = { ...S.source, greedy: s.greedy, seed: s.seed, temperature: s.temperature, top_k: s.top_k, top_p: s.top_p };
  $("step").disabled = true;
  try {
    const { ok, data } = await post("/api/step", body);
    if (!ok) { showError(data.error); return; }
    showError("");
    if (S.appendedFrom === null) S.appendedFrom = data.ids.length - 1;
    S.source = S.clean = { ids: data.ids };
    S.position = null;
    S.patched = null; // a patch is of the corrupt prompt's tokens
    $("prompt").value = data.text;
    const how = s.greedy ? "--greedy" : `--seed ${s.seed}` + settingsFlags();
    $("step-note").textContent = `appended ${show(data.token)} (id ${data.id}, p ${Draw.short(data.probability)}): ` +
      `the token minigpt sample ${how} -n 1 gives after these tokens (the unmodified model)`;
    if (!s.greedy) { s.seed += 1; $("seed").value = s.seed; } // the next draw gets a seed of its own
    document.body.dataset.step = JSON.stringify({ request: body, answer: data });
    await trace();
  } finally { $("step").disabled = false; }
}

function settingsFlags() {
  const s = S.sampling, m = S.model.sample;
  return (s.temperature !== m.temperature ? ` --temperature ${s.temperature}` : "") +
    (s.top_k !== m.top_k ? ` --top-k ${s.top_k}` : "") + (s.top_p !== m.top_p ? ` --top-p ${s.top_p}` : "");
}

function showError(message) {
  $("error").textContent = message || "";
  if (message) document.body.dataset.state = "error";
}

// ---------------------------------------------------------------- what the answer holds

const compared = () => S.data && "before" in S.data;
// Two runs compared (trace --compare-run): before is the other run's pass, after this run's.
const runsCompared = () => compared() && Boolean(S.data.compared_run);
const interventionsSet = () => (compared() && S.data.interventions.length ? `set: ${S.data.interventions.join("; ")}` : "");
const shown = () => (compared() ? S.data.after : S.data);
const before = () => (compared() ? S.data.before : null);
// Attention Residuals has no input row past block 0 (each sublayer reads its own mix over depth): null there.
const stageOrder = (block) => [...(block.input ? ["input"] : []), ...Object.keys(block.stages)];
// The stage a view shows in this block: the one asked for where the block has it, else its output, else
// (Attention Residuals, whose blocks leave no output row) its last stage.
function stageIn(block, name) {
  const order = stageOrder(block);
  return order.includes(name) ? name : order.includes("output") ? "output" : order[order.length - 1];
}
// Grouped-query attention ([model] n_kv_head): query head h reads key and value head h // (n_head / n_kv_head).
const kvGroup = () => S.model.n_head / (S.model.n_kv_head || S.model.n_head);
const headName = (h) => (kvGroup() > 1 ? `head ${h} (kv ${Math.floor(h / kvGroup())})` : `head ${h}`);
const rowOf = (tr, b, name) => (name === "input" ? tr.blocks[b].input.row : tr.blocks[b].stages[name]);
const normOf = (pass, b, name) => S.data.views.norms[pass].blocks[b][name];
const differs = (a, b) => a.length !== b.length || a.some((v, i) => v !== b[i]);

// A stage changed when the library's |change| of its row is above zero (exactly: rows that differ).
function changed(b, name) {
  return compared() && S.data.stages[b][name].change > 0;
}
function blockChanged(b) {
  return compared() && Object.values(S.data.stages[b]).some((c) => c.change > 0);
}
const finalChanged = () => compared() && differs(S.data.before.final_norm.row, S.data.after.final_norm.row);

function show(token) {
  return JSON.stringify(token).slice(1, -1).replace(/ /g, "\u2423") || "\u00a0";
}

// The whole attention matrices arrive as the model's own float32 (or float64) bytes.
function decodeAttention() {
  return S.data.views.attention.map((packed) => {
    const text = atob(packed.data), bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i); // a plain loop: 10x Uint8Array.from's
    const array = packed.dtype === "float64" ? new Float64Array(bytes.buffer) : new Float32Array(bytes.buffer);
    const [, T] = packed.shape;
    return (h, q, k) => array[(h * T + q) * T + k];
  });
}

// ---------------------------------------------------------------- the views

function render() {
  const start = performance.now();
  S.block = Math.min(S.block, S.model.n_layer - 1);
  S.attention = decodeAttention();
  keepingFocus(() => {
    renderTokens();
    renderStrip();
    renderDiagram();
    renderDepth();
    renderRow();
    renderAttention();
    renderStream();
    renderLens();
    renderControls();
    renderKl();
    renderAttribution();
    renderPatching();
    renderGradient();
  });
  return performance.now() - start;
}

// A view drawn again replaces its buttons: the keyboard's place moves to the new one of the same
// meaning (the traced token, the same stage, the same block), so arrow keys and Enter carry on.
function keepingFocus(draw) {
  const a = document.activeElement;
  let again = null;
  if (a && a.closest) {
    if (a.closest("#tokens")) again = "#tokens .chip.traced";
    else if (a.closest("#diagram") && a.dataset.stage) again = `#diagram [data-stage="${a.dataset.stage}"]`;
    else if (a.closest("#bars") && a.dataset.id) again = `#bars .bar[data-id="${a.dataset.id}"]`;
    else if (a.closest("#attribution") && a.dataset.name) again = `#attribution .part[data-name="${a.dataset.name}"]`;
    else if (a.closest("#strip")) again = `#strip button:nth-child(${[...a.parentNode.children].indexOf(a) + 1})`;
    else if (a.id) again = `#${a.id}`;
  }
  draw();
  if (again && !document.contains(a)) {
    const found = document.querySelector(again);
    if (found) found.focus();
  }
}

function renderTokens() {
  const tr = shown(), box = $("tokens");
  box.replaceChildren(...tr.tokens.map((t, i) => {
    const chip = document.createElement("button");
    chip.type = "button";
    chip.className = "chip" + (i === tr.position ? " traced" : "") + (S.appendedFrom !== null && i >= S.appendedFrom ? " new" : "");
    chip.dataset.position = i;
    chip.dataset.id = tr.ids[i];
    chip.tabIndex = i === tr.position ? 0 : -1;
    chip.title = `position ${i}, id ${tr.ids[i]}: trace this position`;
    chip.textContent = show(t);
    chip.addEventListener("click", () => { S.position = i; trace(); });
    return chip;
  }));
}

function moveAmongTokens(event) {
  const chips = [...$("tokens").querySelectorAll(".chip")];
  const at = chips.indexOf(document.activeElement);
  if (at < 0) return;
  const to = { ArrowLeft: at - 1, ArrowRight: at + 1, Home: 0, End: chips.length - 1 }[event.key];
  if (to === undefined) return;
  event.preventDefault();
  const next = chips[Math.max(0, Math.min(chips.length - 1, to))];
  chips.forEach((c) => (c.tabIndex = c === next ? 0 : -1));
  next.focus();
}

function stripButton(text, title, pressed, onClick, className) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  b.title = title;
  b.setAttribute("aria-pressed", pressed ? "true" : "false");
  if (className) b.className = className;
  b.addEventListener("click", onClick);
  return b;
}

function renderStrip() {
  const m = S.model, v = S.view;
  // Where positions enter (the server's positions_enter): a learned table's row joins the token row here;
  // rope and alibi act inside attention (the diagram's attention box says how); none adds nothing.
  const table = m.positions_enter.at === "input";
  const input = table ? "the input: token row + position row" : `the input: token row alone (${m.positions_enter.about})`;
  const buttons = [stripButton(m.n_layer > 6 ? "input" : table ? "tokens + positions" : "tokens", input, v.kind === "embedding",
    () => select({ kind: "embedding" }), "end")];
  for (let b = 0; b < m.n_layer; b++) {
    const button = stripButton(m.n_layer > 8 ? String(b) : `block ${b}`, `block ${b}`, v.kind === "block" && S.block === b,
      () => { S.block = b; select({ kind: "block", stage: v.kind === "block" ? v.stage : "output" }); },
      (blockChanged(b) ? "changed" : "") + (patchedHere(b) ? " patched" : ""));
    button.dataset.block = b;
    buttons.push(button);
  }
  const final = stripButton("final norm", "the final norm of the last block's output", v.kind === "final",
    () => select({ kind: "final" }), "end" + (finalChanged() ? " changed" : ""));
  buttons.push(final, stripButton(m.n_layer > 6 ? "head" : "head \u2192 next", "the head: logits, then the next-token distribution", false,
    () => $("temperature").focus(), "end"));
  $("strip").replaceChildren(...buttons);
  $("model-note").textContent = `block ${S.block} as computed, Figure 17.1; click a stage for its row`;
}

function select(view) {
  S.view = view.kind === "block" ? { ...view, stage: stageIn(shown().blocks[S.block], view.stage) } : view;
  keepingFocus(() => { renderStrip(); renderDiagram(); renderDepth(); renderRow(); renderAttention(); renderStream(); renderLens(); renderControls(); renderGradient(); });
}

// Figure 17.1 laid on its side: the residual stream along the top, each sublayer's branch below
// it, rejoining at its add. Which stages are branches follows from the adds the server names.
function renderDiagram() {
  const NS = "http://www.w3.org/2000/svg";
  const tr = shown(), b = S.block, block = tr.blocks[b];
  // The model as built: without norms (norm = "none") a norm stage is its input unchanged, so no box.
  const drawn = (s) => S.model.norm !== "none" || !["norm1", "norm2"].includes(s);
  const order = stageOrder(block).filter(drawn), adds = S.model.residual_adds;
  const branch = new Set();
  for (const [add, source] of Object.entries(adds)) {
    const i = order.indexOf(source), j = order.indexOf(add);
    for (let k = i + 1; i >= 0 && k < j; k++) branch.add(order[k]);
  }
  const W = Math.max(300, $("diagram").clientWidth || 600), cols = order.length, colW = W / cols;
  // rope and alibi: positions enter inside attention, said under its box ("rotate Q, K", "bias on the scores")
  const inside = S.model.positions_enter.at === "attention" ? S.model.positions_enter : null;
  // Attention Residuals: read1 and read2 mix over depth, said under their boxes; no add, so no branch row
  const depth = S.model.depth, mixes = (name) => (depth && depth.at.includes(name) ? depth : null);
  const boxW = Math.min(112, colW - 10), boxH = 40, top = 6, low = 78;
  const H = (depth && !branch.size ? top : low) + boxH + 8 + (inside || depth ? 14 : 0);
  const x = (i) => i * colW + (colW - boxW) / 2;
  const y = (name) => (branch.has(name) ? low : top);
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("height", H);
  svg.innerHTML = `<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" orient="auto">
    <path d="M0,0 L8,4 L0,8 z" fill="#4a5868"/></marker></defs>`;
  const wire = (d, cls) => {
    const p = document.createElementNS(NS, "path");
    p.setAttribute("d", d);
    p.setAttribute("class", `wire ${cls || ""}`);
    p.setAttribute("marker-end", "url(#arrow)");
    svg.appendChild(p);
  };
  const stream = order.filter((s) => !branch.has(s));
  stream.slice(1).forEach((s, n) => {
    const from = order.indexOf(stream[n]), to = order.indexOf(s);
    wire(`M${x(from) + boxW},${top + boxH / 2} H${x(to)}`, adds[s] === stream[n] ? "skip" : "");
  });
  for (const [add, source] of Object.entries(adds)) {
    const i = order.indexOf(source), j = order.indexOf(add);
    const inner = order.slice(i + 1, j);
    if (i < 0 || j < 0 || !inner.length) continue;
    const first = order.indexOf(inner[0]), last = order.indexOf(inner[inner.length - 1]);
    wire(`M${x(i) + boxW / 2},${top + boxH} V${low + boxH / 2} H${x(first)}`);
    for (let k = first; k < last; k++) wire(`M${x(k) + boxW},${low + boxH / 2} H${x(k + 1)}`);
    wire(`M${x(last) + boxW},${low + boxH / 2} H${x(j) + boxW / 2} V${top + boxH}`);
  }
  order.forEach((name, i) => {
    const g = document.createElementNS(NS, "g");
    const isChanged = changed(b, name);
    g.setAttribute("class", `stage${name in adds ? " add" : ""}${branch.has(name) ? " branch" : ""}`);
    g.setAttribute("tabindex", "0");
    g.setAttribute("role", "button");
    g.setAttribute("data-stage", name);
    g.setAttribute("data-block", b);
    g.setAttribute("data-changed", isChanged ? "true" : "false");
    g.setAttribute("data-patched", patchedHere(b, name) ? "true" : "false");
    g.setAttribute("aria-pressed", S.view.kind === "block" && S.view.stage === name ? "true" : "false");
    const norm = normOf("after", b, name);
    const positions = inside && name === "attention" ? inside : null;
    if (positions) g.setAttribute("data-positions", positions.label);
    const mix = mixes(name), read = mix ? block.depth.find((r) => r.stage.endsWith(`.depth_weights${name.slice(-1)}`)) : null;
    if (mix) g.setAttribute("data-depth", mix.label);
    const note = positions || mix;
    g.setAttribute("aria-label", `block ${b} ${name}, norm ${Draw.short(norm)}${isChanged ? ", changed" : ""}` +
      (patchedHere(b, name) ? ", where the patch puts the clean value" : "") + (note ? `, ${note.label}` : ""));
    const label = (name in adds ? "+ " : "") + name;
    const size = boxW < 88 ? 11 : 12;
    g.innerHTML = `<rect x="${x(i)}" y="${y(name)}" width="${boxW}" height="${boxH}" rx="5"/>` +
      `<text x="${x(i) + boxW / 2}" y="${y(name) + 16}" text-anchor="middle" style="font-size:${size}px">${esc(label)}</text>` +
      `<text class="norm" x="${x(i) + boxW / 2}" y="${y(name) + 31}" text-anchor="middle">${isChanged ? "\u0394 " : ""}\u2016x\u2016 ${Draw.short(norm)}</text>` +
      (note ? `<text class="positions" x="${x(i) + boxW / 2}" y="${y(name) + boxH + 12}" text-anchor="middle">${esc(note.label)}</text>` : "") +
      `<title>${esc(name)}: shape ${JSON.stringify(name === "input" ? block.input.shape : block.shapes[name])}` +
      `${note ? ` · ${esc(note.about)}` : ""}` +
      `${read ? ` · layer ${read.layer} (${esc(read.reader)}) reads ${read.sources.map((src, k) => `${esc(src)} ${Draw.short(read.weights[k])}`).join(", ")}` : ""}</title>`;
    const choose = () => select({ kind: "block", stage: name });
    g.addEventListener("click", choose);
    g.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); choose(); focusStage(name); } });
    svg.appendChild(g);
  });
  $("diagram").replaceChildren(svg);
}

// Attention Residuals: every read's depth weights at the traced position (the trace's own numbers), a
// row of small bars per layer, one bar per source (its height the weight; they sum to 1); the selected
// block's reads outlined, and with a comparison the before pass's weight marked on each bar.
function renderDepth() {
  const box = $("depth");
  if (!S.model.depth) { box.hidden = true; box.replaceChildren(); return; }
  box.hidden = false;
  const reads = (t) => [...t.blocks.flatMap((block) => block.depth), t.final_depth];
  const now = reads(shown()), was = before() ? reads(before()) : null, p = shown().position;
  const head = Draw.span(`depth weights at position ${p}: each sublayer's softmax over the embedding and the earlier ` +
    "outputs it reads, a bar per source (they sum to 1); click a row for its read", "facts");
  const rows = now.map((read, k) => {
    const old = was && was[k] && was[k].sources.join() === read.sources.join() ? was[k] : null;
    const final = read.reader === "final_norm";
    const block = final ? null : Number(read.stage.split(".")[1]);
    const row = document.createElement("div");
    const selected = S.view.kind === "final" ? final : !final && block === S.block;
    row.className = "depth-row" + (selected ? " selected" : "");
    row.dataset.layer = read.layer;
    row.dataset.stage = read.stage;
    row.tabIndex = 0;
    row.setAttribute("role", "button");
    const bars = document.createElement("div");
    bars.className = "depth-bars";
    read.weights.forEach((w, i) => {
      const bar = document.createElement("div");
      bar.className = "depth-bar";
      bar.dataset.source = read.sources[i];
      bar.dataset.weight = w;
      const fill = document.createElement("div");
      fill.className = "fill";
      fill.style.height = `${100 * w}%`; // drawn length only: the number is the server's
      bar.appendChild(fill);
      if (old) {
        const mark = document.createElement("div");
        mark.className = "was";
        mark.style.bottom = `${100 * old.weights[i]}%`;
        bar.appendChild(mark);
      }
      bar.title = `layer ${read.layer} (${read.reader}) reads ${read.sources[i]}: weight ${w}` + (old ? ` (before ${old.weights[i]})` : "");
      bars.appendChild(bar);
    });
    const label = final ? "final norm" : `${read.layer} ${read.reader}`;
    row.append(Draw.span(label, "label"), bars, Draw.span(`\u03a3 ${Draw.short(read.total)}`, "sum"));
    const choose = () => {
      if (final) { select({ kind: "final" }); return; }
      S.block = block;
      select({ kind: "block", stage: read.stage.endsWith("1") ? "read1" : "read2" });
    };
    row.addEventListener("click", choose);
    row.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); choose(); } });
    return row;
  });
  box.replaceChildren(head, ...rows);
}

function focusStage(name) {
  const g = $("diagram").querySelector(`[data-stage="${name}"]`);
  if (g) g.focus();
}

const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

// The shown row: every value as a heat strip (before and after when an intervention is set),
// a legend, the norms, and the exact numbers one click away.
function renderRow() {
  const tr = shown(), old = before(), v = S.view, p = tr.position, b = S.block;
  let title, lines, facts;
  const pair = (label, get) => (old ? [["before", get(old)], ["after", get(tr)]] : [[label, get(tr)]]);
  if (v.kind === "embedding") {
    const table = tr.input.position_row !== null && tr.input.position_row !== undefined;
    const inside = S.model.positions_enter.at === "attention" ? `; positions enter inside attention: ${S.model.positions_enter.label}` : "";
    title = `input at position ${p} (${S.data.views.traced_token}): ` + (table ? "token row + position row" : `token row (no position table${inside})`);
    lines = [
      ["token", tr.input.token_row], ...(table ? [["position", tr.input.position_row]] : []),
      ...(old && changed(0, "input") ? [["before", old.input.row], ["after", tr.input.row]] : [["= input", tr.input.row]]),
    ];
    facts = `shape ${JSON.stringify(tr.input.shape)} · token table ${JSON.stringify(tr.input.token_table_shape)} · ` +
      `position table ${table ? JSON.stringify(tr.input.position_table_shape) : "none"} · \u2016input\u2016 ${Draw.short(normOf("after", 0, "input"))}`;
  } else if (v.kind === "final") {
    title = `final norm at position ${p}: what the head reads`;
    lines = pair("final_norm", (t) => t.final_norm.row);
    // Attention Residuals: the mix over depth the final norm reads, first
    if (tr.final_read) lines = [...pair("final_read", (t) => t.final_read.row).map(([l, r]) => [old ? `${l} read` : l, r]), ...lines];
    facts = `shape ${JSON.stringify(tr.final_norm.shape)} · \u2016row\u2016 ${Draw.short(S.data.views.norms.after.final_norm)}` +
      (old ? ` (before ${Draw.short(S.data.views.norms.before.final_norm)})` : "");
  } else {
    const name = stageIn(tr.blocks[b], v.stage);
    S.view.stage = name;
    const block = tr.blocks[b];
    title = `block ${b} · ${name} at position ${p} (${S.data.views.traced_token})`;
    lines = pair(name, (t) => rowOf(t, b, name));
    const shape = name === "input" ? block.input.shape : block.shapes[name];
    facts = `shape ${JSON.stringify(shape)} · \u2016row\u2016 ${Draw.short(normOf("after", b, name))}`;
    if (old) {
      const c = S.data.stages[b][name];
      facts += ` (before ${Draw.short(c.norm_before)}) · |change| <b>${Draw.short(c.change)}</b>`;
    }
  }
  $("row-title").textContent = title;
  const box = $("row");
  const width = Math.max(120, box.clientWidth - 70);
  const limit = Draw.limitOf(lines.map(([, row]) => row));
  const out = [];
  const f = document.createElement("div");
  f.className = "facts";
  f.innerHTML = facts;
  out.push(f);
  for (const [label, row] of lines) {
    const line = document.createElement("div");
    line.className = "rowline";
    const canvas = Draw.strip(row, limit, width);
    canvas.dataset.row = label;
    hover(canvas, (x, y) => {
      const i = canvas.cells.at(x, y);
      return i < 0 ? null : `${label} coordinate ${i}: ${row[i]}`;
    });
    line.append(Draw.span(label, "label"), canvas);
    out.push(line);
  }
  out.push(Draw.legend("value", limit, `${lines[0][1].length} values`));
  const tools = document.createElement("div");
  tools.className = "tools";
  const numbers = exactNumbers(() => {
    const [, first] = lines[lines.length - 1];
    return first.map((_, i) => `${i}: ${lines.map(([l, r]) => (lines.length > 1 ? `${l} ` : "") + r[i]).join("  ")}`);
  });
  const download = document.createElement("button");
  download.type = "button";
  download.textContent = "download the trace JSON";
  download.title = "what minigpt trace --json (--compare with an intervention, --compare-run with the run compared, --attribute with a token chosen) prints for these settings";
  download.addEventListener("click", downloadJson);
  tools.append(numbers, download);
  out.push(tools);
  box.replaceChildren(...out);
}

function downloadJson() {
  const { views, ...plain } = S.data;
  const url = URL.createObjectURL(new Blob([JSON.stringify(plain)], { type: "application/json" }));
  const a = document.createElement("a");
  a.href = url; a.download = "trace.json";
  document.body.appendChild(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function hover(element, describe) {
  const tip = $("tip");
  element.addEventListener("mousemove", (e) => {
    const r = element.getBoundingClientRect();
    const text = describe(e.clientX - r.left, e.clientY - r.top);
    if (!text) { tip.hidden = true; return; }
    tip.textContent = text;
    tip.hidden = false;
    const w = tip.offsetWidth, h = tip.offsetHeight;
    tip.style.left = `${Math.max(4, Math.min(window.innerWidth - w - 4, e.clientX + 12))}px`;
    tip.style.top = `${e.clientY + h + 16 > window.innerHeight ? e.clientY - h - 8 : e.clientY + 14}px`;
  });
  element.addEventListener("mouseleave", () => (tip.hidden = true));
}

// Every head of the selected block at a readable size, then every block's heads as thumbnails.
function renderAttention() {
  const tr = shown(), b = S.block, H = S.model.n_head, T = tr.tokens.length, p = tr.position;
  const weight = S.attention[b];
  const box = $("attention");
  const avail = Math.max(160, box.clientWidth);
  const cols = Math.min(H, Math.max(1, Math.floor(avail / 140)));
  const labels = tr.tokens.map(show);
  const mapWidth = Math.floor(avail / cols) - 12;
  let cell = Math.max(2, Math.min(36, Math.floor(mapWidth / T)));
  const pad = cell >= 11 ? Math.min(64, 7 * Math.max(...labels.map((t) => Math.min(8, t.length))) + 6) : 0;
  cell = Math.max(2, Math.min(36, Math.floor((mapWidth - pad) / T)));
  const kv = kvGroup() > 1 ? ` reading ${S.model.n_kv_head} kv head${S.model.n_kv_head > 1 ? "s" : ""}` : "";
  $("attention-title").textContent = `Attention · block ${b} · ${H} head${H > 1 ? "s" : ""}${kv} over ${T} token${T > 1 ? "s" : ""}`;
  const note = document.createElement("div");
  note.className = "facts";
  note.textContent = `query rows, key columns; the future is masked; position ${p}'s row is outlined. Click a row to trace that position.`;
  const heads = document.createElement("div");
  heads.className = "heads";
  for (let h = 0; h < H; h++) {
    const fig = document.createElement("div");
    fig.className = "heat" + (S.head && S.head.block === b && S.head.head === h ? " chosen" : "");
    const canvas = Draw.heatMap(T, (q, k) => weight(h, q, k), cell, { traced: p, labels });
    canvas.dataset.block = b;
    canvas.dataset.head = h;
    canvas.classList.add("attention-map");
    hover(canvas, (x, y) => {
      const at = canvas.cells.at(x, y);
      if (!at) return null;
      const [q, k] = at;
      return k > q ? `query ${q} ${labels[q]} cannot see key ${k} (the future)` :
        `${headName(h)}: query ${q} ${labels[q]} \u2192 key ${k} ${labels[k]}\nweight ${weight(h, q, k)}`;
    });
    canvas.addEventListener("click", (e) => {
      const r = canvas.getBoundingClientRect(), at = canvas.cells.at(e.clientX - r.left, e.clientY - r.top);
      if (at && at[0] !== S.position) { S.position = at[0]; trace(); }
    });
    fig.append(Draw.span(headName(h), "title"), canvas);
    heads.appendChild(fig);
  }
  const parts = [note, heads, Draw.legend("weight", 1, "attention weight")];
  if (S.model.n_layer > 1) {
    const thumb = Math.max(12, Math.min(40, Math.floor((avail - 34) / H) - 3));
    const all = Draw.overview(S.model.n_layer, H, T, (bb, h, q, k) => S.attention[bb](h, q, k), thumb, 3, b);
    all.id = "overview-map";
    hover(all, (x, y) => {
      const at = all.cells.at(x, y);
      if (!at) return null;
      const [bb, h, q, k] = at;
      return k > q ? `block ${bb} ${headName(h)}` : `block ${bb} ${headName(h)}: query ${q} ${labels[q]} \u2192 key ${k} ${labels[k]}\nweight ${S.attention[bb](h, q, k)}`;
    });
    all.addEventListener("click", (e) => {
      const r = all.getBoundingClientRect(), at = all.cells.at(e.clientX - r.left, e.clientY - r.top);
      if (at) { S.block = at[0]; select(S.view.kind === "block" ? S.view : { kind: "block", stage: "output" }); }
    });
    const wrap = document.createElement("div");
    wrap.id = "overview";
    wrap.append(Draw.span("every block (rows) and head (columns); click one to show its block", "facts"), all);
    parts.push(wrap);
  }
  box.replaceChildren(...parts);
}

// The residual stream's norm at every stream stage (not the branches), block after block.
function renderStream() {
  const tr = shown(), adds = S.model.residual_adds, points = [];
  tr.blocks.forEach((block, b) => {
    const order = stageOrder(block), branch = new Set();
    for (const [add, source] of Object.entries(adds)) {
      const i = order.indexOf(source), j = order.indexOf(add);
      for (let k = i + 1; i >= 0 && k < j; k++) branch.add(order[k]);
    }
    order.forEach((name) => { if (!branch.has(name) && (b === 0 || name !== "input")) points.push([b, name]); });
  });
  const series = [];
  const make = (pass) => ({
    name: pass,
    points: points.map(([b, name]) => ({
      y: normOf(pass, b, name), changed: pass === "after" && changed(b, name),
      tip: `block ${b} ${name}: \u2016x\u2016 = ${normOf(pass, b, name)}${pass === "before" ? " (before)" : ""}`,
    })),
  });
  if (compared()) series.push(make("before"));
  series.push(make("after"));
  const labels = points.map(([b, name], i) => ({ text: name === "input" ? "input" : `${b}.${name}`, major: i === 0 }));
  const width = Math.max(240, $("stream").clientWidth);
  const svg = Draw.lineChart(series, labels, width, 170, (i) => { S.block = points[i][0]; select({ kind: "block", stage: points[i][1] }); });
  svg.querySelectorAll("circle").forEach((c) => hover(c, () => c.tip));
  const key = document.createElement("div");
  key.className = "key";
  key.textContent = runsCompared() ? `solid: this run · dashed: the compared run ${S.data.compared_run} · orange points: changed` :
    compared() ? "solid: after the intervention · dashed: before · orange points: changed" :
    S.model.depth ? "every row at the traced position: no stream (Attention Residuals), read1 and read2 are each sublayer's mix over depth" :
    "each block's input, residual adds and output, at the traced position";
  $("stream-title").textContent = S.model.depth ? "Norm of each row" : "Norm of the residual stream";
  $("stream").replaceChildren(svg, key);
}

// The gradient's norm at every stage (rows) of every block (columns), coloured on a log scale; a
// click shows that stage's row. With an intervention, the modified pass's (the before in the tip).
const GRAD_TARGET = {
  prompt: "the prompt's next token",
  given: "the token asked for",
  prediction: "the model's top prediction (the prompt has no next token here)",
};
function renderGradient() {
  const box = $("gradient"), g = shown().gradient, old = before() && before().gradient;
  if (!S.grad || !g) { box.replaceChildren(); return; }
  const order = stageOrder(shown().blocks[0]);
  // Attention Residuals: no input row past block 0 (null: an empty cell)
  const norm = (grad, b, name) => { const e = name === "input" ? grad.blocks[b].input : grad.blocks[b].stages[name]; return e ? e.norm : null; };
  const values = g.blocks.flatMap((_, b) => order.map((name) => norm(g, b, name))).filter((v) => v > 0);
  const low = Math.log(Math.min(...values)), high = Math.log(Math.max(...values));
  const facts = document.createElement("div");
  facts.className = "facts";
  facts.innerHTML = `loss −log p(${esc(show(g.target))}) = <b id="grad-loss" data-value="${g.loss}">${Draw.short(g.loss)}</b> nats at position ${shown().position}: ` +
    `${esc(show(g.target))} is ${GRAD_TARGET[g.target_from]}` + (old ? ` (before: ${Draw.short(old.loss)})` : "") +
    ` · ‖grad‖ of final_norm ${Draw.short(g.final_norm.norm)}`;
  const table = document.createElement("table");
  const head = table.insertRow();
  head.appendChild(document.createElement("th"));
  g.blocks.forEach((block) => {
    const th = document.createElement("th");
    th.textContent = `block ${block.index}`;
    if (block.index === S.block) th.className = "selected";
    head.appendChild(th);
  });
  for (const name of order) {
    const row = table.insertRow();
    const th = document.createElement("th");
    th.textContent = name;
    row.appendChild(th);
    g.blocks.forEach((block, b) => {
      const v = norm(g, b, name), td = row.insertCell();
      if (v === null) return;
      const t = v > 0 && high > low ? (Math.log(v) - low) / (high - low) : v > 0 ? 1 : 0;
      td.style.background = Draw.css(Draw.sequential(t));
      td.style.color = t > 0.55 ? "#fff" : "#1d232b";
      td.textContent = Draw.short(v);
      td.dataset.block = block.index;
      td.dataset.stage = name;
      td.dataset.norm = v;
      td.title = `block ${block.index} ${name}: ‖d loss / d row‖ = ${v}` + (old ? ` (before ${norm(old, b, name)})` : "");
      td.addEventListener("click", () => { S.block = block.index; select({ kind: "block", stage: name }); });
    });
  }
  box.replaceChildren(facts, table);
}

function renderLens() {
  const tr = shown(), table = document.createElement("table");
  const top = Math.min(3, tr.blocks[0].logit_lens.length);
  tr.blocks.forEach((block, b) => {
    const row = table.insertRow();
    if (b === S.block) row.className = "selected";
    const th = document.createElement("th");
    th.textContent = `block ${b}`;
    row.appendChild(th);
    block.logit_lens.slice(0, top).forEach((c) => {
      const td = row.insertCell();
      const rgb = Draw.sequential(c.probability);
      td.style.background = Draw.css(rgb);
      td.style.color = c.probability > 0.55 ? "#fff" : "#1d232b";
      td.textContent = `${show(c.token)} ${c.probability.toFixed(3)}`;
      td.title = `${JSON.stringify(c.token)} id ${c.id}: probability ${c.probability}, logit ${c.logit}`;
      td.dataset.id = c.id;
      td.dataset.probability = c.probability;
    });
  });
  $("lens").replaceChildren(table);
}

function renderKl() {
  const what = runsCompared() ?
    `as trace --compare-run gives it) · before: the compared run ${esc(S.data.compared_run)}, after: this run` +
      (S.data.interventions.length ? ` · interventions in both: ${esc(S.data.interventions.join("; "))}` : "") :
    `as trace --compare gives it) · interventions: ${esc(compared() ? S.data.interventions.join("; ") : "")}`;
  $("kl-line").innerHTML = compared() ?
    `KL(before \u2016 after) = <b id="kl">${Draw.short(S.data.kl_divergence)}</b> nats (temperature 1, unfiltered, ${what}` : "";
  const kl = $("kl");
  if (kl) { kl.dataset.value = S.data.kl_divergence; kl.title = String(S.data.kl_divergence); }
}

function renderBars() {
  const n = S.next, s = S.sampling;
  if (!n) return;
  const was = n.before ? new Map(n.before.candidates.map((c) => [c.id, c.probability])) : null;
  const rows = n.candidates.map((c) => {
    const row = document.createElement("div");
    const role = S.attribute && S.attribute.id === c.id ? "chosen" : S.versus && S.versus.id === c.id ? "versus" : "";
    row.className = "bar" + (c.probability === 0 ? " filtered" : "") + (role ? ` ${role}` : "");
    row.tabIndex = 0;
    row.setAttribute("role", "button");
    row.setAttribute("aria-pressed", role ? "true" : "false");
    row.addEventListener("click", () => chooseToken(c));
    row.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); chooseToken(c); } });
    row.dataset.id = c.id;
    row.dataset.probability = c.probability;
    row.dataset.unfiltered = c.unfiltered;
    row.title = `${JSON.stringify(c.token)} id ${c.id}: probability ${c.probability} (temperature 1, unfiltered ${c.unfiltered}; logit ${c.logit})` +
      (role === "chosen" ? "\nits logit is attributed" : role === "versus" ? "\nthe attribution compares with it" : "\nclick: attribute its logit (or compare with it)");
    const track = document.createElement("div");
    track.className = "track";
    const fill = document.createElement("div");
    fill.className = "fill";
    fill.style.width = `${100 * c.probability}%`;
    const tick = document.createElement("div");
    tick.className = "plain";
    tick.style.left = `calc(${100 * c.unfiltered}% - 1px)`;
    track.append(fill, tick);
    if (was && was.has(c.id)) {
      const w = document.createElement("div");
      w.className = "was";
      w.style.width = `${100 * was.get(c.id)}%`;
      track.appendChild(w);
    }
    row.append(Draw.span(show(c.token), "tok"), track, Draw.span(c.probability === 0 ? "filtered" : c.probability.toFixed(4), "p"));
    return row;
  });
  const foot = document.createElement("div");
  foot.className = "facts";
  foot.textContent = `${n.kept} of ${n.of} tokens left to draw from; bars: temperature ${s.temperature}, top-k ${s.top_k || "off"}, ` +
    `top-p ${s.top_p < 1 ? s.top_p : "off"} (sample's own filter); tick: temperature 1, unfiltered` + (was ? "; grey: before" : "") +
    (attributionRefused() ? "" : "; click a bar to attribute its logit, another to compare with it");
  $("bars").replaceChildren(...rows, foot);
}

// ---------------------------------------------------------------- attribution

// The chosen token's logit (minus the versus token's) as the parts that wrote it, the library's
// numbers (Run.trace's attribution): one bar each, before and after with an intervention. A part is
// a click away from its stage in the diagram.
function renderAttribution() {
  const box = $("attribution"), pick = $("attribution-pick");
  const refused = attributionRefused(), after = shown().attribution, was = before() && before().attribution;
  if (refused || !after) {
    pick.replaceChildren();
    box.replaceChildren(Draw.span(refused || "click a next-token bar to split its logit into the parts that wrote it", "facts"));
    return;
  }
  const token = (text, id) => `<b>${esc(show(text))}</b> (#${id})`;
  const what = document.createElement("span");
  what.innerHTML = `logit of ${token(after.token, after.id)}` + (after.versus === null ? "" : ` \u2212 logit of ${token(after.versus, after.versus_id)}`);
  const clear = stripButton("clear versus", "attribute the chosen token's logit alone", false, () => { S.versus = null; trace(); });
  clear.id = "clear-versus";
  clear.disabled = after.versus === null;
  pick.replaceChildren(what, clear);
  const rows = mergedParts(was ? was.parts : [], after.parts);
  const limit = Draw.limitOf([rows.flatMap((r) => [r.before ?? 0, r.after ?? 0])]); // the parts' scale: the total has no bar
  const facts = document.createElement("div");
  facts.className = "facts";
  facts.innerHTML = `at position ${after.position}: total <b id="attribution-total">${Draw.short(after.total)}</b>` +
    (was ? ` (before ${Draw.short(was.total)})` : "") + ` = the sum of the ${after.parts.length} parts, off by ${Draw.short(after.error)}; ` +
    `each through the final norm's scale ${Draw.short(after.scale)}. Click a part for its stage.`;
  const total = { name: "total", after: after.total, before: was ? was.total : undefined };
  const list = document.createElement("div");
  list.className = "parts";
  list.append(...rows.map((r) => partRow(r, limit, !!was)));
  box.replaceChildren(facts, list, partRow(total, limit, !!was)); // the total stays in sight of a long list
}

// The parts of both passes in the model's order (set_input replaces token and position by input).
function mergedParts(before, after) {
  const rows = [], at = new Map();
  const add = (parts, pass) => parts.forEach(({ name, value }, i) => {
    if (!at.has(name)) {
      const row = { name };
      // a name new to this pass goes where its pass has it: before the next name both share
      const next = parts.slice(i + 1).find((p) => at.has(p.name));
      rows.splice(next ? rows.indexOf(at.get(next.name)) : rows.length, 0, row);
      at.set(name, row);
    }
    at.get(name)[pass] = value;
  });
  add(after, "after");
  add(before, "before");
  return rows;
}

function partRow(r, limit, compared) {
  const row = document.createElement("div");
  const isTotal = r.name === "total";
  row.className = "part" + (isTotal ? " total" : "") + (compared ? " compared" : "");
  row.dataset.name = r.name;
  if (r.after !== undefined) row.dataset.value = r.after;
  if (r.before !== undefined) row.dataset.before = r.before;
  const exact = (compared ? [`before ${r.before ?? "-"}`, `after ${r.after ?? "-"}`] : [String(r.after)]).join(", ");
  row.title = `${r.name}: ${exact}` + (isTotal ? " (the pass's own logit difference)" : "\nclick: its stage in the diagram");
  const track = document.createElement("div");
  track.className = "track";
  track.appendChild(Draw.span("", "zero"));
  for (const pass of compared ? ["before", "after"] : ["after"]) {
    const v = r[pass];
    if (v === undefined || isTotal) continue;
    const fill = Draw.span("", `fill ${pass}${v < 0 ? " negative" : ""}`);
    const half = limit > 0 ? (50 * Math.abs(v)) / limit : 0; // drawn length only: the number is the server's
    fill.style.left = `${v < 0 ? 50 - half : 50}%`;
    fill.style.width = `${half}%`;
    track.appendChild(fill);
  }
  const text = compared ? `${r.before === undefined ? "-" : Draw.short(r.before)} \u2192 ${r.after === undefined ? "-" : Draw.short(r.after)}` : Draw.short(r.after);
  row.append(Draw.span(r.name, "name"), track, Draw.span(text, "v"));
  if (!isTotal) {
    row.tabIndex = 0;
    row.setAttribute("role", "button");
    row.addEventListener("click", () => selectPart(r.name));
    row.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); selectPart(r.name); } });
  }
  return row;
}

// A part's stage: B.attention.headH and B.attention.bias are block B's attention (the head's map
// outlined), B.ffn its FFN, final_norm.bias the final norm, token, position and input the input.
function selectPart(name) {
  const m = /^(\d+)\.(attention|ffn)(?:\.head(\d+))?/.exec(name);
  if (m) {
    S.block = Number(m[1]);
    S.head = m[3] === undefined ? null : { block: S.block, head: Number(m[3]) };
    select({ kind: "block", stage: m[2] });
  } else select(name === "final_norm.bias" ? { kind: "final" } : { kind: "embedding" });
  $("model-card").scrollIntoView({ block: "nearest" });
}

// ---------------------------------------------------------------- activation patching

function bindPatching() {
  const refused = S.model.attribution.refused; // patching measures the same residual-stream sum
  if (refused) { $("patch-error").textContent = refused; $("patch-go").disabled = true; }
  for (const id of ["patch-answer", "patch-versus"]) $(id).addEventListener("input", () => ($(id).dataset.auto = "false"));
  $("patch-form").addEventListener("submit", (e) => { e.preventDefault(); patch(); });
}

// A token box the page filled is sent empty, so the server picks again for new prompts.
const tokenBox = (id) => ($(id).dataset.auto === "true" || $(id).value === "" ? null : $(id).value);

function fillTokenBox(id, spelled) {
  if ($(id).dataset.auto === "false" && $(id).value !== "") return; // the user's own choice stays
  $(id).value = spelled;
  $(id).dataset.auto = "true";
}

// Both sweeps, by stage and then by head, for the same two tokens: Run.patch's own numbers.
async function patch() {
  const clean = "prompt" in S.clean ? S.clean.prompt : S.clean.ids;
  const body = { clean, corrupt: $("corrupt").value, answer: tokenBox("patch-answer"), versus: tokenBox("patch-versus"), by: "stage" };
  const failed = (message) => { $("patch-error").textContent = message; document.body.dataset.patchState = "error"; };
  $("patch-go").disabled = true;
  document.body.dataset.patchState = "busy";
  $("patch-error").textContent = "";
  try {
    const stage = await post("/api/patch", body);
    if (!stage.ok) return failed(stage.data.error);
    fillTokenBox("patch-answer", stage.data.spelled.answer);
    fillTokenBox("patch-versus", stage.data.spelled.versus);
    S.patching = { stage: stage.data, head: null };
    S.patchPosition = "all";
    if (S.patched) { S.patched = null; trace(); } // an old patch is of the old sweep's prompts
    renderPatching();
    const tokens = { answer: `#${stage.data.answer_id}`, versus: `#${stage.data.versus_id}` };
    const head = await post("/api/patch", { ...body, ...tokens, by: "head" });
    if (!head.ok) return failed(head.data.error);
    S.patching.head = head.data;
    renderPatching();
    document.body.dataset.patch = JSON.stringify({ ...body, ...tokens });
    document.body.dataset.patchState = "ready";
  } finally { $("patch-go").disabled = !!S.model.attribution.refused; }
}

const effectKey = (block, stage, position, head) => `${block}|${stage}|${position}|${head}`;

function renderPatching() {
  const box = $("patching"), p = S.patching;
  const clean = "prompt" in S.clean ? JSON.stringify(S.clean.prompt) : `ids ${S.clean.ids.join(",")}`;
  $("patch-clean").textContent = `clean: ${clean}, the prompt traced from the box above; the same number of tokens in the corrupt one`;
  if (!p) { box.replaceChildren(); return; }
  const st = p.stage, effects = new Map();
  for (const answer of [st, p.head]) if (answer) for (const e of answer.effects) effects.set(effectKey(e.block, e.stage, e.position, e.head), e.effect);
  const limit = Math.max(1, Draw.limitOf([effects.values()])); // the palette's ends: +-1 (the clean run) unless an effect overshoots
  const facts = document.createElement("div");
  facts.className = "facts";
  const prompt = (side) => esc(side.text !== null ? JSON.stringify(side.text) : `ids ${side.ids.join(",")}`);
  facts.innerHTML = `metric: logit of <b>${esc(show(st.answer))}</b> (#${st.answer_id}) \u2212 logit of <b>${esc(show(st.versus))}</b> (#${st.versus_id}) ` +
    `at the last position: clean ${prompt(st.clean)} ${Draw.short(st.clean.logit_difference)}, ` +
    `corrupt ${prompt(st.corrupt)} ${Draw.short(st.corrupt.logit_difference)}. ` +
    `Each cell: (patched \u2212 corrupt) / (clean \u2212 corrupt), 0 the corrupt run's, 1 the clean run's. Click a cell to trace the corrupt prompt there with that patch applied.`;
  const stages = [...new Set(st.effects.map((e) => e.stage))];
  const B = S.model.n_layer, T = st.corrupt.ids.length, labels = st.corrupt.tokens.map(show);
  const avail = Math.max(160, box.clientWidth);
  const pad = 7 * String(B - 1).length + 6;
  const perLine = Math.max(1, Math.min(stages.length, Math.floor(avail / (T * 10 + pad + 16))));
  const cell = Math.max(3, Math.min(28, Math.floor((avail / perLine - pad - 16) / T)));
  const rowLabels = [...Array(B)].map((_, b) => String(b));
  const maps = document.createElement("div");
  maps.className = "heads";
  for (const stage of stages) {
    const value = (b, q) => effects.get(effectKey(b, stage, q, null));
    const marked = S.patched && S.patched.stage === stage ? [S.patched.block, S.patched.position] : null;
    const canvas = Draw.grid(B, T, value, cell, limit, { rowLabels, colLabels: labels, marked });
    canvas.dataset.stage = stage;
    canvas.classList.add("patch-map");
    patchCells(canvas, (b, q) => ({ block: b, stage, position: q, head: null }), value,
      (b, q) => `block ${b} ${stage} at position ${q} ${labels[q]}`);
    const fig = document.createElement("div");
    fig.className = "heat";
    fig.append(Draw.span(stage, "title"), canvas);
    maps.appendChild(fig);
  }
  const parts = [facts, Draw.span(`by stage: blocks down, positions across (${T} tokens of the corrupt prompt)`, "facts"), maps];
  if (p.head) parts.push(headMap(effects, limit, rowLabels, labels));
  parts.push(Draw.legend("value", limit, "effect"), patchNumbers(st, p.head));
  if (S.patched) parts.push(Draw.span(patchedNote(effects), "facts"));
  box.replaceChildren(...parts);
}

// Each head's mixed values patched: at every position at once, or at the position chosen.
function headMap(effects, limit, rowLabels, labels) {
  const B = S.model.n_layer, H = S.model.n_head, at = S.patchPosition === "all" ? null : Number(S.patchPosition);
  const wrap = document.createElement("div");
  wrap.id = "patch-heads";
  const choose = document.createElement("select");
  choose.id = "patch-position";
  choose.setAttribute("aria-label", "the position whose head patches the map shows");
  choose.innerHTML = `<option value="all">every position at once</option>` +
    labels.map((t, q) => `<option value="${q}">position ${q} ${esc(t)}</option>`).join("");
  choose.value = S.patchPosition;
  choose.addEventListener("change", () => { S.patchPosition = choose.value; keepingFocus(renderPatching); });
  const title = document.createElement("label");
  title.className = "facts";
  title.append(Draw.span("by head: blocks down, heads across; each head's output patched at "), choose);
  const value = (b, h) => effects.get(effectKey(b, "heads", at, h));
  const avail = Math.max(160, $("patching").clientWidth);
  const cell = Math.max(6, Math.min(28, Math.floor((avail - 40) / H)));
  const marked = S.patched && S.patched.stage === "heads" && S.patched.position === at ? [S.patched.block, S.patched.head] : null;
  const canvas = Draw.grid(B, H, value, cell, limit, { rowLabels, colLabels: [...Array(H)].map((_, h) => String(h)), marked });
  canvas.dataset.position = S.patchPosition;
  canvas.id = "patch-head-map";
  patchCells(canvas, (b, h) => ({ block: b, stage: "heads", position: at, head: h }), value,
    (b, h) => `block ${b} ${headName(h)} at ${at === null ? "every position" : `position ${at} ${labels[at]}`}`);
  wrap.append(title, canvas);
  return wrap;
}

function patchCells(canvas, item, value, where) {
  hover(canvas, (x, y) => {
    const at = canvas.cells.at(x, y);
    return at ? `${where(...at)}\neffect ${value(...at)}` : null;
  });
  canvas.addEventListener("click", (e) => {
    const r = canvas.getBoundingClientRect(), at = canvas.cells.at(e.clientX - r.left, e.clientY - r.top);
    if (at) showPatched(item(...at));
  });
}

function patchNumbers(st, head) {
  return exactNumbers(() => [...st.effects, ...(head ? head.effects : [])].map((e) => {
    const where = e.stage === "heads" ? `head ${e.head} at ${e.position === null ? "all" : e.position}` : `${e.stage} at ${e.position}`;
    return `block ${e.block} ${where}: ${e.effect}`;
  }));
}

// "exact numbers": a closed list whose lines (`lines()`, full precision) are written the first time
// it is opened, so a view with thousands of values does not build them until asked.
function exactNumbers(lines) {
  const numbers = document.createElement("details");
  numbers.innerHTML = `<summary>exact numbers</summary>`;
  numbers.addEventListener("toggle", () => {
    if (!numbers.open || numbers.querySelector(".numbers")) return;
    const grid = document.createElement("div");
    grid.className = "numbers";
    lines().forEach((line) => grid.appendChild(Draw.span(line)));
    numbers.appendChild(grid);
  });
  return numbers;
}

// A cell clicked: the corrupt prompt traced at the patch's position with the patch applied (Run.trace's
// `patch`: before, the corrupt run; after, the patched one), its block and stage shown and outlined.
// The patch stays on while the corrupt prompt is traced, at any position, until another is traced.
function showPatched(item) {
  const { corrupt, clean } = S.patching.stage;
  S.source = corrupt.text !== null ? { prompt: corrupt.text } : { ids: corrupt.ids };
  $("prompt").value = corrupt.text !== null ? corrupt.text : corrupt.tokens.join("");
  S.position = item.position;
  S.appendedFrom = null;
  S.block = item.block;
  S.head = item.head === null ? null : { block: item.block, head: item.head };
  S.view = { kind: "block", stage: item.stage === "heads" ? "attention" : item.stage };
  S.patched = { ...item, ids: corrupt.ids, clean: clean.text !== null ? clean.text : clean.ids };
  document.body.dataset.patched = JSON.stringify(item);
  trace();
  $("model-card").scrollIntoView({ block: "nearest" });
}

function patchedNote(effects) {
  const pt = S.patched, st = S.patching.stage;
  const where = pt.stage === "heads" ? `head ${pt.head}'s output` : pt.stage;
  const at = pt.position === null ? "every position" : `position ${pt.position}`;
  const clean = st.clean.text !== null ? JSON.stringify(st.clean.text) : `ids ${st.clean.ids.join(",")}`;
  return `traced: the corrupt prompt at position ${shown().position}, with block ${pt.block}'s ${where} at ${at} put back from ` +
    `the clean prompt ${clean}'s own pass (outlined): after, the patched run; before, the corrupt run's own. At the last position this patch ` +
    `restores ${effects.get(effectKey(pt.block, pt.stage, pt.position, pt.head))} of the clean logit difference (its effect).`;
}

// Whether the shown trace is the patch's corrupt prompt at its position, and block b's stage
// `name` (undefined: any of its stages) is where the patch puts the clean value.
function patchedHere(b, name) {
  const pt = S.patched, tr = shown();
  if (!pt || pt.block !== b || differs(pt.ids, tr.ids) || (pt.position !== null && pt.position !== tr.position)) return false;
  return name === undefined || name === (pt.stage === "heads" ? "attention" : pt.stage);
}

// The lesson's controls for the selected block, and those for every block.
function renderControls() {
  const b = S.block, e = S.edits, m = S.model;
  const box = $("controls");
  // Built again only for another block (or after a reset): a slider being moved keeps its place.
  if (S.controlsFor === b && S.controlsEdits === e) {
    for (let h = 0; h < m.n_head; h++) $(`ablate-${h}`).setAttribute("aria-pressed", e.ablate.has(`${b}.${h}`) ? "true" : "false");
    $("active").textContent = interventionsSet();
    return;
  }
  S.controlsFor = b;
  S.controlsEdits = e;
  const scale = (stage, label) => {
    const value = (e.scale[b] || {})[stage] ?? 1;
    const wrap = document.createElement("label");
    wrap.className = "slider";
    wrap.innerHTML = `<span>${label}</span><input type="range" id="scale-${stage}" min="0" max="2" step="0.05" value="${value}">` +
      `<output id="scale-${stage}-value">${value.toFixed(2)}</output>`;
    const input = wrap.querySelector("input");
    input.addEventListener("input", () => {
      e.scale[b] = { ...(e.scale[b] || {}), [stage]: Number(input.value) };
      wrap.querySelector("output").textContent = Number(input.value).toFixed(2);
      trace();
    });
    return wrap;
  };
  const heads = document.createElement("div");
  heads.className = "heads-toggle";
  heads.appendChild(Draw.span("ablate head"));
  for (let h = 0; h < m.n_head; h++) {
    const t = stripButton(String(h), `zero head ${h}'s contribution in block ${b}`, e.ablate.has(`${b}.${h}`), () => {
      e.ablate.has(`${b}.${h}`) ? e.ablate.delete(`${b}.${h}`) : e.ablate.add(`${b}.${h}`);
      trace();
    });
    t.id = `ablate-${h}`;
    heads.appendChild(t);
  }
  const replace = document.createElement("label");
  if (m.depth) { // Attention Residuals adds to no stream: nothing to replace, said in the library's words
    replace.className = "facts";
    replace.textContent = m.refused_replacing;
  } else {
    replace.innerHTML = `<input type="checkbox" id="replace" ${e.replace.has(b) ? "checked" : ""}> replace instead of add (broken)`;
    replace.querySelector("input").addEventListener("change", (ev) => { ev.target.checked ? e.replace.add(b) : e.replace.delete(b); trace(); });
  }
  const title = Draw.span(`block ${b}`, "facts");
  const all = document.createElement("div");
  all.className = "row2";
  all.innerHTML = `<label><input type="checkbox" id="at-position" ${e.atPosition ? "checked" : ""}> only at the traced position</label>` +
    `<button type="button" id="reset">reset all</button>`;
  all.querySelector("#at-position").addEventListener("change", (ev) => { e.atPosition = ev.target.checked; trace(); });
  all.querySelector("#reset").addEventListener("click", () => {
    S.edits = { scale: {}, replace: new Set(), ablate: new Set(), atPosition: false, setInput: "" };
    S.patched = null; // a patch is an intervention too
    trace();
  });
  const vector = document.createElement("label");
  const narrow = m.n_embd <= 16;
  vector.innerHTML = `input vector at the traced position (block 0) <input id="set-input" value="${esc(e.setInput)}" ` +
    (narrow ? `placeholder="e.g. ${Array(m.n_embd).fill(2).join(",")}"` : `disabled placeholder="for models of width 16 or less"`) + ">";
  vector.querySelector("input").addEventListener("change", (ev) => { e.setInput = ev.target.value; trace(); });
  const active = document.createElement("div");
  active.id = "active";
  active.textContent = interventionsSet();
  box.replaceChildren(title, ...S.model.scalable.map((stage) => scale(stage, `${stage === "ffn" ? "FFN" : stage} scale`)), replace, heads, all, vector, active);
}

// ---------------------------------------------------------------- start

function bindSampling() {
  const s = S.sampling;
  const bind = (id, key, format) => {
    const input = $(id), out = $(`${id}-value`);
    input.value = s[key];
    out.textContent = format(s[key]);
    input.addEventListener("input", () => {
      s[key] = Number(input.value);
      out.textContent = format(s[key]);
      nextTokens();
    });
  };
  $("top-k").max = Math.min(100, S.model.writable);
  bind("temperature", "temperature", (v) => v.toFixed(2));
  bind("top-k", "top_k", (v) => (v ? String(v) : "off"));
  bind("top-p", "top_p", (v) => (v < 1 ? v.toFixed(2) : "off"));
  $(s.greedy ? "greedy" : "sampled").checked = true;
  $("seed").value = s.seed;
  for (const id of ["greedy", "sampled"]) $(id).addEventListener("change", () => (s.greedy = $("greedy").checked));
  $("seed").addEventListener("change", () => { const v = parseInt($("seed").value, 10); if (v >= 0) s.seed = v; });
  $("step").addEventListener("click", step);
}

async function start() {
  S.model = await (await fetch("/api/model")).json();
  const m = S.model;
  S.sampling = { ...m.sample };
  const timing = document.createElement("span");
  timing.id = "timing";
  $("about").title = m.run;
  $("about").textContent = `${m.run.split("/").pop()}: ${m.n_layer} block${m.n_layer > 1 ? "s" : ""}, ${m.n_head} heads${kvGroup() > 1 ? ` (${m.n_kv_head} kv)` : ""}, width ${m.n_embd}, ` +
    `${m.ffn_hidden ? `FFN ${m.ffn_hidden}` : "no FFN"}, ${m.norm} ${m.norm_position}-norm, ${m.activation}, context ${m.context}, ` +
    `${m.positions === "none" ? "no position table, " : m.positions === "learned" ? "" : `${m.positions} positions, `}` +
    `${m.window === null ? "read past its context on purpose, " : m.window !== m.context ? `reads ${m.window} tokens (rope scaling), ` : ""}` +
    `${m.residual === false ? "no residual, " : ""}` +
    `${m.depth ? `Attention Residuals${m.depth.per_group > 1 ? ` in ${m.depth.groups} groups` : ""}, ` : ""}${m.vocab_size} tokens · ` +
    (m.trained_on ? `trained on ${m.trained_on} · ` : "");
  $("about").appendChild(timing);
  $("prompt").value = m.prompt;
  S.source = S.clean = { prompt: m.prompt };
  bindSampling();
  bindPatching();
  $("grad-on").addEventListener("change", (e) => { S.grad = e.target.checked; trace(); });
  if (m.compare_run) { // started with --compare-run: that run's pass before, this run's after, until unticked
    S.compareRun = $("compare-run").checked = true;
    $("compare-run-name").textContent = m.compare_run;
    $("compare-run-box").hidden = false;
    $("compare-run").addEventListener("change", (e) => { S.compareRun = e.target.checked; trace(); });
  }
  $("form").addEventListener("submit", (e) => {
    e.preventDefault();
    S.source = S.clean = { prompt: $("prompt").value };
    S.position = null;
    S.appendedFrom = null;
    S.patched = null;
    trace();
  });
  $("tokens").addEventListener("keydown", moveAmongTokens);
  let resizing = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(() => S.data && render(), 150);
  });
  trace();
}

start();
