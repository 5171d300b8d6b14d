#!/usr/bin/env bash
# Writes the gateway's profile for profile-guided optimisation
# (examples/gateway/pgo/gateway.profdata, which the workspace's rustc wrapper,
# examples/gateway/pgo/rustc-wrapper.sh, hands to every crate of a release
# build), then the hot-function list of the build that uses it.
#
#   benches/pgo.sh
#
# 1. builds the gateway instrumented (`-C profile-generate`, a target dir of
#    its own, removed after);
# 2. runs it as shipped (default logging) under wrk against the prepared
#    upstream: small completions and 100-token streams at 32 and 1
#    connections, 64 KB requests, then Messages and Responses clients
#    translated to chat, whole and streamed (the workloads of
#    benches/overhead.sh and benches/hot-functions.sh; the paced stream is
#    left out, so that one headline row is a workload the profile never saw);
# 3. merges what it counted (`llvm-profdata merge --sparse`: functions never
#    run are left out, and are compiled as without a profile);
# 4. removes the release build (cargo does not see the profile change in a
#    dependency) and writes the hot-function list again from the new one
#    (benches/hot-functions.sh).
#
# Run it again when a release build warns "function control flow change
# detected (hash mismatch)" for the workspace's crates, or after a
# dependency upgrade: .ci/run fails on the first.
# Needs wrk, curl, valgrind and an llvm-profdata of LLVM 22 or newer
# (Debian: apt-get install llvm-22).
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=examples/gateway/pgo/gateway.profdata

PROFDATA=
for candidate in "${LLVM_PROFDATA:-}" llvm-profdata-22 /usr/lib/llvm-22/bin/llvm-profdata llvm-profdata \
    "$(rustc --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/bin/llvm-profdata"; do
    [[ -n $candidate ]] && command -v "$candidate" >/dev/null || continue
    major=$("$candidate" --version | sed -n 's/.*LLVM version \([0-9][0-9]*\).*/\1/p' | head -1)
    if ((${major:-0} >= 22)); then PROFDATA=$candidate; break; fi
done
[[ -n $PROFDATA ]] || { echo "benches/pgo.sh needs llvm-profdata of LLVM 22 or newer (apt-get install llvm-22)" >&2; exit 1; }
for tool in wrk curl; do
    command -v $tool >/dev/null || { echo "benches/pgo.sh needs $tool" >&2; exit 1; }
done

source benches/wait_ready.sh
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
TRAIN_DIR="$TARGET_DIR/pgo-train"
WORK=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK" "$TRAIN_DIR"' EXIT

echo "building the instrumented gateway (a target dir of its own)..." >&2
# The flag reaches build scripts and proc-macros too, which write their own
# counts when they run: into build-raw, left out of the merge.
RUSTFLAGS="-Cprofile-generate=$WORK/build-raw" cargo build --release --quiet -p tower-llm-gateway \
    --bin tower-llm-gateway --target-dir "$TRAIN_DIR"
cargo build --release --quiet -p tower-llm-gateway --example prepared_upstream
"$TARGET_DIR/release/examples/prepared_upstream" --port 0 --name up --tokens 100 --completion-tokens 8 \
    >"$WORK/up.log" 2>&1 &
PIDS+=($!)
upstream_ready $! "$WORK/up.log" "$WORK"

bench_bodies
dialect_bodies "$WORK"
script() { # name body
    printf 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = [==[%s]==]\n' "$2" >"$WORK/$1.lua"
}
script small "$SMALL"
script stream "$STREAM"
script large "$LARGE"
script messages "$MESSAGES"
script messages-stream "$MESSAGES_STREAM"
script responses "$RESPONSES"
script responses-stream "$RESPONSES_STREAM"

# train CONFIG WORKLOAD:PATH:CONNECTIONS:SECONDS...: one gateway process
# (its counts written when it exits) under each load in turn.
train() {
    local config=$1 pid addr spec workload path connections seconds
    shift
    env -u RUST_LOG LLVM_PROFILE_FILE="$WORK/raw/gateway-%p.profraw" \
        "$TRAIN_DIR/release/tower-llm-gateway" --config "$config" >"$WORK/gw.log" 2>/dev/null &
    pid=$!
    PIDS+=($pid)
    addr=$(wait_ready $pid "$WORK/gw.log" 'ready on http://127\.0\.0\.1:[0-9]+' 30)
    addr=${addr##*//}
    for spec in "$@"; do
        IFS=: read -r workload path connections seconds <<<"$spec"
        wrk -t"$((connections > 1 ? 2 : 1))" -c"$connections" -d"${seconds}s" -s "$WORK/$workload.lua" \
            "http://$addr$path" | awk -v w="$workload" -v c="$connections" '/Requests\/sec/ { print "  " w ", " c " conn: " $2 " requests/s" }' >&2
    done
    curl -s "http://$addr/metrics" >/dev/null
    kill -INT $pid
    wait $pid || true
}
echo "training (the instrumented gateway is several times slower than the release one)..." >&2
CHAT=/v1/chat/completions
train "$WORK/gateway.toml" small:$CHAT:32:4 small:$CHAT:1:3 stream:$CHAT:32:3 stream:$CHAT:1:2 large:$CHAT:4:2
train "$WORK/routed.toml" messages:/v1/messages:4:1 messages-stream:/v1/messages:4:1 \
    responses:/v1/responses:4:1 responses-stream:/v1/responses:4:1

"$PROFDATA" merge --sparse -o "$PROFILE" "$WORK"/raw/gateway-*.profraw
echo "wrote $PROFILE ($(wc -c <"$PROFILE") bytes)" >&2

echo "removing $TARGET_DIR/release: its dependencies were built with the old profile" >&2
rm -rf "$TARGET_DIR/release"
benches/hot-functions.sh
