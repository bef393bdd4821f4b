#!/usr/bin/env bash
# Runs COMMAND against a second software Vulkan driver: Mesa 26's lavapipe from
# Debian sid (LLVM 22), whose code generation (FMA contraction, subgroup
# lowering) differs from bookworm's Mesa 22, so the kernels are checked on two
# compilers. It also exposes cooperative matrices, which bookworm's lacks.
#   scripts/mesa26.sh target/release/vramlab info
#   CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=$PWD/scripts/mesa26.sh cargo test --test suite -- kernels::
# The first call builds a minimal sid root with debootstrap in
# $VRAMLAB_MESA26_ROOT (default /opt/vramlab-mesa26; about 1 min and 1 GB)
# from the Debian mirror apt already uses. Needs root (chroot, mounts).
# The current directory, /tmp, the command's own directory and
# $CARGO_TARGET_DIR are visible inside at the same paths; the mounts vanish
# with the command.
set -euo pipefail
root=${VRAMLAB_MESA26_ROOT:-/opt/vramlab-mesa26}
[ $# -gt 0 ] || { echo "usage: scripts/mesa26.sh COMMAND [ARGS...]" >&2; exit 2; }
if [ "$(id -u)" != 0 ]; then
  echo "scripts/mesa26.sh: needs root (it runs COMMAND in a chroot with Debian sid's Mesa);" \
    "run it as root or with sudo" >&2
  exit 2
fi
if ! compgen -G "$root/usr/share/vulkan/icd.d/lvp_icd*.json" > /dev/null; then
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2> /dev/null | grep -v security | head -n 1 || true)
  [ -n "$mirror" ] || mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2> /dev/null || true)
  [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
  if ! command -v debootstrap > /dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; } > /dev/null 2>&1 || {
      echo "scripts/mesa26.sh: debootstrap is missing and could not be installed: apt-get install debootstrap" >&2
      exit 1
    }
  fi
  echo "scripts/mesa26.sh: building a Debian sid root with Mesa's lavapipe in $root (from $mirror) ..." >&2
  log=$(mktemp /tmp/mesa26-debootstrap.XXXXXX.log)
  rm -rf "$root.partial"
  if ! debootstrap --variant=minbase --include=mesa-vulkan-drivers,libvulkan1 sid "$root.partial" "$mirror" > "$log" 2>&1; then
    tail -n 5 "$log" >&2
    echo "scripts/mesa26.sh: debootstrap of Debian sid failed (log: $log); it needs $mirror reachable" >&2
    exit 1
  fi
  rm -rf "$root"
  mv "$root.partial" "$root"
fi
# The command's directory, and cargo's target directory where it is set
# elsewhere (tests run the vramlab binary beside their own).
cmd_dir=""
case "$1" in /*) cmd_dir=$(dirname "$1") ;; esac
case "${CARGO_TARGET_DIR:-}" in /*) cmd_dir="$cmd_dir $CARGO_TARGET_DIR" ;; esac
exec unshare --mount --propagation private /bin/bash -c '
  root=$1; dir=$2; cmd_dir=$3; shift 3
  mount -t proc proc "$root/proc"
  for d in "$dir" /tmp $cmd_dir; do
    mkdir -p "$root$d"
    mount --bind "$d" "$root$d"
  done
  exec chroot "$root" /usr/bin/env -u VK_ICD_FILENAMES -u VK_DRIVER_FILES -C "$dir" "$@"' mesa26 "$root" "$PWD" "$cmd_dir" "$@"
