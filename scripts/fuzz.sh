#!/usr/bin/env bash
# Fuzzes everything that parses untrusted bytes (fuzz/src/lib.rs: the GGUF reader, OpenAI
# request bodies, chat-template rendering of hostile conversations, the tool-call parser, the
# split of a reasoning model's thinking from its answer) for
# SECONDS per target (default 60), with the best driver this machine has:
# - libFuzzer (coverage-guided) through cargo-fuzz when a nightly toolchain and cargo-fuzz are
#   installed (`cargo install cargo-fuzz`), unless LLAISYS_FUZZ_DRIVER=stable;
# - otherwise the stable driver (fuzz/src/bin/llaisys-fuzz.rs), which mutates the corpus.
# Findings are saved to fuzz/artifacts/TARGET/ and the script exits 1. Fix the bug, then copy
# the input to fuzz/corpus/TARGET/crash-WHAT so `cargo test` keeps it as a regression case.
# LLAISYS_FUZZ_SEED fixes the stable driver's seed (CI sets one, so its run is repeatable).
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf openai_request dialect_request chat_template tool_calls reasoning)
if [ "${LLAISYS_FUZZ_DRIVER:-}" != stable ] && cargo +nightly --version >/dev/null 2>&1 &&
  cargo fuzz --version >/dev/null 2>&1; then
  status=0
  for t in "${targets[@]}"; do
    # libFuzzer adds what it finds to its first corpus folder: a scratch copy, not the seeds.
    work=target/fuzz-corpus/$t
    mkdir -p "$work" "fuzz/artifacts/$t"
    echo "== $t: libFuzzer for $seconds s"
    cargo +nightly fuzz run --fuzz-dir fuzz/libfuzzer "$t" "$work" "fuzz/corpus/$t" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -artifact_prefix="fuzz/artifacts/$t/" -print_final_stats=1 ||
      status=1
  done
  exit $status
fi
echo "== the stable driver: ${targets[*]} for $seconds s each"
# The same build as `cargo test --workspace`, which builds the driver too (fuzz/tests needs it):
# nothing to compile after the tests. `cargo build` leaves the dev-dependencies' features out,
# so it resolves other features and builds most of the tree again (6m43s in a fresh-clone run).
cargo test --workspace --no-run
# One target a core at a time (the driver runs on one thread); each one's report printed whole
# when it ends. `running` holds a (pid, target) pair a job, oldest first.
logs=$(mktemp -d)
running=()
status=0
finish() {
  wait "${running[0]}" || status=1
  cat "$logs/${running[1]}"
  running=("${running[@]:2}")
}
for t in "${targets[@]}"; do
  [ ${#running[@]} -lt $((2 * $(nproc))) ] || finish
  target/debug/llaisys-fuzz "$t" "$seconds" ${LLAISYS_FUZZ_SEED:-} > "$logs/$t" 2>&1 &
  running+=($! "$t")
done
while [ ${#running[@]} -gt 0 ]; do finish; done
exit $status
