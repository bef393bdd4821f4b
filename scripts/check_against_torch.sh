#!/usr/bin/env bash
# For fresh random weights and batches (seeds no test has seen), runs
# `vramlab train --load --data --dump --steps 1` for every zoo model and
# every optimizer and compares the dump with PyTorch (CPU, f32) at 1e-4.
# Needs PyTorch and safetensors: pip install torch safetensors.
# Usage: scripts/check_against_torch.sh [SEED] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
seed=${1:-$RANDOM}
steps=${2:-1}
python3 -c "import torch, safetensors" 2>/dev/null || {
    echo "error: needs PyTorch and safetensors: pip install torch safetensors" >&2
    exit 2
}
cargo build --release --quiet
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
for model in mlp simple-cnn resnet-mini attention; do
    for opt in sgd adam adamw; do
        d="$dir/$model-$opt"
        cmd=$(python3 scripts/torch_reference.py case --model "$model" --optimizer "$opt" --seed "$seed" --steps "$steps" --dir "$d")
        ./target/release/$cmd --json > /dev/null 2> "$d/stderr" || { cat "$d/stderr"; fail=1; continue; }
        if out=$(python3 scripts/torch_reference.py compare "$d/expected.safetensors" "$d/dump.safetensors"); then
            echo "$model $opt: $(echo "$out" | tail -1)"
        else
            echo "$out" | grep -E "over|worst"; echo "$model $opt: FAILED"; fail=1
        fi
    done
done
echo "seed $seed, $steps step(s): $([ $fail = 0 ] && echo all match PyTorch || echo MISMATCH)"
exit $fail
