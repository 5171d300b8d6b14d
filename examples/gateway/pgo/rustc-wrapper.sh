#!/usr/bin/env bash
# cargo's rustc wrapper in this workspace (.cargo/config.toml, build.rustc-wrapper):
# a release build's crates, the dependencies' too, are compiled with the
# gateway's profile (profile-guided optimisation): `gateway.profdata` beside
# this script, written by benches/pgo.sh from the benchmarks' workloads.
#
# With it the release gateway's code is inlined and laid out for the path a
# request takes, and the rest moved aside: at one connection a small
# completion cost 51 µs of CPU instead of 72 (docs/performance.md,
# "Profile-guided optimisation"). Without it the build is the same, slower.
#
# The profile is used for a crate when all of these hold, else rustc runs
# as it was asked:
#   - an optimised build (`-C opt-level=3`: cargo's release profile);
#   - for x86_64 Linux (the host, and no other `--target`), where it was made;
#   - rustc's LLVM is 22 or newer (the profile's format; older cannot read it);
#   - the build is not making or using a profile of its own
#     (`-C profile-generate` / `-C profile-use` among the flags: benches/pgo.sh);
#   - TOWER_LLM_GATEWAY_PGO is not `0`.
# cargo does not see what a wrapper adds: a build with and one without the
# profile need target dirs of their own (`--target-dir`), or one reuses the
# other's crates.
#
# bash, not sh: cargo hands rustc variables whose names are not a shell's
# (`CARGO_BIN_EXE_tower-llm-gateway`), which dash leaves out of the
# environment of what it runs.
#
# $1 is rustc (or a wrapper cargo chains before it); the rest, its arguments.
rustc=$1
shift
profile=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)/gateway.profdata

use_profile() {
    [ "${TOWER_LLM_GATEWAY_PGO:-1}" != 0 ] || return 1
    optimised=0
    target=
    previous=
    for arg in "$@"; do
        case $previous in
            -C) [ "$arg" = opt-level=3 ] && optimised=1 ;;
            --target) target=$arg ;;
        esac
        case $arg in
            *profile-generate* | *profile-use*) return 1 ;;
            -Copt-level=3) optimised=1 ;;
            --target=*) target=${arg#--target=} ;;
        esac
        previous=$arg
    done
    [ "$optimised" = 1 ] || return 1
    case $target in
        '' | x86_64-unknown-linux-gnu) ;;
        *) return 1 ;;
    esac
    [ -f "$profile" ] || return 1
    [ "$(uname -s -m)" = "Linux x86_64" ] || return 1
    llvm=$("$rustc" -vV 2>/dev/null | sed -n 's/^LLVM version: \([0-9][0-9]*\).*/\1/p')
    [ "${llvm:-0}" -ge 22 ] || return 1
}

if use_profile "$@"; then
    exec "$rustc" "$@" "-Cprofile-use=$profile"
fi
exec "$rustc" "$@"
