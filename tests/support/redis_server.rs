//! A real `redis-server` for a test: its own free loopback port, its own
//! temporary directory, killed when dropped. A missing binary skips the
//! test loudly, except under `CI=true` (or `CI=1`), where it fails: `.ci/run`
//! installs the Debian packages `redis-server` and `redis-tools`.
//!
//! Also a TLS-only server ([`RedisServer::start_tls`]), a three-node
//! cluster ([`RedisCluster`], made by `redis-cli --cluster create`) and a
//! sentinel watching a primary ([`RedisServer::start_sentinel`]).

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// A configuration file given first (a sentinel's: it rewrites it).
    config: Option<PathBuf>,
    /// Arguments after the common ones.
    extra: Vec<String>,
    /// TLS only: the CA (PEM) the readiness check trusts.
    tls_ca: Option<Vec<u8>>,
}

/// What a test prints, then returns from, when a binary is missing (or
/// panics with, under CI).
fn missing(test: &str, what: &str) {
    if in_ci() {
        panic!(
            "!!!!!!!! FAILED: {test} needs {what}, which is not installed. \
             CI=true, so a missing {what} fails the run; .ci/run installs it"
        );
    }
    eprintln!(
        "!!!!!!!! SKIPPED: {test}: {what} is not installed \
         (apt-get install redis-server redis-tools, or set REDIS_SERVER)"
    );
}

/// `redis-cli`, next to `redis-server` or on PATH.
fn cli() -> Option<PathBuf> {
    if let Some(dir) = binary().and_then(|b| b.parent().map(|d| d.join("redis-cli")))
        && dir.is_file()
    {
        return Some(dir);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("redis-cli"))
            .find(|candidate| candidate.is_file())
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

fn temp_dir(port: u16) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tlf-redis-{}-{port}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
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
        Self::start_with(test, None, Vec::new(), None).await
    }

    /// Starts a replica of `primary` (`--replicaof`); it answers at once
    /// and syncs in the background.
    pub async fn start_replica_of(test: &str, primary: &RedisServer) -> Option<Self> {
        let extra = vec![
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary.port.to_string(),
        ];
        Self::start_with(test, None, extra, None).await
    }

    async fn start_with(
        test: &str,
        config: Option<String>,
        extra: Vec<String>,
        tls_ca: Option<Vec<u8>>,
    ) -> Option<Self> {
        if binary().is_none() {
            missing(test, "redis-server");
            return None;
        }
        // A port free when asked may be taken before the server binds it
        // (tests run in parallel): a server that exits at once is tried
        // again on another port.
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir = temp_dir(port);
            let config = config.as_ref().map(|text| {
                let path = dir.join("server.conf");
                std::fs::write(&path, text.replace("$PORT", &port.to_string())).expect("config");
                path
            });
            let mut server = Self {
                port,
                dir,
                child: None,
                config,
                extra: extra.clone(),
                tls_ca: tls_ca.clone(),
            };
            match server.spawn_and_wait().await {
                Ok(()) => return Some(server),
                Err(Start::Exited(why)) => last = why,
                Err(Start::Silent(why)) => panic!("{why}"),
            }
        }
        panic!("redis-server exited at start five times; the last: {last}");
    }

    /// A server that speaks TLS only (`--port 0`): `cert_pem`/`key_pem` its
    /// certificate, `ca_pem` the CA it names (clients need no certificate).
    pub async fn start_tls(
        test: &str,
        cert_pem: &str,
        key_pem: &str,
        ca_pem: &str,
    ) -> Option<Self> {
        // Written before the port is known: a directory of their own.
        let pki = temp_dir(0);
        let write = |name: &str, text: &str| {
            let path = pki.join(name);
            std::fs::write(&path, text).expect("pem");
            path.to_string_lossy().into_owned()
        };
        let extra = vec![
            "--tls-cert-file".to_owned(),
            write("server.pem", cert_pem),
            "--tls-key-file".to_owned(),
            write("server.key", key_pem),
            "--tls-ca-cert-file".to_owned(),
            write("ca.pem", ca_pem),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ];
        let server = Self::start_with(test, None, extra, Some(ca_pem.as_bytes().to_vec())).await;
        // redis-server read them at start.
        let _ = std::fs::remove_dir_all(&pki);
        server
    }

    /// A sentinel watching `primary` as `service` (quorum 1, a primary
    /// down after 1 s).
    pub async fn start_sentinel(test: &str, primary: &RedisServer, service: &str) -> Option<Self> {
        let config = format!(
            "port $PORT\nbind 127.0.0.1\n\
             sentinel monitor {service} 127.0.0.1 {} 1\n\
             sentinel down-after-milliseconds {service} 1000\n\
             sentinel failover-timeout {service} 5000\n",
            primary.port
        );
        Self::start_with(test, Some(config), vec!["--sentinel".to_owned()], None).await
    }

    pub fn url(&self) -> String {
        if self.tls_ca.is_some() {
            format!("rediss://127.0.0.1:{}", self.port)
        } else {
            format!("redis://127.0.0.1:{}", self.port)
        }
    }

    /// A plain client of this server (trusting its CA when it speaks TLS).
    pub fn client(&self) -> redis::Client {
        match &self.tls_ca {
            Some(ca) => redis::Client::build_with_tls(
                self.url(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                },
            )
            .expect("tls client"),
            None => redis::Client::open(self.url()).expect("url"),
        }
    }

    /// (Re)starts the server on the same port.
    pub async fn restart(&mut self) {
        if let Err(Start::Exited(why) | Start::Silent(why)) = self.spawn_and_wait().await {
            panic!("{why}");
        }
    }

    /// Spawns the server, its output to `server.log` in its directory, and
    /// waits until it answers PING (bounded: 20 s, each try 2 s).
    async fn spawn_and_wait(&mut self) -> Result<(), Start> {
        let mut command = Command::new(binary().expect("redis-server"));
        if let Some(config) = &self.config {
            // A sentinel's port is in its file, which comes first.
            command.arg(config);
        } else if self.tls_ca.is_some() {
            command.args(["--port", "0", "--tls-port", &self.port.to_string()]);
        } else {
            command.args(["--port", &self.port.to_string()]);
        }
        let log_path = self.dir.join("server.log");
        let log = std::fs::File::create(&log_path).expect("server.log");
        let child = command
            .args([
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
            .stdout(log.try_clone().expect("server.log"))
            .stderr(log)
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let log_tail = || {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(8)..].join("\n")
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(Start::Exited(format!(
                    "redis-server on port {} exited ({status}):\n{}",
                    self.port,
                    log_tail()
                )));
            }
            let ping = async {
                let mut c = self.client().get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut c).await
            };
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), ping).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err(Start::Silent(format!(
            "redis-server did not answer PING on port {} within 20 s:\n{}",
            self.port,
            log_tail()
        )))
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
        let mut c = self
            .client()
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

