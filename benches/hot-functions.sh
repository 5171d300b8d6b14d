#!/usr/bin/env bash
# The functions the release gateway runs for every request, for the linker
# to lay out side by side (examples/gateway/hot-functions.txt, which
# examples/gateway/build.rs hands to the linker).
#
# Fat LTO leaves a 10 MB text section in which the 425 functions of a
# small completion were scattered over 328 pages of 4 KB, where their
# bytes would fill 151; the chat endpoint's part of the list (those of a
# stream and a large request too) lies in about 175, and the other
# dialects' translated paths follow. A request that finds the instruction
# caches and TLB cold (at one connection, after the core slept) pays for
# each page and line it touches; see docs/performance.md, "Hot functions side by side".
#
#   benches/hot-functions.sh           write the list from the release build
#                                      (callgrind over a small completion, a
#                                      100-token stream and a 64 KB request,
#                                      then Messages and Responses clients
#                                      translated to chat, whole and
#                                      streamed; the gateway as shipped)
#   benches/hot-functions.sh --check   check the release build against the
#                                      list: its names are found and lie side
#                                      by side (exit 1 if not)
#
# The names are mangled, with hashes that hold while a crate's name,
# version and features do: a dependency's upgrade or a new compiler stales
# some of them (the linker skips a name it does not find, so a stale list
# costs speed, never a build), and --check says when to write it again.
# Needs valgrind and curl to write, nm to check.
set -euo pipefail
cd "$(dirname "$0")/.."
LIST=examples/gateway/hot-functions.txt
MODE=write
case ${1:-} in
    --check) MODE=check ;;
    '') ;;
    *) echo "usage: benches/hot-functions.sh [--check]" >&2; exit 2 ;;
esac

if [[ $MODE == check ]]; then
    command -v nm >/dev/null || { echo "benches/hot-functions.sh --check needs nm" >&2; exit 1; }
    TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    GATEWAY=${HOT_GATEWAY:-"$TARGET_DIR/release/tower-llm-gateway"}
    [[ -x $GATEWAY ]] || { echo "no release gateway at $GATEWAY: cargo build --release -p tower-llm-gateway" >&2; exit 1; }
    # Found: listed names the binary has. Span: the 4 KB pages their code
    # covers, against the fewest it could (their bytes in a row).
    nm -S -t d "$GATEWAY" | awk -v list="$LIST" '
        BEGIN { while ((getline name < list) > 0) if (name != "") { want[name] = 1; listed++ } }
        NF == 4 && ($4 in want) && !($4 in seen) {
            seen[$4] = 1; found++
            start = $1 + 0; size = $2 + 0; bytes += size
            for (p = int(start / 4096); p <= int((start + size - 1) / 4096); p++) page[p] = 1
        }
        END {
            for (p in page) pages++
            least = int((bytes + 4095) / 4096)
            printf "hot functions: %d of %d listed found in the binary; %d bytes over %d pages of 4 KB (%d at least)\n", found, listed, bytes, pages, least
            if (listed == 0 || found < 0.9 * listed) {
                print "the list is stale (under 90% found): write it again with benches/hot-functions.sh"; exit 1
            }
            if (pages > 1.1 * least + 2) {
                print "the hot functions are not side by side: is examples/gateway/build.rs handing the list to the linker?"; exit 1
            }
        }'
    exit
fi

source benches/wait_ready.sh
valgrind_bench_setup hot-functions.sh valgrind curl
GATEWAY="$TARGET_DIR/release/tower-llm-gateway"
# SMALL, STREAM and LARGE (a 64 KB prompt), as callgrind.sh sends them.
bench_bodies

# Self instructions per function of the gateway's own binary serving $1
# requests of body $2 to endpoint $4 under config $5 (after one that warms
# it up: start-up, first connections and the metrics clock's calibration
# are not counted), into file $3 as "count name" lines, names mangled.
profile() { # requests body out endpoint config
    local out="$WORK/cg.out" log="$WORK/gw.log" pid addr urls=()
    rm -f "$out"
    env -u RUST_LOG valgrind --tool=callgrind --demangle=no --instr-atstart=no \
        --callgrind-out-file="$out" "$GATEWAY" --config "$5" >"$log" 2>"$WORK/stderr.log" &
    pid=$!
    addr=$(wait_ready $pid "$log" 'ready on http://127\.0\.0\.1:[0-9]+' 60)
    addr=${addr##*//}
    curl -s -H 'content-type: application/json' -d "$2" "http://$addr$4" >/dev/null
    callgrind_control -i on $pid >/dev/null 2>&1
    for _ in $(seq "$1"); do urls+=("http://$addr$4"); done
    curl -s -H 'content-type: application/json' -d "$2" "${urls[@]}" >/dev/null
    callgrind_control -i off $pid >/dev/null 2>&1
    kill -INT $pid
    wait $pid 2>/dev/null || true
    callgrind_annotate --inclusive=no --threshold=100 "$out" 2>/dev/null |
        awk -v bin="[$GATEWAY]" '$NF == bin && $2 ~ /^\(/ {
            n = $1; gsub(",", "", n); name = $(NF - 1); sub(/.*:/, "", name); print n, name }' >"$3"
}

# The other dialects' clients, translated to the chat upstream by a route:
# Messages and Responses, whole and streamed.
dialect_bodies "$WORK"

# Each workload's functions with their share of its instructions; a
# function's weight is its largest share in any workload of its group.
# The chat endpoint's functions come first, from the heaviest (their
# layout is the one measured in benches/README.md), then the other
# dialects' that chat does not run. Names that LTO numbered (`name.1234`,
# a local copy) are left out: their numbers change with any change to
# the code.
CHAT=/v1/chat/completions
for workload in small stream large messages messages-stream responses responses-stream; do
    case $workload in
        small) set -- 100 "$SMALL" $CHAT "$WORK/gateway.toml" chat ;;
        stream) set -- 50 "$STREAM" $CHAT "$WORK/gateway.toml" chat ;;
        large) set -- 20 "$LARGE" $CHAT "$WORK/gateway.toml" chat ;;
        messages) set -- 50 "$MESSAGES" /v1/messages "$WORK/routed.toml" other ;;
        messages-stream) set -- 25 "$MESSAGES_STREAM" /v1/messages "$WORK/routed.toml" other ;;
        responses) set -- 50 "$RESPONSES" /v1/responses "$WORK/routed.toml" other ;;
        responses-stream) set -- 25 "$RESPONSES_STREAM" /v1/responses "$WORK/routed.toml" other ;;
    esac
    profile "$1" "$2" "$WORK/$workload.cost" "$3" "$4"
    awk '{ cost[$2] += $1; total += $1 } END { for (f in cost) printf "%.9f %s\n", cost[f] / total, f }' \
        "$WORK/$workload.cost" >>"$WORK/$5.share"
done
ranked() { # shares
    awk '{ if (!($2 in w) || $1 > w[$2]) w[$2] = $1 } END { for (f in w) print w[f], f }' "$1" |
        sort -k1,1gr | awk '$2 !~ /\.[0-9]+$/ { print $2 }'
}
ranked "$WORK/chat.share" >"$WORK/chat.list"
ranked "$WORK/other.share" | awk 'FNR == NR { chat[$1] = 1; next } !($1 in chat)' "$WORK/chat.list" - >"$WORK/other.list"
cat "$WORK/chat.list" "$WORK/other.list" >"$LIST"
echo "wrote $LIST: $(wc -l <"$WORK/chat.list") functions of the chat endpoint, then $(wc -l <"$WORK/other.list") of the other dialects'"
