//! The gateway's own binary in a process of its own, for tests that need
//! what only `main` does (its log writer, a second replica).
#![allow(dead_code)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A gateway process, killed when dropped.
pub(crate) struct GatewayProcess {
    pub(crate) child: Child,
    pub(crate) addr: std::net::SocketAddr,
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The package's `tower-llm-gateway` binary, which cargo builds before
/// the integration tests; `None` (said loudly) when it is missing, which
/// fails under `CI=true`.
pub(crate) fn gateway_binary() -> Option<PathBuf> {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_tower-llm-gateway"));
    if binary.is_file() {
        return Some(binary);
    }
    let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    assert!(
        !ci,
        "the gateway binary is not built; CI=true, so this test cannot skip"
    );
    eprintln!("!!!!!!!! SKIPPED: the gateway binary is not built (run the whole `cargo test`)");
    None
}

/// Starts `binary` on `config`, listening on a free loopback port, with
/// `env` (and no inherited `RUST_LOG`), its stderr to `stderr`; returns
/// once it says where it listens.
pub(crate) fn spawn_gateway(
    binary: &Path,
    config: &Path,
    env: &[(&str, &str)],
    stderr: Stdio,
) -> GatewayProcess {
    let mut child = Command::new(binary)
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("the gateway starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let addr = lines
        .by_ref()
        .take(50)
        .map_while(Result::ok)
        .find_map(|line| {
            line.strip_prefix("gateway ready on http://")
                .and_then(|a| a.trim().parse().ok())
        })
        .expect("the gateway says where it listens");
    // Keep reading so the pipe never fills.
    std::thread::spawn(move || lines.for_each(drop));
    GatewayProcess { child, addr }
}
