#!/usr/bin/env bash
# Memory per idle, committed stream, as users measure it: the gateway, the
# slow upstream and the clients in three processes
# (examples/gateway/tests/idle_streams.rs).
#
#   benches/idle_streams.sh [STREAMS]     # default 1000
#
# The bare pass-through (examples/gateway/fixtures/passthrough.rs) holds
# the same streams first, in its own process: the target is its figure plus
# at most 4 KiB.
#
# Each stream costs the gateway two sockets and the clients and upstream
# one each; the gateway needs about 2 x STREAMS descriptors. The script
# raises the soft fd limit as far as the hard limit allows and lowers
# STREAMS to fit when the hard limit is too low.
set -euo pipefail
cd "$(dirname "$0")/.."
want=${1:-1000}
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ]; then
  ulimit -n "$hard"
  fit=$(( (hard - 200) / 2 - 100 ))
  if [ "$want" -gt "$fit" ]; then
    echo "!!! the fd hard limit is $hard: measuring $fit streams instead of $want" >&2
    want=$fit
  fi
else
  ulimit -n 65536
fi
cargo build --release -p tower-llm-gateway --example passthrough
IDLE_STREAMS=$want cargo test --release -p tower-llm-gateway --test idle_streams \
  -- memory_per_idle_committed_stream --exact --nocapture
