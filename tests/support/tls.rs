//! Test PKI (rcgen: a CA, server and client certificates written as PEM
//! files in a scratch directory) and a small HTTP CONNECT proxy, all on
//! loopback. Shared by the TLS tests through `#[path]`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A scratch directory removed on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tower-llm-failover-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A test certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate and its key.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A certificate for `names` (IP addresses become IP SANs).
    pub fn leaf(&self, names: &[&str], client: bool) -> Leaf {
        let names: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, if client { "client" } else { "server" });
        params.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }
}

impl Leaf {
    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }

    /// Writes `NAME.pem` and `NAME.key` into `dir`.
    pub fn write(&self, dir: &Scratch, name: &str) -> (PathBuf, PathBuf) {
        (
            dir.write(&format!("{name}.pem"), &self.cert_pem),
            dir.write(&format!("{name}.key"), &self.key_pem),
        )
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server config presenting `leaf`; when `client_ca` is set, a client
/// certificate signed by it is required. `alpn` empty: the fake's default
/// (h2 and http/1.1).
pub fn server_config(
    leaf: &Leaf,
    client_ca: Option<&Ca>,
    alpn: &[&[u8]],
) -> Arc<rustls::ServerConfig> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            roots.add(ca.der()).unwrap();
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(vec![leaf.der.clone()], leaf.key())
        .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// How the test proxy answers a CONNECT.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ProxyMode {
    /// 200, then relays bytes both ways.
    Tunnel,
    /// 403 Forbidden.
    Refuse,
    /// 407 Proxy Authentication Required.
    AuthRequired,
}

/// An HTTP CONNECT proxy on 127.0.0.1 that records what it saw.
pub struct Proxy {
    pub addr: std::net::SocketAddr,
    /// The CONNECT targets seen, in order.
    pub connects: Arc<Mutex<Vec<String>>>,
    /// The `Proxy-Authorization` values seen.
    pub auth: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(mode: ProxyMode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connects = Arc::new(Mutex::new(Vec::new()));
        let auth = Arc::new(Mutex::new(Vec::new()));
        let (seen, seen_auth) = (Arc::clone(&connects), Arc::clone(&auth));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (seen, seen_auth) = (Arc::clone(&seen), Arc::clone(&seen_auth));
                tokio::spawn(relay(client, mode, seen, seen_auth));
            }
        });
        Self {
            addr,
            connects,
            auth,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn connect_count(&self) -> usize {
        self.connects.lock().unwrap().len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(
    mut client: TcpStream,
    mode: ProxyMode,
    seen: Arc<Mutex<Vec<String>>>,
    seen_auth: Arc<Mutex<Vec<String>>>,
) {
    // Read the CONNECT head (small; the client sends nothing else first).
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 16 * 1024 {
            return;
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    if parts.next() != Some("CONNECT") {
        let _ = client
            .write_all(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            .await;
        return;
    }
    let target = parts.next().unwrap_or_default().to_owned();
    for line in lines {
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("proxy-authorization")
        {
            seen_auth.lock().unwrap().push(value.trim().to_owned());
        }
    }
    seen.lock().unwrap().push(target.clone());
    match mode {
        ProxyMode::Refuse => {
            let _ = client
                .write_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
        ProxyMode::AuthRequired => {
            let _ = client
                .write_all(
                    b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n",
                )
                .await;
        }
        ProxyMode::Tunnel => {
            let Ok(mut upstream) = TcpStream::connect(&target).await else {
                let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
                return;
            };
            if client
                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await
                .is_err()
            {
                return;
            }
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        }
    }
}

/// A path's text, for TOML.
pub fn toml_path(path: &Path) -> String {
    path.display().to_string().replace('\\', "\\\\")
}
