# Sourced by the bench scripts (overhead.sh, callgrind.sh, atomics.sh).
# wait_ready PID LOG REGEX [SECS]: prints the first match of REGEX in LOG,
# waiting up to SECS (10) while PID lives; otherwise shows LOG and exits.
wait_ready() {
    local deadline=$((SECONDS + ${4:-10})) match
    while ((SECONDS < deadline)); do
        match=$(grep -oE "$3" "$2" | head -1 || true)
        [[ -n $match ]] && { echo "$match"; return 0; }
        kill -0 "$1" 2>/dev/null || break
        sleep 0.1
    done
    cat "$2" >&2
    echo "$(basename "$0"): process $1 did not get ready (log above)" >&2
    exit 1
}

# upstream_ready PID LOG DIR: waits for the fake upstream PID to print its
# base URL in LOG, sets UP_BASE (http://127.0.0.1:PORT/v1) and UP_PORT,
# and writes DIR/gateway.toml: one provider, no routes, so that every
# model goes to that upstream.
upstream_ready() {
    UP_BASE=$(wait_ready "$1" "$2" 'http://127\.0\.0\.1:[0-9]+/v1')
    UP_PORT=${UP_BASE##*:}
    UP_PORT=${UP_PORT%/v1}
    cat >"$3/gateway.toml" <<TOML
listen = "127.0.0.1:0"

[[providers]]
name = "up"
base_url = "$UP_BASE"
TOML
}

# build_bench_binaries EXAMPLE...: the release gateway as its users build
# it (`cargo run --release -p tower-llm-gateway`, with the workspace's
# profile: examples/gateway/pgo/rustc-wrapper.sh), the bare pass-through
# (binary `passthrough` of `benches/fixtures`) as a user would build their
# own, without that profile (TOWER_LLM_GATEWAY_PGO=0, in a target dir of
# its own, TARGET/baseline: cargo does not see what the wrapper adds, and
# would reuse the gateway's dependencies), then the gateway's example
# fixtures. Separate builds, not one: an example in a build brings its
# package's dev-dependencies and their features into every binary of that
# build (tokio's `test-util` clock, which takes a lock at every clock read;
# its `process` driver, which tries a process-wide lock at every park),
# and the benches would compare a gateway and a baseline nobody ships.
build_bench_binaries() {
    local example args=() target_dir
    target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    cargo build --release --quiet -p tower-llm-gateway --bin tower-llm-gateway
    TOWER_LLM_GATEWAY_PGO=0 cargo build --release --quiet -p tower-llm-bench-fixtures --bin passthrough \
        --target-dir "$target_dir/baseline"
    for example in "$@"; do args+=(--example "$example"); done
    cargo build --release --quiet -p tower-llm-gateway "${args[@]}"
}

# valgrind_bench_setup NAME TOOL...: the set-up of the callgrind scripts
# (callgrind.sh, atomics.sh): checks that each TOOL is there, builds the
# release gateway and its fixtures, and starts the prepared upstream. Sets
# WORK (removed at exit, when every pid in PIDS is killed), TARGET_DIR,
# BIN (the examples), PASSTHROUGH, UP_BASE, UP_PORT and WORK/gateway.toml.
valgrind_bench_setup() {
    local name=$1 tool
    shift
    WORK=$(mktemp -d)
    PIDS=()
    trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"' EXIT
    for tool in "$@"; do
        command -v "$tool" >/dev/null || { echo "benches/$name needs $tool" >&2; exit 1; }
    done
    TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    build_bench_binaries prepared_upstream
    BIN="$TARGET_DIR/release/examples"
    PASSTHROUGH="$TARGET_DIR/baseline/release/passthrough"
    "$BIN/prepared_upstream" --port 0 --name up --tokens 100 --completion-tokens 8 >"$WORK/up.log" 2>&1 &
    PIDS+=($!)
    upstream_ready $! "$WORK/up.log" "$WORK"
}

# bench_bodies: sets SMALL, STREAM and LARGE, the request bodies the
# callgrind scripts send (callgrind.sh, hot-functions.sh): a small
# completion, a stream, and a small completion asked with a 64 KB prompt
# (20 messages of about 3.2 KB, with quotes, newlines and a non-ASCII
# letter escaped as JSON writes them: the request's reading is what grows
# with it).
bench_bodies() {
    local sentence text i
    SMALL='{"model":"bench","messages":[{"role":"user","content":"Say hello."}]}'
    STREAM='{"model":"bench","stream":true,"messages":[{"role":"user","content":"Say hello."}]}'
    sentence='Lorem ipsum dolor sit amet, \"quoted\" text with a newline\n and unicode \u00e9. '
    text=$(for _ in $(seq 40); do printf '%s' "$sentence"; done)
    LARGE='{"model":"bench","messages":['
    for i in $(seq 20); do
        ((i > 1)) && LARGE+=','
        LARGE+="{\"role\":\"user\",\"content\":\"$text\"}"
    done
    LARGE+=']}'
}

# dialect_bodies DIR: sets MESSAGES, MESSAGES_STREAM, RESPONSES and
# RESPONSES_STREAM, small requests of the other dialects' clients (whole
# and streamed), and writes DIR/routed.toml: DIR/gateway.toml with a route
# for their model to the upstream (the benchmarks' config has none, so
# each endpoint keeps its own catch-all there), which translates them to
# the upstream's chat (hot-functions.sh, pgo.sh).
dialect_bodies() {
    MESSAGES='{"model":"bench","max_tokens":64,"messages":[{"role":"user","content":"Say hello."}]}'
    MESSAGES_STREAM='{"model":"bench","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Say hello."}]}'
    RESPONSES='{"model":"bench","input":"Say hello."}'
    RESPONSES_STREAM='{"model":"bench","stream":true,"input":"Say hello."}'
    cp "$1/gateway.toml" "$1/routed.toml"
    printf '\n[[routes]]\nmodel = "bench"\ntargets = [{ provider = "up" }]\n' >>"$1/routed.toml"
}
