#!/usr/bin/env bash
# Packs what scripts/device_bench.sh runs on a lent GPU machine into .devbin/
# (git-ignored through .git/info/exclude): the release CLI, the debug CLI and
# test suite (the tests spawn the CLI at its build path), and the burn peer,
# each stripped and xz-compressed so that they travel with the working tree
# within the tool's 64 MiB. Build them first:
#   cargo build --release --bin vramlab && cargo test --test suite --no-run
#   cargo build --bin vramlab
#   cargo build --release --manifest-path benches/peers/burn/Cargo.toml
# BASE_BIN=path/to/an/older/release/vramlab also packs that build as
# vramlab-base, for device_bench.sh's `ab` step (this build beside it).
# PROFILE=release packs the release suite instead, which runs the tests'
# f64 references many times faster (build it with `cargo test --release
# --test suite --no-run`; no debug build is needed then).
set -euo pipefail
mkdir -p .devbin
rm -f .devbin/*
pack() { # SOURCE NAME
  [ -f "$1" ] || { echo "device_pack: $1 is missing; build it first (see this script's header)" >&2; return 1; }
  strip -o ".devbin/$2" "$1"
  xz -T2 -6 -f ".devbin/$2"
}
pack target/release/vramlab vramlab
if [ "${PROFILE:-debug}" = release ]; then
  pack "$(ls -t target/release/deps/suite-* | grep -v '\.d$' | head -n 1)" suite
else
  pack target/debug/vramlab vramlab-debug
  pack "$(ls -t target/debug/deps/suite-* | grep -v '\.d$' | head -n 1)" suite
fi
if [ -f benches/peers/burn/target/release/vramlab-peer-burn ]; then
  pack benches/peers/burn/target/release/vramlab-peer-burn vramlab-peer-burn
else
  echo "device_pack: no burn peer built; the burn step will have nothing to run" >&2
fi
if [ -n "${BASE_BIN:-}" ]; then pack "$BASE_BIN" vramlab-base; fi
du -ch .devbin/* | tail -n 1
