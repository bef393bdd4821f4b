//! `timeline.html`: one self-contained page (no network) in the spirit of
//! PyTorch's memory_viz. The event log is embedded as JSON; the page draws
//! the active-memory timeline stacked by category (wheel to zoom, drag to
//! pan, double-click to reset, hover for the event's tensor, op, size and
//! category) and a segment view that rebuilds every segment's blocks and
//! free gaps at any chosen event. When it has drawn, it sets
//! `document.body.dataset.status = "ok"` (or `"error: …"`), which the
//! headless-browser test reads.

use super::svg::COLORS;
use crate::memory::{EventKind, MemEvent, CATEGORIES};
use serde_json::json;
use std::collections::HashMap;

fn kind_code(k: EventKind) -> u8 {
    match k {
        EventKind::Alloc => 0,
        EventKind::Free => 1,
        EventKind::SegmentAlloc => 2,
        EventKind::SegmentFree => 3,
        EventKind::Oom => 4,
        EventKind::Retag => 5,
        EventKind::Phase => 6,
        EventKind::SegmentMap => 7,
        EventKind::SegmentUnmap => 8,
    }
}

pub fn render(events: &[MemEvent], title: &str) -> String {
    let mut strings: Vec<String> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut intern = |s: &str| -> usize {
        *index.entry(s.to_string()).or_insert_with(|| {
            strings.push(s.to_string());
            strings.len() - 1
        })
    };
    let rows: Vec<serde_json::Value> = events
        .iter()
        .map(|e| {
            json!([
                kind_code(e.kind),
                e.size,
                e.requested,
                e.address,
                e.segment,
                e.category.index(),
                intern(&e.op),
                intern(&e.label),
                e.allocated,
                e.reserved,
                (e.t_us * 10.0).round() / 10.0
            ])
        })
        .collect();
    let data = json!({
        "title": title,
        "categories": CATEGORIES.iter().map(|c| c.name()).collect::<Vec<_>>(),
        "colors": COLORS,
        "strings": strings,
        "events": rows,
    });
    page(title, &data, BODY)
}

/// A self-contained page: the head the timeline pages share (title, styles,
/// category legend), then `body`, whose script element holds `__DATA__`.
pub fn page(title: &str, data: &serde_json::Value, body: &str) -> String {
    // `</` cannot appear inside the script element.
    let data = data.to_string().replace("</", "<\\/");
    format!("{HEAD}{body}")
        .replace("__TITLE__", &super::svg::escape(title))
        .replace("__DATA__", &data)
}

