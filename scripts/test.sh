#!/usr/bin/env bash
# vramlab's test command (the README's, and CI's): makes sure a Vulkan driver
# exists (installing Mesa's software driver, lavapipe, when it can) and a
# headless Chromium for the timeline page's test (Debian's chromium), then
# runs rustfmt, clippy and every test, the product tests again through the
# GPU tile family (VRAMLAB_TILE_FAMILY=gpu); then the kernel and numerics tests
# again under a second driver, Mesa 26's lavapipe (scripts/mesa26.sh: a
# Debian sid chroot, root needed; VRAMLAB_SKIP_MESA26=1 leaves it out, and
# it is left out when extra cargo test args are given).
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

have_vulkan_driver() {
  [ -n "${VK_ICD_FILENAMES:-}${VK_DRIVER_FILES:-}" ] && return 0
  for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
    if compgen -G "$d/*.json" > /dev/null; then return 0; fi
  done
  return 1
}

have_chromium() {
  command -v chromium > /dev/null || command -v chromium-browser > /dev/null || command -v google-chrome > /dev/null
}

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo > /dev/null; then SUDO="sudo"; fi
can_apt() { command -v apt-get > /dev/null && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; }
updated=""
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "$updated" ]; then $SUDO apt-get update -qq; updated=1; fi
  $SUDO apt-get install -y -qq "$@" > /dev/null
}

if [ "$(uname -s)" = "Linux" ] && ! have_vulkan_driver; then
  echo "scripts/test.sh: no Vulkan driver found; installing Mesa's software driver (mesa-vulkan-drivers)..."
  if can_apt; then apt_install mesa-vulkan-drivers; fi
  if ! have_vulkan_driver; then
    cat >&2 <<'MSG'
scripts/test.sh: no Vulkan driver, and it could not be installed automatically.
Install Mesa's software Vulkan driver, then run this script again:
  Debian/Ubuntu:  sudo apt-get install mesa-vulkan-drivers
  Fedora:         sudo dnf install mesa-vulkan-drivers
  Arch:           sudo pacman -S vulkan-swrast
