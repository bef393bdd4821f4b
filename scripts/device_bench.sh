#!/usr/bin/env bash
# The GPU half of the checks and benchmarks, for a lent NVIDIA machine
# reached through the workplace's device tool (no network there). Binaries
# are built on the x86-64 host and carried xz-compressed in .devbin/
# (scripts/device_pack.sh makes them); the Vulkan loader comes as .gl/*.deb.
#   scripts/device_bench.sh [STEPS]   STEPS: comma-separated, default all:
#   tests,coop,prefetch,bench,bench2,ab,burn,torch,layouts,estimate,recorder,ddp,zoo
# BENCH_ENV, TEST_ENVS, COOP_ENVS, PREFETCH_ENVS: settings for the bench step
# and the lists of the tests, coop and prefetch steps, each entry's settings
# joined by "+". AB_RUNS, AB_ITERS: the ab step's runs and rounds.
# Every figure lands under $OUT: log.txt (everything printed) and one JSON
# file per measurement, tarred into figures.tar at the end. Each step has its own time limit, so one slow step
# cannot take the rest with it.
set -uo pipefail
STEPS=${1:-tests,bench,burn,torch,layouts,estimate,recorder,moretests,zoo}
# Steps past DEADLINE seconds are skipped, and each step's limit is cut to
# what is left, so the whole run ends inside the device call's limit.
DEADLINE=${DEADLINE:-420}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export XDG_RUNTIME_DIR=/tmp RUST_BACKTRACE=1
# A fresh machine has no tile cache: a short budget per class keeps tuning
# to seconds.
export VRAMLAB_TUNE_BUDGET_MS=${VRAMLAB_TUNE_BUDGET_MS:-500}
for f in .devbin/*.xz; do xz -dkf "$f"; done
chmod +x .devbin/* 2> /dev/null
# Test binaries find fixtures and the CLI at the paths they were built at.
mkdir -p /work target/debug target/release
[ -e /work/main ] || ln -s "$PWD" /work/main
[ -f .devbin/vramlab-debug ] && cp .devbin/vramlab-debug target/debug/vramlab
cp .devbin/vramlab target/release/vramlab
V=.devbin/vramlab
want() { [[ ",$STEPS," == *",$1,"* ]] && [ $((DEADLINE - SECONDS)) -gt 10 ]; }
# limit N: N seconds, or what is left before the deadline if less.
limit() { local left=$((DEADLINE - SECONDS)); echo $(($1 < left ? $1 : left)); }
step() { echo; echo "== $1 ($(date +%T))"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
$V info --json > "$OUT/info.json"
$V info | head -40

if want tests; then
  step "kernel tests against f64 on this GPU"
  # The optimizers' list kernels against one parameter at a time, bit for
  # bit: a driver may contract a*b+c differently in two shader modules.
  # And kernels compiled on several threads at once (the tuner's rounds),
  # and long sums of partials spread over threads against one thread each.
  # TESTS: the filters (default below); TESTS_LIMIT: their time limit.
  VRAMLAB_EXPECT_TENSOR_CORES=1 timeout $(limit ${TESTS_LIMIT:-90}) .devbin/suite --test-threads 8 \
    ${TESTS:-matmul_coop matmul_family kernels:: pytorch_step::foreach_lists bind_groups:: \
    matmul_tuning::kernels_collected matmul_tuning::a_failed ops_reductions::partials} 2>&1 |
    grep -E "^test |test result|panicked|FAILED|failures" | tail -40
  for env in ${TEST_ENVS:-VRAMLAB_COOP_TILE=4x2,2x4 VRAMLAB_COOP_LOADS=wide VRAMLAB_COOP_LOADS=staged \
    VRAMLAB_COOP_LOADS=wide+VRAMLAB_COOP_TILE=4x2,2x4+VRAMLAB_COOP_STAGE_DEPTH=1 \
    VRAMLAB_COOP_TILE=1x1,1x1+VRAMLAB_COOP_STAGE_DEPTH=3}; do
    echo "-- $env"
    env ${env//+/ } VRAMLAB_EXPECT_TENSOR_CORES=1 timeout $(limit 40) .devbin/suite matmul_coop 2>&1 |
      grep -E "test result|panicked" | head -3
  done
fi

if want coop; then
  step "tensor-core kernel against f64, prefetching on and off, in the layouts timed below"
  # Each entry: settings joined by "+" (a "," is part of a tile's form).
  for env in ${COOP_ENVS:-VRAMLAB_COOP_PREFETCH=1 VRAMLAB_COOP_PREFETCH=0 VRAMLAB_COOP_BUFFERS=2 VRAMLAB_COOP_HALVES=1 \
    VRAMLAB_COOP_BUFFERS=2+VRAMLAB_COOP_TILE=4x2,2x4 VRAMLAB_COOP_BUFFERS=2+VRAMLAB_COOP_TILE=4x2,4x4 \
    VRAMLAB_COOP_BUFFERS=2+VRAMLAB_COOP_STAGE_DEPTH=2}; do
    echo "-- $env"
    env ${env//+/ } VRAMLAB_EXPECT_TENSOR_CORES=1 timeout $(limit 30) .devbin/suite --test-threads 8 matmul_coop 2>&1 |
      grep -E "test result|panicked" | head -3
  done
fi

if want prefetch; then
  step "f16 4096³ on tensor cores: prefetching the next step, by layout"
  # Each entry: settings joined by "+" (a "," is part of a tile's form).
  for env in ${PREFETCH_ENVS:-VRAMLAB_COOP_PREFETCH=0 VRAMLAB_COOP_PREFETCH=1 VRAMLAB_COOP_HALVES=1 \
    VRAMLAB_COOP_HALVES=1+VRAMLAB_COOP_TILE=4x2,2x4 VRAMLAB_COOP_BUFFERS=2 \
    VRAMLAB_COOP_BUFFERS=2+VRAMLAB_COOP_TILE=4x2,2x4 VRAMLAB_COOP_BUFFERS=2+VRAMLAB_COOP_TILE=4x2,4x4 \
    VRAMLAB_COOP_BUFFERS=2+VRAMLAB_COOP_TILE=2x4,4x4 VRAMLAB_COOP_BUFFERS=2+VRAMLAB_COOP_TILE=2x2,4x4 \
    VRAMLAB_COOP_BUFFERS=2+VRAMLAB_COOP_STAGE_DEPTH=2 VRAMLAB_COOP_BUFFERS=2+VRAMLAB_COOP_TILE=4x4,2x2 \
    VRAMLAB_COOP_TILE=4x2,2x4}; do
    env ${env//+/ } timeout $(limit 25) $V bench --sizes ${PREFETCH_N:-4096} --models none --reps 5 --json 2> /dev/null |
      python3 -c "
import json,sys
d=json.load(sys.stdin)
n=int(d['precision'][0]['what'].split()[-1].rstrip('³'))
rows=[(r['mode'], round(2*n**3/r['seconds']/1e12,1)) for r in d['precision'] if r['what'].startswith('matmul')]
print('$env', f'{n}³ TFLOP/s', rows)" || echo "$env failed"
  done
fi

if want bench; then
  step "vramlab bench (tuning on, the first run tunes)"
  env ${BENCH_ENV:+${BENCH_ENV//+/ }} timeout $(limit 150) $V bench --sizes 2048,4096 --models simple-cnn --batch 64 --reps 10 --json \
    > "$OUT/bench.json" 2> /tmp/bench.err
  echo "rc $?"; grep -v "^vramlab: tuning" /tmp/bench.err | tail -5
  python3 - "$OUT/bench.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["square"]:
    print(f"f32 {r['n']}^3: {r['gflops'] / 1e3:.1f} TFLOP/s  tile {r['tile']}")
for r in d["precision"]:
    n = r["what"].split()[-1].rstrip("³") if r["what"].startswith("matmul") else None
    rate = f"{2 * int(n) ** 3 / r['seconds'] / 1e12:.1f} TFLOP/s" if n else f"{r['seconds'] * 1e3:.2f} ms"
    print(f"{r['what']:<16} {r['mode']:<9} {rate}  {r['speedup_vs_f32']:.2f}x f32")
for m in d["models"]:
    print(f"{m['model']} step: timed {m['seconds_median'] * 1e3:.2f} ms, untimed {m['untimed_seconds_median'] * 1e3:.2f} ms, device {m['device_seconds_median'] * 1e3:.2f} ms, host adds {m['host_seconds_median'] * 1e3:.2f} ms")
    for op in (m.get("device_time") or {}).get("ops", [])[:8]:
        print("   ", json.dumps(op)[:160])
PY
  step "the same products with wgpu's bounds checks kept (--bounds-checks)"
  timeout $(limit 60) $V bench --sizes 2048,4096 --models none --reps 10 --bounds-checks 2>&1 |
    grep -E "³|f16|f32 " | head -12
fi

if want burn; then
  step "burn beside vramlab"
  timeout $(limit 100) .devbin/vramlab-peer-burn --sizes 1024,2048,4096 --reps 10 2>&1 | tee /tmp/burn.txt
fi

if want torch; then
  step "PyTorch CUDA"
  timeout $(limit 60) python3 scripts/torch_step_bench.py --reps 50 --json > "$OUT/torch.json" 2> /tmp/torch.err
  echo "rc $?"; tail -5 /tmp/torch.err; head -c 3000 "$OUT/torch.json"; echo
  timeout $(limit 30) python3 - <<'PY'
import torch, time
for dt, n in [(torch.float32, 2048), (torch.float16, 4096)]:
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(n, n, device="cuda", dtype=dt); b = torch.randn(n, n, device="cuda", dtype=dt)
    for _ in range(3): a @ b
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20): a @ b
    torch.cuda.synchronize(); s = (time.perf_counter() - t) / 20
    print(f"cuBLAS {dt} {n}^3: {2 * n**3 / s / 1e12:.1f} TFLOP/s")
PY
fi

if want layouts; then
  step "tensor-core layouts and loads, f16 4096³ (f32 and bf16 beside)"
  for env in "L=direct" "VRAMLAB_COOP_LOADS=wide" "VRAMLAB_COOP_LOADS=wide VRAMLAB_COOP_TILE=4x2,2x4" \
    "VRAMLAB_COOP_LOADS=wide VRAMLAB_COOP_STAGE_DEPTH=1" "VRAMLAB_COOP_LOADS=wide VRAMLAB_COOP_STAGE_DEPTH=4" \
    "VRAMLAB_COOP_LOADS=staged" "VRAMLAB_COOP_TILE=2x2,4x2" "VRAMLAB_COOP_LOADS=wide VRAMLAB_COOP_TILE=2x4,4x2"; do
    env $env timeout $(limit 30) $V bench --sizes 4096 --models none --reps 5 --json 2> /dev/null |
      python3 -c "
import json,sys
d=json.load(sys.stdin)
rows=[(r['mode'], round(2*4096**3/r['seconds']/1e12,1)) for r in d['precision'] if r['what'].startswith('matmul')]
print('$env', 'TFLOP/s', rows)" || echo "$env failed"
  done
fi

if want estimate; then
  step "estimate --measure with tuning on"
  timeout $(limit 40) $V estimate --model simple-cnn --batch 64 --steps 2 --measure 2>&1 | tail -8
  timeout $(limit 40) $V estimate --model simple-cnn --batch 64 --amp f16 --steps 2 --measure 2>&1 | tail -8
fi

if want recorder; then
  step "recorder against CUDA"
  PYTHONPATH=python timeout $(limit 130) python3 scripts/cuda_recorder_check.py --out /tmp/rec --budget ${REC_BUDGET:-120} \
    ${REC_MODELS:+--models $REC_MODELS} --dump-both "${REC_DUMP-resnet50,gpt2-bf16,gpt2-fp32}" 2>&1 | tail -30
  cp /tmp/rec/cuda_check.json "$OUT/" 2> /dev/null
  (cd /tmp/rec && tar cf "$OUT/recorder.tar" .) && ls -la /tmp/rec
fi

if want ddp; then
  step "DDP's options against the plain model (lesson C21)"
  PYTHONPATH=python timeout $(limit 150) python3 scripts/ddp_check.py > "$OUT/ddp.json"
  echo "rc $?"
fi

if want bench2; then
  step "the SimpleConvNet step twice: the first run tunes the tile cache, the second reads it"
  for i in 1 2; do
    timeout $(limit 90) $V bench --sizes 2048 --models simple-cnn --batch 64 --reps 20 --json \
      > "$OUT/bench_step$i.json" 2> /dev/null
    python3 - "$OUT/bench_step$i.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["precision"]:
    print(f"{r['what']:<16} {r['mode']:<9} {r['seconds'] * 1e3:.2f} ms  {r['speedup_vs_f32']:.2f}x f32")
for m in d["models"]:
    print(f"{m['model']} step: untimed {m['untimed_seconds_median'] * 1e3:.2f} ms, device {m['device_seconds_median'] * 1e3:.2f} ms")
PY
  done
fi

if want ab; then
  RUNS=${AB_RUNS:-new new-amp new-submit0 new-bg0 new-lists-off new-split512 base}
  step "SimpleConvNet batch 64, in turn: $RUNS (new: this build; -amp: its step under autocast f16, per kernel; -rb0: VRAMLAB_READBACK_REUSE=0; -fused: fused Adam, GradScaler's flag on the device; submit0, bg0, lists-off: VRAMLAB_SUBMIT_FIRST=0, VRAMLAB_BIND_GROUP_CACHE=0, VRAMLAB_LIST_OPS=off; split512: 512-workgroup K splits; base: the base build)"
  # Each build keeps its own tile cache (their cache versions may differ,
  # and each would retune over the other's), warmed up by one run first.
  # Base's mixed-precision rows are timed with the kernel timer on, this
  # build's with it off (untimed wall clock).
  # VRAMLAB_SPLIT_*: K split into 512 workgroups' worth of ranges of at
  # least 128 (the fc forward's and conv1 weight gradient's chains of
  # dependent slices 4x shorter). A tile class does not name its split, so
  # that run keeps a tile cache of its own, tuned for its K ranges in the
  # warm-up.
  SPLIT="VRAMLAB_SPLIT_GROUPS=512 VRAMLAB_SPLIT_MIN_K=128"
  for warm in "$V /tmp/tiles-vramlab.json" "$V /tmp/tiles-split.json $SPLIT" \
    ".devbin/vramlab-base /tmp/tiles-base.json"; do
    set -- $warm; bin=$1; cache=$2; shift 2
    # A build's cache is warmed only for the runs that read it.
    [[ $cache == */tiles-split.json && " $RUNS " != *" new-split512 "* ]] && continue
    [ -x "$bin" ] && env "$@" VRAMLAB_TUNE_CACHE=$cache timeout $(limit 60) "$bin" bench \
      --sizes 256 --models simple-cnn --batch 64 --reps 1 2>&1 | grep "tile tuning"
  done
  # The step under autocast has shape classes of its own (tensor-core
  # layouts among them): tuned here, not in a timed run.
  [[ " $RUNS " == *"-amp"* ]] && VRAMLAB_TUNE_CACHE=/tmp/tiles-vramlab.json timeout $(limit 60) $V bench \
    --sizes 256 --models simple-cnn --batch 64 --reps 1 --amp f16 --no-precision 2>&1 | grep -E "tile tuning|tensor-core layouts"
  for i in $(seq ${AB_ITERS:-3}); do
    for run in $RUNS; do
      cache=/tmp/tiles-vramlab.json
      flags=""
      case $run in
        new) bin=$V; envs="" ;;
        new-amp) bin=$V; envs=""; flags="--amp f16 --no-precision" ;;
        new-rb0) bin=$V; envs="VRAMLAB_READBACK_REUSE=0" ;;
        new-amp-rb0) bin=$V; envs="VRAMLAB_READBACK_REUSE=0"; flags="--amp f16 --no-precision" ;;
        new-fused) bin=$V; envs=""; flags="--optimizer-impl fused --no-precision" ;;
        new-amp-fused) bin=$V; envs=""; flags="--amp f16 --optimizer-impl fused --no-precision" ;;
        new-split512) bin=$V; envs="$SPLIT"; cache=/tmp/tiles-split.json ;;
        new-submit0) bin=$V; envs="VRAMLAB_SUBMIT_FIRST=0" ;;
        new-bg0) bin=$V; envs="VRAMLAB_BIND_GROUP_CACHE=0" ;;
        new-lists-off) bin=$V; envs="VRAMLAB_LIST_OPS=off" ;;
        base) bin=.devbin/vramlab-base; envs=""; cache=/tmp/tiles-base.json ;;
      esac
      [ -x "$bin" ] || { echo "$run: $bin missing"; continue; }
      env $envs VRAMLAB_TUNE_CACHE=$cache timeout $(limit 45) "$bin" bench \
        --sizes 256 --models simple-cnn --batch 64 --reps 20 --json $flags \
        > "$OUT/ab_${run}_$i.json" 2> /dev/null
      python3 - "$OUT/ab_${run}_$i.json" "$run" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
