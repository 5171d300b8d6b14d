//! Lays out the release gateway's per-request functions side by side.
//!
//! `hot-functions.txt` (written by `benches/hot-functions.sh`) lists the
//! functions a small completion, a stream and a large request run, by
//! their mangled names. Fat LTO scatters them over the binary's 10 MB of
//! text; handed to the linker as a symbol ordering, they lie together in
//! about half the pages, which a request that finds the caches cold (one
//! connection, a core that slept) touches fewer of. See
//! docs/performance.md, "Hot functions side by side".
//!
//! Only where the linker is known to take the option: release builds for
//! `x86_64-unknown-linux-gnu` with rustc 1.90 or later (whose default
//! linker there is LLD), when neither the flags nor the environment name
//! a linker of their own. `TOWER_LLM_GATEWAY_HOT_LAYOUT=0` turns it off.
//! A name the linker does not find is skipped, so a stale list costs
//! speed, never a build.

use std::env;
use std::path::Path;
use std::process::Command;

const TARGET: &str = "x86_64-unknown-linux-gnu";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=hot-functions.txt");
    println!("cargo:rerun-if-env-changed=TOWER_LLM_GATEWAY_HOT_LAYOUT");
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER");
    let Ok(dir) = env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    let list = Path::new(&dir).join("hot-functions.txt");
    if !applies(&list) {
        return;
    }
    println!(
        "cargo:rustc-link-arg-bin=tower-llm-gateway=-Wl,--symbol-ordering-file={}",
        list.display()
    );
    println!("cargo:rustc-link-arg-bin=tower-llm-gateway=-Wl,--no-warn-symbol-ordering");
}

/// Whether this build's linker takes the ordering (see the crate docs).
fn applies(list: &Path) -> bool {
    let var = |name: &str| env::var(name).unwrap_or_default();
    let turned_off = matches!(
        var("TOWER_LLM_GATEWAY_HOT_LAYOUT").as_str(),
        "0" | "off" | "false" | "no"
    );
    // A path with a comma would be split by the compiler driver's `-Wl,`.
    let usable_path = list.is_file() && !list.to_string_lossy().contains(',');
    let own_linker = env::var_os("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").is_some()
        || var("CARGO_ENCODED_RUSTFLAGS")
            .split('\x1f')
            .any(|flag| flag.contains("linker") || flag.contains("fuse-ld"));
    !turned_off
        && usable_path
        && !own_linker
        && var("PROFILE") == "release"
        && var("TARGET") == TARGET
        && rustc_minor().is_some_and(|minor| minor >= 90)
}

/// The minor version of the compiler building this package (`1.MINOR.x`).
fn rustc_minor() -> Option<u32> {
    let rustc = env::var_os("RUSTC")?;
    let output = Command::new(rustc).arg("-vV").output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let release = text
        .lines()
        .find_map(|line| line.strip_prefix("release: "))?;
    let mut parts = release.split('.');
    (parts.next()? == "1").then_some(())?;
    parts.next()?.parse().ok()
}
