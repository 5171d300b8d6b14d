//! Lays out the release gateway's per-request functions side by side.
//!
//! `hot-functions.txt` (written by `benches/hot-functions.sh`) lists the
//! functions a small completion, a stream and a large request run (then
//! those of the Messages and Responses clients' translated paths), by
//! their mangled names. Fat LTO scatters them over the binary's 10 MB of
//! text; handed to the linker as a symbol ordering, they lie together in
//! about half the pages, which a request that finds the caches cold (one
//! connection, a core that slept) touches fewer of. See
//! docs/performance.md, "Hot functions side by side".
//!
//! Only where the linker is known to take the option: release builds for
//! `x86_64-unknown-linux-gnu` with rustc 1.90 or later (whose default
//! linker there is LLD), when neither the flags nor the environment name
//! a linker of their own (`build/hot_layout.rs`).
//! `TOWER_LLM_GATEWAY_HOT_LAYOUT=0` turns it off. A name the linker does
//! not find is skipped, so a stale list costs speed, never a build.

use std::env;
use std::path::Path;
use std::process::Command;

#[path = "build/hot_layout.rs"]
mod hot_layout;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build/hot_layout.rs");
    println!("cargo:rerun-if-changed=hot-functions.txt");
    println!("cargo:rerun-if-env-changed=TOWER_LLM_GATEWAY_HOT_LAYOUT");
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER");
    let Ok(dir) = env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    let list = Path::new(&dir).join("hot-functions.txt");
    let list = list.is_file().then(|| list.to_string_lossy().into_owned());
    let var = |name: &str| env::var(name).ok();
    let Some(list) = list.filter(|list| hot_layout::applies(&var, rustc_minor(), Some(list)))
    else {
        return;
    };
    println!("cargo:rustc-link-arg-bin=tower-llm-gateway=-Wl,--symbol-ordering-file={list}");
    println!("cargo:rustc-link-arg-bin=tower-llm-gateway=-Wl,--no-warn-symbol-ordering");
}

/// The minor version of the compiler building this package.
fn rustc_minor() -> Option<u32> {
    let rustc = env::var_os("RUSTC")?;
    let output = Command::new(rustc).arg("-vV").output().ok()?;
    hot_layout::rustc_minor(&String::from_utf8(output.stdout).ok()?)
}
