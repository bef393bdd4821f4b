//! The doctor's page for traces too long to draw event by event: one
//! self-contained HTML file (no network) drawn from a [`Timeline`] — memory
//! over trace operations stacked by category, each pixel column the highest
//! bucket in it (the lowest drawn as a grey line, so aggregation shows),
//! wheel to zoom down to single buckets, drag to pan, hover for a bucket's
//! figures and the largest allocation made in it with the code that made it;
//! below, the segments and their largest live blocks at the captured moment
//! nearest a click (the peak and the first refusal among them). When it has
//! drawn, `document.body.dataset.status` is "ok" (or "error: …"), which the
//! headless-browser test reads.

use crate::lab::memory::tag::{CATEGORIES, N_CATEGORIES};
use crate::lab::timeline::Timeline;
use crate::profile::svg::COLORS;
use serde_json::json;

pub fn render(t: &Timeline, title: &str) -> String {
    let mut names: Vec<&str> = CATEGORIES.iter().map(|c| c.name()).collect();
    names.push("before the recording");
    let mut colors: Vec<&str> = COLORS.to_vec();
    colors.push("#bdbdbd");
    // Only categories that hold bytes somewhere are sent.
    let used: Vec<usize> = (0..=N_CATEGORIES)
        .filter(|&k| t.buckets.iter().any(|b| b.by_category[k] > 0))
        .collect();
    let col = |f: &dyn Fn(&crate::lab::timeline::Bucket) -> u64| -> Vec<u64> {
        t.buckets.iter().map(f).collect()
    };
    let moments: Vec<serde_json::Value> = t
        .moments
        .iter()
        .map(|m| {
            json!({
                "op": m.op,
                "segs": m.segments.iter().map(|s| json!([
                    s.address, s.size, s.other_allocated,
                    s.blocks.iter().map(|b| json!([b.offset, b.size, b.category.index(), b.origin])).collect::<Vec<_>>()
                ])).collect::<Vec<_>>()
            })
        })
        .collect();
    let data = json!({
        "title": title,
        "names": names,
        "colors": colors,
        "ops": t.ops,
        "per": t.per_bucket,
        "peak": t.peak_op,
        "first": t.buckets.iter().map(|b| b.first_op).collect::<Vec<_>>(),
        "amax": col(&|b| b.allocated_max),
        "amin": col(&|b| b.allocated_min.min(b.allocated_max)),
        "rmax": col(&|b| b.reserved_max),
        "used": used,
        "cat": used.iter().map(|&k| col(&|b| b.by_category[k])).collect::<Vec<_>>(),
        "big": col(&|b| b.largest.0),
        "bigAt": t.buckets.iter().map(|b| b.largest.1).collect::<Vec<_>>(),
        "origins": t.origins,
        "moments": moments,
    });
    crate::profile::html::page(title, &data, BODY)
}

const BODY: &str = r##"<p style="font-size:12px" id="how"></p>
<canvas id="timeline" width="1200" height="380"></canvas>
<div id="controls">Segments at <input id="at" type="range" min="0" value="0" style="width:600px">
<span id="atlabel"></span> <button id="peak">peak</button></div>
<canvas id="segments" width="1200" height="300"></canvas>
<div id="tip"></div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
window.onerror = function (msg) { document.body.dataset.status = "error: " + msg; };
const D = JSON.parse(document.getElementById("data").textContent);
const N = D.first.length, MiB = b => (b / 1048576).toFixed(2) + " MiB";
document.getElementById("how").textContent =
  `${D.ops} trace operations in ${N} buckets of ${D.per}. Each pixel column draws its highest bucket, stacked by category; ` +
  `black: allocated (grey: the lowest in the column), red dashed: reserved. Wheel: zoom. Drag: pan. Double-click: reset. ` +
  `Click: the segments at the nearest of ${D.moments.length} captured moments.`;