/// Why a server did not come up.
enum Start {
    /// The process ended (a port taken since it was picked, say).
    Exited(String),
    /// It runs but did not answer in time.
    Silent(String),
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three `redis-server --cluster-enabled yes` nodes made one cluster by
/// `redis-cli --cluster create` (no replicas), each in its own directory.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the cluster, or `None` (after a loud message) when
    /// redis-server or redis-cli is missing outside CI.
    pub async fn start(test: &str) -> Option<Self> {
        if cli().is_none() {
            missing(test, "redis-cli");
            return None;
        }
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let extra = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ];
            let node = RedisServer::start_with(
                test,
                None,
                extra.iter().map(|s| (*s).to_owned()).collect(),
                None,
            )
            .await?;
            nodes.push(node);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let create = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::process::Command::new(cli().expect("redis-cli"))
                .args(["--cluster", "create"])
                .args(&addrs)
                .args(["--cluster-replicas", "0", "--cluster-yes"])
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("redis-cli --cluster create within 30 s")
        .expect("redis-cli runs");
        assert!(
            create.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&create.stdout),
            String::from_utf8_lossy(&create.stderr)
        );
        // Ready when every node says cluster_state:ok (bounded: 400 × 25 ms).
        for node in &nodes {
            let mut c = node
                .client()
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            let mut ok = false;
            for _ in 0..400 {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut c)
                    .await
                    .expect("CLUSTER INFO");
                if info.contains("cluster_state:ok") {
                    ok = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            assert!(ok, "node {} did not reach cluster_state:ok", node.port);
        }
        Some(Self { nodes })
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}