(Or install your GPU vendor's Vulkan driver.)
MSG
    exit 1
  fi
fi

if [ "$(uname -s)" = "Linux" ] && ! have_chromium; then
  echo "scripts/test.sh: installing Debian's chromium for the timeline page test..."
  if can_apt; then apt_install chromium; fi
  if ! have_chromium; then
    echo "scripts/test.sh: tests/profile.rs needs a headless Chromium: apt-get install chromium" >&2
    exit 1
  fi
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== cargo test"
if [ $# -eq 0 ]; then
  # Every crate's tests: the allocator's, the lab's and the engine's unit
  # tests, and this crate's integration tests.
  cargo test --workspace
else
  cargo test "$@"
fi

# The GPU tile family (shaders/matmul_gpu.wgsl) on this driver: every
# product of the kernel, model and PyTorch-fixture tests through it, as on
# a GPU (CPU adapters otherwise run the direct family).
if [ $# -eq 0 ]; then
  echo "== cargo test (products through the GPU tile family: VRAMLAB_TILE_FAMILY=gpu)"
  VRAMLAB_TILE_FAMILY=gpu cargo test --test suite -- matmul_family:: torch_fixtures:: \
    low_precision_ops:: ops_backward:: kernels:: resnet_ops:: \
    gpt_ops:: linear_cross_entropy:: torch_amp::
fi

# The recorder's own tests (python/tests): they need PyTorch, which vramlab
# itself never does. It is installed from PyPI into a virtual environment
# kept between runs ($VRAMLAB_TORCH_VENV); where it cannot be (no network,
# no space: the wheel with its CUDA libraries is about 5 GB), the tests are
# reported as not run, and the Rust tests still replay the committed
# recordings. VRAMLAB_SKIP_RECORDER=1 leaves them out.
if [ $# -eq 0 ] && [ "${VRAMLAB_SKIP_RECORDER:-}" != 1 ]; then
  venv=${VRAMLAB_TORCH_VENV:-$HOME/.cache/vramlab/torch-venv}
  has_torch() { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch, pytest" 2> /dev/null; }
  if ! has_torch; then
    echo "== installing PyTorch and pytest for the recorder's tests into $venv"
    start=$(date +%s)
    { python3 -m venv "$venv" && timeout 900 "$venv/bin/pip" install -q torch pytest; } ||
      echo "scripts/test.sh: could not install PyTorch (pip install torch pytest); the recorder's Python tests are NOT run" >&2
    echo "   ($(($(date +%s) - start)) s)"
  fi
  if has_torch; then
    echo "== python recorder tests (python/tests, $("$venv/bin/python" -c "import torch; print('PyTorch', torch.__version__)"))"
    cargo build --quiet --bin vramlab
    VRAMLAB_BIN="$PWD/target/debug/vramlab" PYTHONPATH="$PWD/python" \
      "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests
  fi
fi

# The second driver: a different compiler (LLVM 22 against 15) rounds the
# kernels differently (FMA contraction), so accuracy bounds that hold on one
# driver only by luck show up here.
if [ $# -gt 0 ] || [ "${VRAMLAB_SKIP_MESA26:-}" = 1 ]; then
  echo "== Mesa 26 pass left out (extra cargo test args given, or VRAMLAB_SKIP_MESA26=1)"
  exit 0
fi
if [ "$(uname -s)" != "Linux" ]; then
  echo "== Mesa 26 pass left out: it needs a Linux chroot (scripts/mesa26.sh)"
  exit 0
fi
runner="$PWD/scripts/mesa26.sh"
if [ "$(id -u)" -ne 0 ]; then
  if [ -z "$SUDO" ]; then
    echo "scripts/test.sh: the Mesa 26 pass needs root (a chroot): run as root, or with sudo installed," >&2
    echo "  or set VRAMLAB_SKIP_MESA26=1 to run only under this machine's driver" >&2
    exit 1
  fi
  runner="sudo -E $runner"
fi
echo "== cargo test (kernels and numerics) under Mesa 26's lavapipe"
host=$(rustc -vV | sed -n 's/^host: //p' | tr 'a-z.-' 'A-Z__')
# Windows' kernels against f64 there too. What does not depend on the
# driver ran above only: the zoo trained whole and in windows (bit
# equality), and products cut past the budget (how they are cut; their
# many window counts cost LLVM 22 about 500 s of compiling).
env "CARGO_TARGET_${host}_RUNNER=$runner" VRAMLAB_EXPECT_TENSOR_CORES=1 cargo test --test suite -- \
  kernels:: matmul_family:: ops_backward:: ops_reductions:: \
  low_precision_ops:: gpt_ops:: resnet_ops:: \
  torch_fixtures:: torch_amp:: hostile_numerics:: pytorch_step:: \
  linear_cross_entropy:: dispatch_batching:: matmul_coop:: windows:: \
  estimate_differential:: bench_cli::bench_times_the_model_steps_under_autocast \
  matmul_tuning::tensor_core_layouts \
  --skip windows::every_model --skip windows::the_documents --skip windows::products_past
# The tensor-core kernel's other staging paths (the default prefetches the
# next step with one copy of workgroup memory): without prefetching, with
# two copies, with two copies of 3-deep steps in an odd layout, and wide
# items read as halves. Every layout the tuner may pick is checked in the
# default staging above only (about 80 s a pass).
for env in VRAMLAB_COOP_PREFETCH=0 VRAMLAB_COOP_BUFFERS=2 \
  "VRAMLAB_COOP_BUFFERS=2 VRAMLAB_COOP_TILE=1x2,4x2 VRAMLAB_COOP_STAGE_DEPTH=3" \
  "VRAMLAB_COOP_HALVES=1 VRAMLAB_COOP_BUFFERS=2"; do
  echo "== matmul_coop under Mesa 26 with $env"
  env $env "CARGO_TARGET_${host}_RUNNER=$runner" VRAMLAB_EXPECT_TENSOR_CORES=1 \
    cargo test --test suite -- matmul_coop:: --skip matmul_coop::every_layout
done