document.getElementById("legend").innerHTML = D.used.map((k, j) => `<span><i style="background:${D.colors[k]}"></i>${D.names[k]}</span>`).join("");
const maxOf = a => a.reduce((m, x) => x > m ? x : m, 0);
const maxRes = Math.max(1, maxOf(D.rmax), maxOf(D.amax));
const tl = document.getElementById("timeline"), g = tl.getContext("2d");
const L = 70, W = tl.width - L - 10, H = tl.height - 30;
let lo = 0, hi = Math.max(1, N - 1);
const xOf = i => L + (i - lo) / Math.max(1, hi - lo) * W;
const iOf = x => Math.round(lo + (x - L) / W * (hi - lo));
const yOf = b => 10 + H - H * b / maxRes;
const opEnd = i => (i + 1 < N ? D.first[i + 1] : D.ops) - 1;
function columns() {
  const cols = [];
  for (let px = 0; px <= W; px++) {
    const a = Math.max(0, Math.min(N - 1, iOf(L + px))), b = Math.min(N - 1, Math.max(a, iOf(L + px + 1) - 1));
    let best = a, low = D.amin[a];
    for (let i = a; i <= b; i++) { if (D.amax[i] > D.amax[best]) best = i; if (D.amin[i] < low) low = D.amin[i]; }
    cols.push([best, low]);
  }
  return cols;
}
function drawTimeline() {
  g.clearRect(0, 0, tl.width, tl.height);
  g.font = "11px sans-serif"; g.fillStyle = "#333";
  for (let k = 0; k <= 4; k++) {
    const b = maxRes * k / 4, y = yOf(b);
    g.strokeStyle = "#eee"; g.beginPath(); g.moveTo(L, y); g.lineTo(L + W, y); g.stroke();
    g.fillText(MiB(b), 2, y + 4);
  }
  const cols = columns();
  for (let j = D.used.length - 1; j >= 0; j--) {
    g.fillStyle = D.colors[D.used[j]]; g.beginPath(); g.moveTo(L, yOf(0));
    cols.forEach(([i], px) => { let s = 0; for (let q = 0; q <= j; q++) s += D.cat[q][i]; g.lineTo(L + px, yOf(s)); });
    g.lineTo(L + cols.length - 1, yOf(0)); g.closePath(); g.fill();
  }
  const line = (color, dash, f) => {
    g.strokeStyle = color; g.setLineDash(dash); g.lineWidth = 1.5; g.beginPath();
    cols.forEach((c, px) => px ? g.lineTo(L + px, yOf(f(c))) : g.moveTo(L, yOf(f(c))));
    g.stroke(); g.setLineDash([]); g.lineWidth = 1;
  };
  line("#999", [], c => c[1]);
  line("#000", [], c => D.amax[c[0]]);
  line("#d62728", [6, 3], c => D.rmax[c[0]]);
  const px = xOf(Math.floor(D.peak / D.per));
  if (px >= L && px <= L + W) { g.strokeStyle = "#000"; g.setLineDash([2, 3]); g.beginPath(); g.moveTo(px, 10); g.lineTo(px, 10 + H); g.stroke(); g.setLineDash([]); }
  g.fillStyle = "#333";
  g.fillText(`operations ${D.first[lo]}–${opEnd(hi)} of ${D.ops}; peak allocated ${MiB(maxOf(D.amax))} after operation ${D.peak}`, L, tl.height - 6);
}
const tip = document.getElementById("tip");
function describe(i) {
  let s = `operations ${D.first[i]}–${opEnd(i)}\nallocated ${MiB(D.amin[i])} to ${MiB(D.amax[i])}, reserved up to ${MiB(D.rmax[i])}\n`;
  D.used.forEach((k, j) => { if (D.cat[j][i]) s += `  ${D.names[k]}: ${MiB(D.cat[j][i])}\n`; });
  if (D.big[i]) s += `largest allocation made here: ${MiB(D.big[i])}${D.origins[D.bigAt[i]] ? " by " + D.origins[D.bigAt[i]] : ""}`;
  return s;
}
let drag = null;
tl.addEventListener("mousemove", ev => {
  const r = tl.getBoundingClientRect(), x = ev.clientX - r.left;
  if (drag) { const d = Math.round((drag.x - x) / W * (drag.hi - drag.lo)); const span = drag.hi - drag.lo;
    lo = Math.max(0, Math.min(N - 1 - span, drag.lo + d)); hi = lo + span; drawTimeline(); return; }
  if (x < L || !N) { tip.style.display = "none"; return; }
  const a = Math.max(0, Math.min(N - 1, iOf(x))), b = Math.min(N - 1, Math.max(a, iOf(x + 1) - 1));
  let best = a; for (let i = a; i <= b; i++) if (D.amax[i] > D.amax[best]) best = i;
  tip.textContent = describe(best); tip.style.display = "block";
  tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 14) + "px";
});
tl.addEventListener("mouseleave", () => { tip.style.display = "none"; drag = null; });
tl.addEventListener("mousedown", ev => { drag = { x: ev.clientX - tl.getBoundingClientRect().left, lo, hi }; });
tl.addEventListener("mouseup", ev => {
  const r = tl.getBoundingClientRect(), x = ev.clientX - r.left;
  if (drag && Math.abs(x - drag.x) < 3) showNear(D.first[Math.max(0, Math.min(N - 1, iOf(x)))]);
  drag = null;
});
tl.addEventListener("wheel", ev => {
  ev.preventDefault();
  const r = tl.getBoundingClientRect(), c = iOf(ev.clientX - r.left);
  const f = ev.deltaY < 0 ? 0.8 : 1.25, span = Math.max(10, (hi - lo) * f);
  lo = Math.max(0, Math.round(c - (c - lo) * span / (hi - lo))); hi = Math.min(N - 1, Math.round(lo + span));
  drawTimeline();
}, { passive: false });
tl.addEventListener("dblclick", () => { lo = 0; hi = Math.max(1, N - 1); drawTimeline(); });
const sc = document.getElementById("segments"), sg = sc.getContext("2d");
const slider = document.getElementById("at"); slider.max = Math.max(0, D.moments.length - 1);
let shown = [];
function showNear(op) {
  let best = 0;
  D.moments.forEach((m, k) => { if (Math.abs(m.op - op) < Math.abs(D.moments[best].op - op)) best = k; });
  showMoment(best);
}
function showMoment(k) {
  slider.value = k;
  const m = D.moments[k];
  if (!m) return;
  const segs = m.segs.slice().sort((a, b) => a[0] - b[0]);
  const rowH = 14, need = 20 + segs.length * (rowH + 4);
  sc.height = Math.max(60, Math.min(8000, need));
  sg.clearRect(0, 0, sc.width, sc.height); sg.font = "11px sans-serif";
  const maxSeg = Math.max(1, maxOf(segs.map(s => s[1]))), SW = sc.width - 330;
  shown = [];
  segs.forEach((s, r) => {
    const y = 10 + r * (rowH + 4), w = SW * s[1] / maxSeg;
    if (y > sc.height) return;
    sg.fillStyle = "#e6e6e6"; sg.fillRect(150, y, w, rowH);
    let used = s[2];
    for (const b of s[3]) {
      const x = 150 + SW * b[0] / maxSeg, bw = Math.max(1, SW * b[1] / maxSeg);
      sg.fillStyle = D.colors[b[2]]; sg.fillRect(x, y, bw, rowH); used += b[1];
      shown.push({ x, y, w: bw, h: rowH, b });
    }
    sg.fillStyle = "#333";
    sg.fillText(`0x${s[0].toString(16)} ${MiB(s[1])}`, 2, y + 11);
    sg.fillText(`${MiB(used)} used, ${MiB(s[1] - used)} free` + (s[2] ? ` (${MiB(s[2])} in blocks not drawn)` : ""), 150 + w + 6, y + 11);
  });
  document.getElementById("atlabel").textContent = `after operation ${m.op}: ${segs.length} segments` + (m.op === D.peak ? " (peak)" : "");
}
sc.addEventListener("mousemove", ev => {
  const r = sc.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
  const hit = shown.find(s => x >= s.x && x <= s.x + s.w && y >= s.y && y <= s.y + s.h);
  if (!hit) { tip.style.display = "none"; return; }
  const b = hit.b;
  tip.textContent = `${D.origins[b[3]] || "(no frames)"}\ncategory ${D.names[b[2]]}\nsize ${b[1]} B at offset ${b[0]}`;
  tip.style.display = "block"; tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 14) + "px";
});
sc.addEventListener("mouseleave", () => { tip.style.display = "none"; });
slider.addEventListener("input", () => showMoment(+slider.value));
document.getElementById("peak").addEventListener("click", () => showNear(D.peak));
drawTimeline();
if (D.moments.length) showNear(D.peak);
if (document.body.dataset.status === "loading") document.body.dataset.status = "ok";
</script>
</body></html>
"##;