const HEAD: &str = r##"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font-family:sans-serif;margin:16px;color:#222}
canvas{border:1px solid #ccc;display:block}
#tip{position:fixed;pointer-events:none;background:#fffbe6;border:1px solid #bbb;padding:4px 6px;font-size:12px;display:none;white-space:pre}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}
#controls{margin:8px 0}
</style></head>
<body data-status="loading">
<h2>__TITLE__</h2>
<div class="legend" id="legend"></div>
"##;

const BODY: &str = r##"<p style="font-size:12px">Active memory over allocation events, stacked by category; black: allocated, red dashed: reserved; grey lines: phases.
Wheel: zoom. Drag: pan. Double-click: reset. Click: show the segments at that event.</p>
<canvas id="timeline" width="1200" height="380"></canvas>
<div id="controls">Segments at event <input id="at" type="range" min="0" value="0" style="width:600px">
<span id="atlabel"></span> <button id="peak">peak</button></div>
<canvas id="segments" width="1200" height="300"></canvas>
<div id="tip"></div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
window.onerror = function (msg) { document.body.dataset.status = "error: " + msg; };
const D = JSON.parse(document.getElementById("data").textContent);
const E = D.events, S = D.strings, C = D.categories, COL = D.colors;
const KIND = ["alloc", "free", "segment alloc", "segment free", "OOM", "retag", "phase", "pages mapped", "pages unmapped"];
const MiB = b => (b / 1048576).toFixed(2) + " MiB";
// Per-category totals after each event.
const cats = new Array(E.length);
{
  const live = new Map(); const t = new Array(C.length).fill(0);
  for (let i = 0; i < E.length; i++) {
    const e = E[i];
    if (e[0] === 0) { t[e[5]] += e[1]; live.set(e[3], [e[1], e[5]]); }
    else if (e[0] === 1) { const b = live.get(e[3]); if (b) { t[b[1]] -= b[0]; live.delete(e[3]); } }
    else if (e[0] === 5) { const b = live.get(e[3]); if (b) { t[b[1]] -= b[0]; b[1] = e[5]; t[e[5]] += b[0]; } }
    cats[i] = t.slice();
  }
}
let peak = 0; E.forEach((e, i) => { if (e[8] > E[peak][8]) peak = i; });
const maxRes = Math.max(1, ...E.map(e => e[9]));
document.getElementById("legend").innerHTML = C.map((c, k) => `<span><i style="background:${COL[k]}"></i>${c}</span>`).join("");
const tl = document.getElementById("timeline"), g = tl.getContext("2d");
const L = 70, W = tl.width - L - 10, H = tl.height - 30;
let lo = 0, hi = Math.max(1, E.length - 1);
const xOf = i => L + (i - lo) / Math.max(1, hi - lo) * W;
const iOf = x => Math.round(lo + (x - L) / W * (hi - lo));
const yOf = b => 10 + H - H * b / maxRes;
function drawTimeline() {
  g.clearRect(0, 0, tl.width, tl.height);
  g.font = "11px sans-serif"; g.fillStyle = "#333";
  for (let k = 0; k <= 4; k++) {
    const b = maxRes * k / 4, y = yOf(b);
    g.strokeStyle = "#eee"; g.beginPath(); g.moveTo(L, y); g.lineTo(L + W, y); g.stroke();
    g.fillText(MiB(b), 2, y + 4);
  }
  // One sample per pixel column: the event with most allocated in it.
  const cols = [];
  for (let px = 0; px <= W; px++) {
    const a = Math.max(0, iOf(L + px)), b = Math.min(E.length - 1, Math.max(a, iOf(L + px + 1) - 1));
    let best = a; for (let i = a; i <= b; i++) if (E[i][8] > E[best][8]) best = i;
    cols.push(best);
  }
  for (let k = C.length - 1; k >= 0; k--) {
    g.fillStyle = COL[k]; g.beginPath(); g.moveTo(L, yOf(0));
    cols.forEach((i, px) => { let s = 0; for (let j = 0; j <= k; j++) s += cats[i][j]; g.lineTo(L + px, yOf(s)); });
    g.lineTo(L + cols.length - 1, yOf(0)); g.closePath(); g.fill();
  }
  for (const [col, field, dash] of [["#000", 8, []], ["#d62728", 9, [6, 3]]]) {
    g.strokeStyle = col; g.setLineDash(dash); g.lineWidth = 1.5; g.beginPath();
    cols.forEach((i, px) => px ? g.lineTo(L + px, yOf(E[i][field])) : g.moveTo(L, yOf(E[i][field])));
    g.stroke(); g.setLineDash([]); g.lineWidth = 1;
  }
  E.forEach((e, i) => {
    if (e[0] === 6 && i >= lo && i <= hi) {
      const x = xOf(i); g.strokeStyle = "#777"; g.setLineDash([2, 3]);
      g.beginPath(); g.moveTo(x, 10); g.lineTo(x, 10 + H); g.stroke(); g.setLineDash([]);
      g.fillStyle = "#333"; g.fillText(S[e[6]], x + 3, 22);
    }
  });
  g.fillStyle = "#333"; g.fillText(`events ${lo}–${hi} of ${E.length}; peak allocated ${MiB(E[peak][8])} at event ${peak}`, L, tl.height - 6);
}
const tip = document.getElementById("tip");
function describe(i) {
  const e = E[i];
  return `event ${i}: ${KIND[e[0]]}${e[7] !== undefined && S[e[7]] ? " " + S[e[7]] : ""}\n` +
    (e[0] === 6 ? `phase ${S[e[6]]}\n` : `op ${S[e[6]] || "-"}\ncategory ${C[e[5]]}\nsize ${e[1]} B (requested ${e[2]})\n`) +
    `allocated ${MiB(e[8])}, reserved ${MiB(e[9])}\nt = ${(e[10] / 1000).toFixed(3)} ms`;
}
let drag = null;
tl.addEventListener("mousemove", ev => {
  const r = tl.getBoundingClientRect(), x = ev.clientX - r.left;
  if (drag) { const d = Math.round((drag.x - x) / W * (drag.hi - drag.lo)); const span = drag.hi - drag.lo;
    lo = Math.max(0, Math.min(E.length - 1 - span, drag.lo + d)); hi = lo + span; drawTimeline(); return; }
  const i = Math.max(0, Math.min(E.length - 1, iOf(x)));
  if (x < L || !E.length) { tip.style.display = "none"; return; }
  tip.textContent = describe(i); tip.style.display = "block";
  tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 14) + "px";
});
tl.addEventListener("mouseleave", () => { tip.style.display = "none"; drag = null; });
tl.addEventListener("mousedown", ev => { drag = { x: ev.clientX - tl.getBoundingClientRect().left, lo, hi, moved: false }; });
tl.addEventListener("mouseup", ev => {
  const r = tl.getBoundingClientRect(), x = ev.clientX - r.left;
  if (drag && Math.abs(x - drag.x) < 3) showSegments(Math.max(0, Math.min(E.length - 1, iOf(x))));
  drag = null;
});
tl.addEventListener("wheel", ev => {
  ev.preventDefault();
  const r = tl.getBoundingClientRect(), c = iOf(ev.clientX - r.left);
  const f = ev.deltaY < 0 ? 0.8 : 1.25, span = Math.max(10, (hi - lo) * f);
  lo = Math.max(0, Math.round(c - (c - lo) * span / (hi - lo))); hi = Math.min(E.length - 1, Math.round(lo + span));
  drawTimeline();
}, { passive: false });
tl.addEventListener("dblclick", () => { lo = 0; hi = Math.max(1, E.length - 1); drawTimeline(); });
// Segment view: replay the log up to event `at`.
const sc = document.getElementById("segments"), sg = sc.getContext("2d");
const slider = document.getElementById("at"); slider.max = Math.max(0, E.length - 1);
let shown = [];
function liveAt(at) {
  const segs = new Map(), blocks = new Map();
  for (let i = 0; i <= at && i < E.length; i++) {
    const e = E[i];
    if (e[0] === 2) segs.set(e[4], { id: e[4], addr: e[3], size: e[1] });
    else if (e[0] === 3) segs.delete(e[4]);
    else if (e[0] === 0) blocks.set(e[3], e.slice());
    else if (e[0] === 1) blocks.delete(e[3]);
    else if (e[0] === 5) { const b = blocks.get(e[3]); if (b) b[5] = e[5]; }
  }
  const out = [...segs.values()].map(s => ({ ...s, blocks: [] }));
  const by = new Map(out.map(s => [s.id, s]));
  for (const b of blocks.values()) { const s = by.get(b[4]); if (s) s.blocks.push(b); }
  return out;
}
function showSegments(at) {
  slider.value = at;
  const segs = liveAt(at);
  const rowH = 18, need = 20 + segs.length * (rowH + 6);
  sc.height = Math.max(60, Math.min(4000, need));
  sg.clearRect(0, 0, sc.width, sc.height); sg.font = "11px sans-serif";
  const maxSeg = Math.max(1, ...segs.map(s => s.size)), SW = sc.width - 200;
  shown = [];
  segs.forEach((s, k) => {
    const y = 10 + k * (rowH + 6), w = SW * s.size / maxSeg;
    sg.fillStyle = "#e6e6e6"; sg.fillRect(150, y, w, rowH);
    let used = 0;
    for (const b of s.blocks) {
      const x = 150 + SW * (b[3] - s.addr) / maxSeg, bw = Math.max(1, SW * b[1] / maxSeg);
      sg.fillStyle = COL[b[5]]; sg.fillRect(x, y, bw, rowH); used += b[1];
      shown.push({ x, y, w: bw, h: rowH, b });
    }
    sg.fillStyle = "#333";
    sg.fillText(`seg ${s.id} ${MiB(s.size)}`, 4, y + 13);
    sg.fillText(`${MiB(used)} used, ${MiB(s.size - used)} free`, 150 + w + 6, y + 13);
  });
  document.getElementById("atlabel").textContent = `${at}: ${segs.length} segments` + (at === peak ? " (peak)" : "");
}
sc.addEventListener("mousemove", ev => {
  const r = sc.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
  const hit = shown.find(s => x >= s.x && x <= s.x + s.w && y >= s.y && y <= s.y + s.h);
  if (!hit) { tip.style.display = "none"; return; }
  const b = hit.b;
  tip.textContent = `${S[b[7]]}\nop ${S[b[6]] || "-"}\ncategory ${C[b[5]]}\nsize ${b[1]} B (requested ${b[2]})`;
  tip.style.display = "block"; tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 14) + "px";
});
sc.addEventListener("mouseleave", () => { tip.style.display = "none"; });
slider.addEventListener("input", () => showSegments(+slider.value));
document.getElementById("peak").addEventListener("click", () => showSegments(peak));
drawTimeline();
showSegments(peak);
if (document.body.dataset.status === "loading") document.body.dataset.status = "ok";
</script>
</body></html>
"##;
