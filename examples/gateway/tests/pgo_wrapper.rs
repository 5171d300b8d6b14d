//! When the workspace's rustc wrapper (`pgo/rustc-wrapper.sh`, set in
//! `.cargo/config.toml`) compiles a crate with the gateway's profile: only
//! an optimised build for x86_64 Linux, with an LLVM that reads the
//! profile, not making or using a profile of its own, not turned off; and
//! every argument reaches rustc as it was given.
//!
//! The wrapper runs here in front of a stand-in rustc that prints its
//! arguments, one per line, then the `CARGO_BIN_EXE_*` variables it got,
//! and answers `-vV` with the LLVM version in `FAKE_LLVM`.
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::path::{Path, PathBuf};
use std::process::Command;

fn package_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn wrapper() -> PathBuf {
    package_dir().join("pgo").join("rustc-wrapper.sh")
}

fn profile() -> PathBuf {
    package_dir().join("pgo").join("gateway.profdata")
}

/// A stand-in rustc in a directory of its own (removed when dropped).
struct FakeRustc {
    dir: PathBuf,
}

impl FakeRustc {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("pgo-wrapper-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let rustc = dir.join("rustc");
        std::fs::write(
            &rustc,
            "#!/bin/sh\n\
             if [ \"$1\" = -vV ]; then\n\
               [ \"$FAKE_LLVM\" = fail ] && exit 1\n\
               printf 'rustc 1.95.0\\nhost: x86_64-unknown-linux-gnu\\nLLVM version: %s\\n' \"$FAKE_LLVM\"\n\
               exit 0\n\
             fi\n\
             for arg in \"$@\"; do printf '%s\\n' \"$arg\"; done\n\
             tr '\\0' '\\n' < /proc/$$/environ | grep '^CARGO_BIN_EXE_' || true\n",
        )
        .expect("fake rustc");
        let status = Command::new("chmod")
            .arg("+x")
            .arg(&rustc)
            .status()
            .expect("chmod");
        assert!(status.success());
        Self { dir }
    }

    /// The arguments rustc got when the wrapper ran with `args`, under
    /// `env`.
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Vec<String> {
        // Run as cargo runs it: by its own `#!` line.
        let mut command = Command::new(wrapper());
        command
            .arg(self.dir.join("rustc"))
            .args(args)
            .env("FAKE_LLVM", "22.1.2")
            .env_remove("TOWER_LLM_GATEWAY_PGO");
        // cargo runs this test with its own `CARGO_BIN_EXE_*` set.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("CARGO_BIN_EXE_") {
                command.env_remove(name);
            }
        }
        for (name, value) in env {
            command.env(name, value);
        }
        let output = command.output().expect("run the wrapper");
        assert!(
            output.status.success(),
            "wrapper failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout)
            .expect("utf-8")
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for FakeRustc {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The flag the wrapper adds: the committed profile, by absolute path (a
/// dependency's rustc runs in that dependency's own directory).
fn profile_flag() -> String {
    let profile = profile().canonicalize().expect("the profile is committed");
    format!("-Cprofile-use={}", profile.display())
}

const RELEASE: &[&str] = &[
    "--crate-name",
    "tokio",
    "--edition=2021",
    "src/lib.rs",
    "-C",
    "opt-level=3",
    "-C",
    "embed-bitcode=no",
];

/// A case: its name, rustc's arguments, and the environment over them.
type Case = (
    &'static str,
    Vec<String>,
    &'static [(&'static str, &'static str)],
);

fn with(args: &[&str], extra: &[&str]) -> Vec<String> {
    args.iter().chain(extra).map(|a| (*a).to_owned()).collect()
}

#[test]
fn the_committed_profile_is_llvm_s_indexed_format() {
    let bytes = std::fs::read(profile()).expect("the profile is committed");
    // `\xfflprofi\x81`, little-endian: what rustc's `-C profile-use` reads.
    assert_eq!(
        bytes.get(..8),
        Some(&[0xff, 0x6c, 0x70, 0x72, 0x6f, 0x66, 0x69, 0x81][..])
    );
}

#[test]
fn an_optimised_build_for_x86_64_linux_uses_the_profile() {
    let rustc = FakeRustc::new("release");
    let mut expected = with(RELEASE, &[]);
    expected.push(profile_flag());
    assert_eq!(rustc.run(RELEASE, &[]), expected);

    let joined = ["--crate-name", "hyper", "-Copt-level=3"];
    let mut expected = with(&joined, &[]);
    expected.push(profile_flag());
    assert_eq!(rustc.run(&joined, &[]), expected);

    // The host's own target named, and a newer LLVM.
    let named = with(RELEASE, &["--target", "x86_64-unknown-linux-gnu"]);
    let named: Vec<&str> = named.iter().map(String::as_str).collect();
    let mut expected = with(&named, &[]);
    expected.push(profile_flag());
    assert_eq!(rustc.run(&named, &[("FAKE_LLVM", "23.0.0")]), expected);
}

#[test]
fn any_other_build_goes_to_rustc_as_it_was_asked() {
    let rustc = FakeRustc::new("other");
    let cases: [Case; 10] = [
        (
            "debug",
            with(&["--crate-name", "tokio", "-C", "debuginfo=2"], &[]),
            &[],
        ),
        (
            "opt-level 2",
            with(&["--crate-name", "tokio", "-C", "opt-level=2"], &[]),
            &[],
        ),
        (
            "opt-level s",
            with(&["--crate-name", "tokio", "-Copt-level=s"], &[]),
            &[],
        ),
        (
            "turned off",
            with(RELEASE, &[]),
            &[("TOWER_LLM_GATEWAY_PGO", "0")],
        ),
        (
            "making a profile (benches/pgo.sh)",
            with(RELEASE, &["-Cprofile-generate=/tmp/raw"]),
            &[],
        ),
        (
            "using a profile of its own",
            with(RELEASE, &["-C", "profile-use=/tmp/own.profdata"]),
            &[],
        ),
        (
            "another target",
            with(RELEASE, &["--target", "aarch64-unknown-linux-gnu"]),
            &[],
        ),
        (
            "another target, joined",
            with(RELEASE, &["--target=x86_64-apple-darwin"]),
            &[],
        ),
        (
            "an older LLVM",
            with(RELEASE, &[]),
            &[("FAKE_LLVM", "21.1.0")],
        ),
        (
            "a rustc that gives no version",
            with(RELEASE, &[]),
            &[("FAKE_LLVM", "fail")],
        ),
    ];
    for (case, args, env) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(rustc.run(&args, env), with(&args, &[]), "{case}");
    }
}

#[test]
fn arguments_reach_rustc_whole() {
    let rustc = FakeRustc::new("whole");
    let args = [
        "--crate-name",
        "x",
        "--cfg",
        "feature=\"a b\"",
        "-L",
        "dependency=/a dir/with spaces",
        "-",
    ];
    assert_eq!(rustc.run(&args, &[]), with(&args, &[]));
    // A variable whose name is not a shell's, as cargo sets for a test
    // (`env!("CARGO_BIN_EXE_tower-llm-gateway")`), reaches rustc.
    let got = rustc.run(&args, &[("CARGO_BIN_EXE_tower-llm-gateway", "/bin/gw")]);
    assert_eq!(
        got,
        with(&args, &["CARGO_BIN_EXE_tower-llm-gateway=/bin/gw"])
    );
    // `-vV`, which cargo asks through the wrapper, answers as rustc does.
    let version = rustc.run(&["-vV"], &[]);
    assert!(
        version.iter().any(|l| l == "LLVM version: 22.1.2"),
        "{version:?}"
    );
}