m = d["models"][0]
amp = {r["mode"]: r["speedup_vs_f32"] for r in d["precision"] if not r["what"].startswith("matmul")}
o = d["dispatch_overhead"]
print(f"{sys.argv[2]:<14} {'amp ' + m['amp'] if m.get('amp') else 'f32':<8} {m.get('optimizer_impl', 'foreach'):<8} untimed {m['untimed_seconds_median'] * 1e3:.2f} ms  device {m['device_seconds_median'] * 1e3:.2f} ms"
      f"  host {m['host_seconds_median'] * 1e3:.2f} ms  dispatches {m['device_time']['dispatches']}"
      f"  amp f16 {amp.get('amp f16', 0):.2f}x f32  amp bf16 {amp.get('amp bf16', 0):.2f}x"
      f"  record {o['record_micros']:.2f} us/dispatch  round trip {o.get('round_trip_micros', 0):.1f} us  readback {o.get('readback_micros', 0):.1f} us")
ks = m["device_time"]["kernels"]
# The four longest, then the reductions' second stages and channel sums.
for k in ks[:4] + [k for k in ks[4:] if k["name"].startswith(("sum_partials", "channel_sum"))]:
    print(f"    {k['seconds'] * 1e3:.3f} ms x{k['calls']} {k['name'][:110]}")
