//! When the release gateway's build hands its hot functions to the
//! linker (`build.rs`; tested by `tests/hot_layout.rs`).

/// The one target whose default linker (LLD, from rustc 1.90) is known to
/// take `--symbol-ordering-file`.
pub(crate) const TARGET: &str = "x86_64-unknown-linux-gnu";

/// The first rustc whose default linker on [`TARGET`] is LLD.
pub(crate) const FIRST_LLD_MINOR: u32 = 90;

/// Whether the ordering applies, from the build's environment (`var`
/// answers a variable's value, if set), the compiler's minor version
/// (`1.MINOR.x`, if known) and the list's path (`None` if it is missing).
pub(crate) fn applies(
    var: &dyn Fn(&str) -> Option<String>,
    rustc_minor: Option<u32>,
    list: Option<&str>,
) -> bool {
    let turned_off = matches!(
        var("TOWER_LLM_GATEWAY_HOT_LAYOUT").as_deref(),
        Some("0" | "off" | "false" | "no")
    );
    // A path with a comma would be split by the compiler driver's `-Wl,`.
    let usable_list = list.is_some_and(|path| !path.contains(','));
    // A linker of the user's own may not take the option (GNU ld does not).
    let own_linker = var("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").is_some()
        || var("CARGO_ENCODED_RUSTFLAGS").is_some_and(|flags| {
            flags
                .split('\x1f')
                .any(|flag| flag.contains("linker") || flag.contains("fuse-ld"))
        });
    !turned_off
        && usable_list
        && !own_linker
        && var("PROFILE").as_deref() == Some("release")
        && var("TARGET").as_deref() == Some(TARGET)
        && rustc_minor.is_some_and(|minor| minor >= FIRST_LLD_MINOR)
}

/// The minor version in `rustc -vV`'s output (`release: 1.MINOR.PATCH`).
pub(crate) fn rustc_minor(verbose_version: &str) -> Option<u32> {
    let release = verbose_version
        .lines()
        .find_map(|line| line.strip_prefix("release: "))?;
    let mut parts = release.split('.');
    (parts.next()? == "1").then_some(())?;
    parts.next()?.parse().ok()
}
