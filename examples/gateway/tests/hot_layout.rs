//! When the release build hands the hot functions to the linker
//! (`build.rs`): only where the linker is known to take the option.

#[path = "../build/hot_layout.rs"]
mod hot_layout;

use hot_layout::{FIRST_LLD_MINOR, TARGET, applies, rustc_minor};

const LIST: Option<&str> = Some("/src/examples/gateway/hot-functions.txt");

/// A build's environment: a variable's value, if set.
type Env = Box<dyn Fn(&str) -> Option<String>>;

/// A release build for the target, with these variables over it.
fn release_with(extra: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let mut vars = vec![("PROFILE", "release"), ("TARGET", TARGET)];
    vars.extend_from_slice(extra);
    let vars: Vec<(String, String)> = vars
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    move |name: &str| {
        vars.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

#[test]
fn a_release_build_for_the_target_with_a_new_enough_compiler_applies() {
    assert!(applies(&release_with(&[]), Some(FIRST_LLD_MINOR), LIST));
    assert!(applies(&release_with(&[]), Some(95), LIST));
}

#[test]
fn any_other_build_does_not() {
    let cases: [(&str, Env, Option<u32>, Option<&str>); 9] = [
        (
            "debug",
            Box::new(release_with(&[("PROFILE", "debug")])),
            Some(95),
            LIST,
        ),
        (
            "another target",
            Box::new(release_with(&[("TARGET", "aarch64-unknown-linux-gnu")])),
            Some(95),
            LIST,
        ),
        (
            "a compiler before LLD",
            Box::new(release_with(&[])),
            Some(FIRST_LLD_MINOR - 1),
            LIST,
        ),
        (
            "an unknown compiler",
            Box::new(release_with(&[])),
            None,
            LIST,
        ),
        (
            "turned off",
            Box::new(release_with(&[("TOWER_LLM_GATEWAY_HOT_LAYOUT", "0")])),
            Some(95),
            LIST,
        ),
        (
            "a linker named in the environment",
            Box::new(release_with(&[(
                "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER",
                "clang",
            )])),
            Some(95),
            LIST,
        ),
        (
            "a linker named in the flags",
            Box::new(release_with(&[(
                "CARGO_ENCODED_RUSTFLAGS",
                "-C\x1flinker=clang",
            )])),
            Some(95),
            LIST,
        ),
        (
            "a linker chosen by the driver",
            Box::new(release_with(&[(
                "CARGO_ENCODED_RUSTFLAGS",
                "-Clink-arg=-fuse-ld=bfd",
            )])),
            Some(95),
            LIST,
        ),
        ("no list", Box::new(release_with(&[])), Some(95), None),
    ];
    for (case, var, minor, list) in cases {
        assert!(!applies(&*var, minor, list), "{case}");
    }
    assert!(!applies(
        &release_with(&[]),
        Some(95),
        Some("/a,b/hot-functions.txt")
    ));
    // Other flags and a value that does not turn it off leave it on.
    let other = release_with(&[
        ("CARGO_ENCODED_RUSTFLAGS", "-C\x1ftarget-cpu=native"),
        ("TOWER_LLM_GATEWAY_HOT_LAYOUT", "1"),
    ]);
    assert!(applies(&other, Some(95), LIST));
}

#[test]
fn the_minor_version_is_read_from_rustc_verbose_version() {
    let text = "rustc 1.95.0 (59807616e 2026-04-14)\nbinary: rustc\nrelease: 1.95.0\nLLVM version: 22.1.2\n";
    assert_eq!(rustc_minor(text), Some(95));
    assert_eq!(rustc_minor("release: 1.90.0-nightly\n"), Some(90));
    assert_eq!(rustc_minor("release: 2.0.0\n"), None);
    assert_eq!(rustc_minor("rustc 1.95.0\n"), None);
}
