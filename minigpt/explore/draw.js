// minigpt explore: the pictures. Pure drawing: every value drawn arrives from the server as the
// library computed it; nothing here computes a number that is shown. Canvas for anything with many
// cells (a GPT-2 trace has 12 x 12 attention maps of 64 x 64 and rows of 3,072), SVG for the rest.
"use strict";

const Draw = (() => {
  // A diverging palette, blue - near-white - orange: the two ends stay apart under every common
  // colour-vision deficiency (no red against green). Stops from 0 to 1, interpolated linearly.
  const NEGATIVE = [[247, 247, 247], [198, 219, 239], [107, 164, 210], [33, 102, 172], [8, 48, 107]];
  const POSITIVE = [[247, 247, 247], [253, 212, 158], [241, 140, 60], [191, 80, 10], [110, 40, 5]];
  // A sequential palette for weights in [0, 1]: near-white to deep blue-violet.
  const WEIGHT = [[250, 250, 252], [208, 209, 230], [140, 150, 198], [84, 92, 168], [45, 35, 110]];
  const MASKED = [236, 238, 241];

  function ramp(stops, t) {
    const x = Math.min(1, Math.max(0, t)) * (stops.length - 1);
    const i = Math.min(stops.length - 2, Math.floor(x));
    const f = x - i;
    return stops[i].map((c, j) => Math.round(c + (stops[i + 1][j] - c) * f));
  }
  // Looked up, not interpolated, per cell: a GPT-2 trace draws 600,000 attention cells.
  const LEVELS = 256;
  const table = (stops) => Array.from({ length: LEVELS + 1 }, (_, i) => ramp(stops, i / LEVELS));
  const NEG = table(NEGATIVE), POS = table(POSITIVE), SEQ = table(WEIGHT);
  const level = (t) => Math.round(Math.min(1, Math.max(0, t)) * LEVELS);
  const diverging = (v, limit) => (limit > 0 ? (v < 0 ? NEG : POS)[level(Math.abs(v) / limit)] : NEG[0]);
  const sequential = (w) => SEQ[level(w)];
  const css = (rgb) => `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;

  // The largest magnitude among rows (the colour scale's end): a comparison, not arithmetic.
  function limitOf(rows) {
    let m = 0;
    for (const row of rows) for (const v of row) { const a = Math.abs(v); if (a > m) m = a; }
    return m;
  }

  // A canvas of css size w x h, drawn at the screen's pixel density.
  function canvas(w, h, className) {
    const c = document.createElement("canvas");
    const dpr = window.devicePixelRatio || 1;
    c.width = Math.max(1, Math.round(w * dpr));
    c.height = Math.max(1, Math.round(h * dpr));
    c.style.width = `${w}px`;
    c.style.height = `${h}px`;
    if (className) c.className = className;
    const g = c.getContext("2d");
    g.scale(dpr, dpr);
    return [c, g];
  }

  // An image of `cols` x `rows` cells, one pixel each, drawn by `colour(index)` (or null: the
  // masked colour); scaled up without smoothing, so every cell stays a crisp square.
  function cellImage(cols, rows, colour) {
    const image = new ImageData(cols, rows);
    for (let i = 0; i < cols * rows; i++) {
      const rgb = colour(i) || MASKED;
      image.data[4 * i] = rgb[0]; image.data[4 * i + 1] = rgb[1]; image.data[4 * i + 2] = rgb[2];
      image.data[4 * i + 3] = 255;
    }
    const off = document.createElement("canvas");
    off.width = cols; off.height = rows;
    off.getContext("2d").putImageData(image, 0, 0);
    return off;
  }

  // A whole row as a heat strip `width` pixels wide, wrapped onto several lines when it has more
  // values than fit at `minCell` pixels each. The canvas carries `cells` for hovering and tests:
  // cells.value(i), cells.at(x, y) -> index or -1, cells.center(i) -> [x, y].
  function strip(values, limit, width, { minCell = 3, maxCell = 48, height = 16 } = {}) {
    const n = values.length;
    const perLine = Math.max(1, Math.min(n, Math.floor(width / minCell)));
    const cell = Math.min(maxCell, width / perLine);
    const lines = Math.ceil(n / perLine);
    const lineHeight = lines === 1 ? height : Math.max(4, Math.min(height, Math.round(cell * 2)));
    const w = Math.ceil(cell * perLine), h = lines * lineHeight;
    const [c, g] = canvas(w, h, "strip");
    const image = cellImage(perLine, lines, (i) => (i < n ? diverging(values[i], limit) : [255, 255, 255]));
    g.imageSmoothingEnabled = false;
    g.drawImage(image, 0, 0, perLine * cell, h);
    c.cells = {
      value: (i) => values[i],
      at: (x, y) => {
        const i = Math.floor(y / lineHeight) * perLine + Math.floor(x / cell);
        return x >= 0 && y >= 0 && x < perLine * cell && i < n ? i : -1;
      },
      center: (i) => [((i % perLine) + 0.5) * cell, (Math.floor(i / perLine) + 0.5) * lineHeight],
    };
    return c;
  }

  // A colour legend: the palette from -limit to +limit (or 0 to 1 for weights).
  function legend(kind, limit, text) {
    const box = document.createElement("div");
    box.className = "legend";
    const [c, g] = canvas(140, 10);
    for (let x = 0; x < 140; x++) {
      g.fillStyle = css(kind === "weight" ? sequential(x / 139) : diverging((x / 139) * 2 - 1, 1));
      g.fillRect(x, 0, 1, 10);
    }
    const low = kind === "weight" ? "0" : short(-limit), high = kind === "weight" ? "1" : short(limit);
    const mid = kind === "weight" ? "" : "0 in the middle, ";
    box.append(span(low), c, span(high), span(`${text || ""}${text ? " · " : ""}${mid}colour-blind-safe palette`));
    return box;
  }

  // One head's attention matrix: query rows, key columns; the future (key > query) is masked;
  // the traced query's row is outlined. `weight(q, k)` reads the model's own weight.
  function heatMap(T, weight, cell, { traced = -1, labels = null } = {}) {
    const pad = labels && cell >= 11 ? Math.min(64, 7 * Math.max(...labels.map((t) => Math.min(8, t.length))) + 6) : 0;
    const size = T * cell;
    const [c, g] = canvas(pad + size + 2, size + 2, "map");
    const image = cellImage(T, T, (i) => {
      const q = Math.floor(i / T), k = i % T;
      return k <= q ? sequential(weight(q, k)) : null;
    });
    g.imageSmoothingEnabled = false;
    g.drawImage(image, pad + 1, 1, size, size);
    if (pad) {
      g.font = "11px ui-monospace, monospace";
      g.fillStyle = "#5f6b7a";
      g.textBaseline = "middle";
      labels.forEach((t, q) => g.fillText(t.slice(0, 8), 2, 1 + (q + 0.5) * cell, pad - 4));
    }
    if (traced >= 0) {
      g.strokeStyle = "#111";
      g.lineWidth = 2;
      g.strokeRect(pad + 1, 1 + traced * cell, size, cell);
    }
    c.cells = {
      weight: (q, k) => (k <= q ? weight(q, k) : null),
      at: (x, y) => {
        const q = Math.floor((y - 1) / cell), k = Math.floor((x - pad - 1) / cell);
        return q >= 0 && k >= 0 && q < T && k < T ? [q, k] : null;
      },
      center: (q, k) => [pad + 1 + (k + 0.5) * cell, 1 + (q + 0.5) * cell],
    };
    return c;
  }

  // A grid of signed values, `rows` x `cols`, in the diverging palette (-limit and +limit at its
  // ends); row labels on the left, column labels under the cells when they fit; `marked` [r, c]
  // outlined. The canvas carries `cells` for hovering and tests: cells.value(r, c), cells.at(x, y)
  // -> [r, c] or null, cells.center(r, c) -> [x, y].
  function grid(rows, cols, value, cell, limit, { rowLabels = null, colLabels = null, marked = null } = {}) {
    const pad = rowLabels ? 7 * Math.max(...rowLabels.map((t) => t.length)) + 6 : 0;
    const under = colLabels && cell >= 12 ? 14 : 0;
    const [c, g] = canvas(pad + cols * cell + 2, rows * cell + 2 + under, "grid");
    const image = cellImage(cols, rows, (i) => diverging(value(Math.floor(i / cols), i % cols), limit));
    g.imageSmoothingEnabled = false;
    g.drawImage(image, pad + 1, 1, cols * cell, rows * cell);
    g.font = "11px ui-monospace, monospace";
    g.fillStyle = "#5f6b7a";
    g.textBaseline = "middle";
    if (rowLabels) rowLabels.forEach((t, r) => g.fillText(t, 2, 1 + (r + 0.5) * cell, pad - 4));
    g.textAlign = "center";
    if (under) colLabels.forEach((t, k) => g.fillText(t.slice(0, 3), pad + 1 + (k + 0.5) * cell, rows * cell + 9, cell));
    if (cell >= 8) { // thin gaps between the cells, so neighbours of one colour stay apart
      g.strokeStyle = "#fff";
      g.lineWidth = 1;
      for (let k = 1; k < cols; k++) g.strokeRect(pad + 1 + k * cell, 1, 0, rows * cell);
      for (let r = 1; r < rows; r++) g.strokeRect(pad + 1, 1 + r * cell, cols * cell, 0);
    }
    if (marked) {
      g.strokeStyle = "#111";
      g.lineWidth = 2;
      g.strokeRect(pad + 1 + marked[1] * cell, 1 + marked[0] * cell, cell, cell);
    }
    c.cells = {
      value,
      at: (x, y) => {
        const r = Math.floor((y - 1) / cell), k = Math.floor((x - pad - 1) / cell);
        return r >= 0 && k >= 0 && r < rows && k < cols ? [r, k] : null;
      },
      center: (r, k) => [pad + 1 + (k + 0.5) * cell, 1 + (r + 0.5) * cell],
    };
    return c;
  }

  // Every block's every head at thumbnail size, in one canvas: blocks down, heads across. All the
  // cells are written into one image first (one pixel each), then scaled into place.
  function overview(blocks, heads, T, weight, thumb, gap, selected) {
    const w = heads * (thumb + gap), h = blocks * (thumb + gap);
    const [c, g] = canvas(w + 30, h, "overview");
    const image = cellImage(heads * T, blocks * T, (i) => {
      const row = Math.floor(i / (heads * T)), col = i % (heads * T);
      const q = row % T, k = col % T;
      return k <= q ? sequential(weight(Math.floor(row / T), Math.floor(col / T), q, k)) : null;
    });
    g.imageSmoothingEnabled = false;
    g.font = "11px system-ui, sans-serif";
    g.textBaseline = "middle";
    for (let b = 0; b < blocks; b++) {
      g.fillStyle = b === selected ? "#111" : "#5f6b7a";
      g.fillText(String(b), 2, b * (thumb + gap) + thumb / 2);
      for (let hd = 0; hd < heads; hd++) {
        g.drawImage(image, hd * T, b * T, T, T, 30 + hd * (thumb + gap), b * (thumb + gap), thumb, thumb);
      }
      if (b === selected) {
        g.strokeStyle = "#111";
        g.lineWidth = 1.5;
        g.strokeRect(29, b * (thumb + gap) - 1, heads * (thumb + gap) - gap + 2, thumb + 2);
      }
    }
    c.cells = {
      weight: (b, hd, q, k) => (k <= q ? weight(b, hd, q, k) : null),
      at: (x, y) => {
        const b = Math.floor(y / (thumb + gap)), hd = Math.floor((x - 30) / (thumb + gap));
        if (b < 0 || b >= blocks || hd < 0 || hd >= heads) return null;
        const q = Math.floor(((y % (thumb + gap)) / thumb) * T), k = Math.floor((((x - 30) % (thumb + gap)) / thumb) * T);
        return q < T && k < T ? [b, hd, q, k] : null;
      },
    };
    return c;
  }

  // A line chart in SVG: `series` [{name, points: [{x, y, changed}]}], x labels under the axis.
  function lineChart(series, xLabels, width, height, onPoint) {
    const NS = "http://www.w3.org/2000/svg";
    const left = 44, right = 8, top = 8, bottom = 30;
    const n = xLabels.length;
    const ymax = Math.max(1e-12, ...series.flatMap((s) => s.points.map((p) => p.y)));
    const X = (i) => left + (n === 1 ? 0.5 : i / (n - 1)) * (width - left - right);
    const Y = (v) => top + (1 - v / ymax) * (height - top - bottom);
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("height", height);
    const el = (name, attrs, text) => {
      const e = document.createElementNS(NS, name);
      for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
      if (text !== undefined) e.textContent = text;
      svg.appendChild(e);
      return e;
    };
    for (let t = 0; t <= 4; t++) {
      const v = (ymax * t) / 4;
      el("line", { class: "grid", x1: left, x2: width - right, y1: Y(v), y2: Y(v) });
      el("text", { x: left - 4, y: Y(v) + 4, "text-anchor": "end" }, short(v));
    }
    el("line", { class: "axis", x1: left, x2: width - right, y1: Y(0), y2: Y(0) });
    const every = Math.max(1, Math.ceil(n / Math.max(1, Math.floor((width - left) / 56))));
    xLabels.forEach((label, i) => {
      const anchor = i === 0 ? "start" : i === n - 1 ? "end" : "middle";
      if (label.major || i % every === 0 || i === n - 1) el("text", { x: X(i), y: height - bottom + 14, "text-anchor": anchor }, label.text);
    });
    for (const s of series) {
      el("path", { class: `line ${s.name}`, d: s.points.map((p, i) => `${i ? "L" : "M"}${X(i)},${Y(p.y)}`).join("") });
    }
    for (const s of series) {
      s.points.forEach((p, i) => {
        const dot = el("circle", { class: s.name, cx: X(i), cy: Y(p.y), r: s.name === "after" ? 4 : 3, "data-changed": p.changed ? "true" : "false" });
        dot.addEventListener("click", () => onPoint(i));
        dot.tip = p.tip;
      });
    }
    return svg;
  }

  // Numbers written short for labels; the exact value is always one hover or click away.
  function short(v) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    return a >= 1e4 || a < 1e-3 ? v.toExponential(2) : Number(v.toPrecision(4)).toString();
  }

  function span(text, className) {
    const s = document.createElement("span");
    s.textContent = text;
    if (className) s.className = className;
    return s;
  }

  return { diverging, sequential, css, limitOf, strip, legend, heatMap, grid, overview, lineChart, short, span };
})();
