#!/usr/bin/env bash
# The doctor on a snapshot of 1 GB and more: writes one with a real one's
# shapes (crates/lab/examples/big_snapshot.rs), then times
# `vramlab doctor --out` on it (wall clock and peak RSS, /usr/bin/time), and
# memory_viz's `trace_plot` beside it where PyTorch is installed.
#   scripts/big_snapshot_check.sh [MIB (default 1100)] [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
MIB=${1:-1100}
PY=${2:-python3}
OUT=${TMPDIR:-/tmp}/vramlab-big-snapshot
mkdir -p "$OUT"
cargo build --release -q -p vramlab-lab --example big_snapshot
cargo build --release -q
target/release/examples/big_snapshot "$OUT/big.pickle" --mib "$MIB"
ls -l "$OUT/big.pickle"
/usr/bin/time -f "vramlab doctor --out: %e s wall, %U s user, %M KB peak RSS" \
    target/release/vramlab doctor "$OUT/big.pickle" --no-planner --out "$OUT/page" >"$OUT/report.txt"
head -12 "$OUT/report.txt"
ls -l "$OUT/page"
if "$PY" -c "import torch" 2>/dev/null; then
    /usr/bin/time -f "memory_viz trace_plot: %e s wall, %M KB peak RSS" \
        timeout 900 "$PY" -m torch.cuda._memory_viz trace_plot "$OUT/big.pickle" -o "$OUT/memory_viz.html" ||
        echo "memory_viz trace_plot did not finish (exit $?)"
    ls -l "$OUT/memory_viz.html" 2>/dev/null || true
else
    echo "no PyTorch for $PY: memory_viz not run"
fi