# Under autocast: the casts' share, and the products on tensor cores.
casts = [k for k in ks if k["name"].startswith("cast[")]
if casts:
    coop = [k for k in ks if k["name"].startswith("matmul_coop")]
    print(f"    casts {sum(k['seconds'] for k in casts) * 1e3:.3f} ms x{sum(k['calls'] for k in casts)};"
          f" tensor cores {sum(k['seconds'] for k in coop) * 1e3:.3f} ms x{sum(k['calls'] for k in coop)}")
PY
    done
  done
  timeout $(limit 40) python3 scripts/torch_step_bench.py --reps 50 --json > "$OUT/ab_torch.json" 2> /dev/null &&
    python3 -c "import json; d=json.load(open('$OUT/ab_torch.json')); print('PyTorch CUDA step', round(d['step']['seconds'] * 1e3, 3), 'ms')"
fi

if want moretests; then
  step "more tests on this GPU"
  VRAMLAB_EXPECT_TENSOR_CORES=1 timeout $(limit 90) .devbin/suite --test-threads 8 \
    matmul_tuning low_precision_ops torch_amp 2>&1 |
    grep -E "^test |test result|panicked|FAILED|failures" | tail -40
fi

if want zoo; then
  step "every zoo model's step, per op"
  timeout $(limit 90) $V bench --sizes 256 --models simple-cnn,mlp,resnet-mini,attention,gpt,resnet50 \
    --batch 8 --reps 3 --no-precision --json > "$OUT/zoo.json" 2> /tmp/zoo.err
  echo "rc $?"; tail -5 /tmp/zoo.err
fi
step "done"
# The device tool returns at most 8 files: the JSON figures travel as one
# tar beside log.txt.
(cd "$OUT" && compgen -G "*.json" > /dev/null && tar cf figures.tar *.json && rm -f *.json)
