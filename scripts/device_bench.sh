#!/usr/bin/env bash
# The GPU half of the kernel benchmarks, for a lent NVIDIA machine reached
# through the workplace's device tool: unpacks the carried Vulkan loader,
# then runs `vramlab bench` (and --tune), the burn peer and PyTorch (CUDA)
# on the same GPU, writing everything under $OUT. Binaries are built on the
# x86-64 host and carried in .devbin/.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export XDG_RUNTIME_DIR=/tmp
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
.devbin/vramlab info > /tmp/info.txt; head -12 /tmp/info.txt
MODE=${1:-all}
[ -f .devbin/vramlab-peer-burn.xz ] && xz -dkf .devbin/vramlab-peer-burn.xz
if [ "$MODE" = fixtures ]; then
  rm -rf /tmp/fx && cp -r tests/fixtures/torch /tmp/fx
  python3 scripts/torch_reference.py truth --out /tmp/fx | tail -3
  (cd /tmp/fx && tar cf "$OUT/truth.tar" */truth.safetensors)
fi
if [ "$MODE" = truth ]; then
  python3 scripts/f64_truth.py tests/fixtures/torch/simple-cnn-adam .devbin/vramlab_simple_cnn_adam.safetensors 2>&1 | tee "$OUT/truth.txt"
fi
if [ "$MODE" = all ] || [ "$MODE" = tune ]; then
  timeout 400 .devbin/vramlab bench --sizes 1024 --models ${TUNE_MODELS:-simple-cnn} --tune --reps 5 --json > /tmp/tune.json 2> /tmp/tune.err
  python3 - /tmp/tune.json <<'PY' | tee "$OUT/tune.txt"
import json,sys
d=json.load(open(sys.argv[1]))
for t in d["tune"]:
    print(f'{t["class"]:<8} {t["shape"]:<44} best {t["best"]:<28} {t["best_gflops"]:9.1f}  chosen {t["chosen"]} {t["chosen_gflops"]:.1f}')
    for name, g in t["tried"][:5]:
        print(f'           {name:<28} {g:9.1f}')
PY
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  timeout 200 .devbin/vramlab bench --reps 10 --json > "$OUT/bench.json" 2> /tmp/bench.err
  timeout 200 .devbin/vramlab bench --reps 10 2>&1 | tee "$OUT/bench.txt"
  timeout 200 .devbin/vramlab-peer-burn --reps 10 2>&1 | tee "$OUT/burn.txt"
  timeout 120 python3 scripts/torch_step_bench.py --reps 50 2>&1 | tee "$OUT/torch.txt"
  timeout 100 .devbin/vramlab profile --model simple-cnn --batch 64 --steps 2 --out /tmp/prof 2>&1 | tee "$OUT/profile.txt"
fi
