//! The official SDKs the end-to-end tests drive: where `.ci/run` installs
//! them (under the workspace's `target/sdk/`), and what a test does when
//! one is missing (fail under CI, skip loudly otherwise).

use std::path::PathBuf;
use std::process::Stdio;

/// An SDK client: the program and the script it runs.
pub(crate) struct Sdk {
    /// `python` or `node`, for messages.
    pub(crate) name: &'static str,
    /// The interpreter.
    pub(crate) program: PathBuf,
    /// The client script under `tests/sdk/`.
    pub(crate) script: PathBuf,
    /// Where node finds the package, for the npm SDKs.
    pub(crate) node_path: Option<PathBuf>,
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The workspace root (this package is `examples/gateway/` in it), whose
/// `target/sdk/` is where `.ci/run` installs the SDKs.
fn workspace_root() -> PathBuf {
    manifest_dir()
        .ancestors()
        .nth(2)
        .expect("examples/gateway sits two levels below the workspace root")
        .to_path_buf()
}

/// Whether this is a CI run (`CI=true`, or `CI=1`), where every test must
/// run: `.ci/run` decides the same way.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// An SDK is not there: under CI the test fails, locally it skips loudly.
fn missing(what: &str, why: &str) {
    if in_ci() {
        panic!(
            "!!!!!!!! FAILED: {what} cannot run: {why}. CI=true, so a missing SDK \
             fails the run instead of skipping; .ci/run installs it under target/sdk/"
        );
    }
    eprintln!();
    eprintln!("!!!!!!!! SKIPPED: {what}: {why}");
    eprintln!("!!!!!!!! run .ci/run (or install it under target/sdk/) to run this test");
    eprintln!();
}

async fn works(program: &PathBuf, args: &[&str], node_path: Option<&PathBuf>) -> bool {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(path) = node_path {
        command.env("NODE_PATH", path);
    }
    matches!(command.status().await, Ok(status) if status.success())
}

/// The Python SDK `module`, from the interpreter `env_var` names (default:
/// the venv `.ci/run` makes), running `tests/sdk/{script}`.
pub(crate) async fn python(env_var: &str, module: &str, script: &str) -> Option<Sdk> {
    let program = std::env::var_os(env_var)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/sdk/venv/bin/python"));
    if !works(&program, &["-c", &format!("import {module}")], None).await {
        missing(
            &format!("the official Python {module} SDK tests"),
            &format!("{} cannot import {module}", program.display()),
        );
        return None;
    }
    Some(Sdk {
        name: "python",
        program,
        script: manifest_dir().join("tests/sdk").join(script),
        node_path: None,
    })
}

/// The npm SDK `package`, from the `node_modules` `env_var` names (default:
/// the one `.ci/run` fills), running `tests/sdk/{script}`.
pub(crate) async fn node(env_var: &str, package: &str, script: &str) -> Option<Sdk> {
    let node_path = std::env::var_os(env_var)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/sdk/node/node_modules"));
    let program = PathBuf::from("node");
    let require = format!("require('{package}')");
    if !works(&program, &["-e", &require], Some(&node_path)).await {
        missing(
            &format!("the official npm {package} SDK tests"),
            &format!("node cannot require {package} from {}", node_path.display()),
        );
        return None;
    }
    Some(Sdk {
        name: "node",
        program,
        script: manifest_dir().join("tests/sdk").join(script),
        node_path: Some(node_path),
    })
}

/// Runs `sdk`'s client script once against `base_url` (60 s at most) and
/// reads the one JSON line it prints.
#[allow(dead_code)] // not every test file that drives an SDK reads a JSON line
pub(crate) async fn run_json(sdk: &Sdk, base_url: &str, args: &[&str]) -> serde_json::Value {
    let mut command = tokio::process::Command::new(&sdk.program);
    command
        .arg(&sdk.script)
        .arg(base_url)
        .args(args)
        .kill_on_drop(true);
    if let Some(path) = &sdk.node_path {
        command.env("NODE_PATH", path);
    }
    let output = tokio::time::timeout(std::time::Duration::from_secs(60), command.output())
        .await
        .expect("the SDK client finishes in time")
        .expect("the SDK client starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{} client failed on {args:?}: {stdout}\n{}",
        sdk.name,
        String::from_utf8_lossy(&output.stderr)
    );
    let result: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{} {args:?}: not one JSON line ({e}): {stdout}", sdk.name));
    eprintln!("{} {args:?}: {result}", sdk.name);
    result
}
