#!/usr/bin/env bash
# vramlab's test command (the README's, and CI's): makes sure a Vulkan driver
# exists (installing Mesa's software driver, lavapipe, when it can) and a
# headless Chromium for the timeline page's test (Debian's chromium), then
# runs rustfmt, clippy and every test. Usage: scripts/test.sh [extra cargo test args]
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
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --quiet -- -D warnings
echo "== cargo test"
cargo test "$@"
