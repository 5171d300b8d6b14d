//! A real `redis-server` for a test: its own free loopback port, its own
//! temporary directory, killed when dropped. A missing binary skips the
//! test loudly, except under `CI=true` (or `CI=1`), where it fails: `.ci/run`
//! installs the Debian package `redis-server`.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// More command-line arguments (a replica's `--replicaof`).
    extra: Vec<String>,
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

fn binary() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("REDIS_SERVER") {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("redis-server"))
            .find(|candidate| candidate.is_file())
    })
}

impl RedisServer {
    /// Starts a server, or `None` (after a loud message) when the binary
    /// is missing outside CI.
    pub async fn start(test: &str) -> Option<Self> {
        Self::start_with(test, Vec::new()).await
    }

    /// Starts a replica of `primary` (`--replicaof`); it answers at once
    /// and syncs in the background.
    pub async fn start_replica_of(test: &str, primary: &RedisServer) -> Option<Self> {
        let extra = vec![
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary.port.to_string(),
        ];
        Self::start_with(test, extra).await
    }

    async fn start_with(test: &str, extra: Vec<String>) -> Option<Self> {
        let Some(_) = binary() else {
            if in_ci() {
                panic!(
                    "!!!!!!!! FAILED: {test} needs redis-server, which is not installed. \
                     CI=true, so a missing redis-server fails the run; .ci/run installs it"
                );
            }
            eprintln!(
                "!!!!!!!! SKIPPED: {test}: redis-server is not installed \
                 (apt-get install redis-server, or set REDIS_SERVER)"
            );
            return None;
        };
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let dir = std::env::temp_dir().join(format!(
            "tlf-redis-{}-{port}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut server = Self {
            port,
            dir,
            child: None,
            extra,
        };
        server.restart().await;
        Some(server)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// (Re)starts the server on the same port.
    pub async fn restart(&mut self) {
        let child = Command::new(binary().expect("redis-server"))
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
            ])
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        // Ready when it answers PING (bounded: 200 × 25 ms).
        for _ in 0..200 {
            if let Ok(client) = redis::Client::open(self.url())
                && let Ok(mut c) = client.get_multiplexed_async_connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("redis-server did not come up on port {}", self.port);
    }

    /// Kills the server (SIGKILL) and waits for it to go.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// How many times Redis ran each command: `INFO commandstats`.
    pub async fn command_calls(&self) -> std::collections::HashMap<String, u64> {
        let client = redis::Client::open(self.url()).expect("url");
        let mut c = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await
            .expect("INFO");
        info.lines()
            .filter_map(|line| {
                let rest = line.strip_prefix("cmdstat_")?;
                let (name, stats) = rest.split_once(':')?;
                let calls = stats.split(',').find_map(|f| f.strip_prefix("calls="))?;
                Some((name.to_owned(), calls.parse().ok()?))
            })
            .collect()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
