//! The table of client keys: who presented which key, found in constant
//! time.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::ClientId;

/// A client key table: each key's operator-given name, tenant and the
/// SHA-256 of its secret. The secrets themselves are not kept.
///
/// A lookup hashes the presented key and compares it with **every**
/// entry in constant time, so neither the answer's timing nor an early
/// exit tells a prober how much of a key was right, or which entry it
/// came close to. `Debug` shows names only.
#[derive(Clone, Default)]
pub struct ApiKeys {
    entries: Arc<Vec<Entry>>,
}

#[derive(Clone)]
struct Entry {
    client: ClientId,
    digest: [u8; 32],
}

/// A key's digest that is not 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key `{name}`: a SHA-256 digest is 64 hex digits")]
pub struct BadDigest {
    /// The key's name.
    pub name: String,
}

impl ApiKeys {
    /// An empty table: every request is the anonymous client.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the key `secret`, presented by the client `client`.
    pub fn key(mut self, client: ClientId, secret: &str) -> Self {
        let digest = Sha256::digest(secret.as_bytes()).into();
        Arc::make_mut(&mut self.entries).push(Entry { client, digest });
        self
    }

    /// Adds a key known only by the SHA-256 of its secret, as 64 hex
    /// digits (so the gateway's configuration need not hold the secret).
    pub fn key_sha256(mut self, client: ClientId, hex: &str) -> Result<Self, BadDigest> {
        let bad = || BadDigest {
            name: client.label().to_owned(),
        };
        let hex = hex.trim().as_bytes();
        if hex.len() != 64 {
            return Err(bad());
        }
        let mut digest = [0u8; 32];
        for (byte, pair) in digest.iter_mut().zip(hex.chunks_exact(2)) {
            let high = hex_value(pair[0]).ok_or_else(bad)?;
            let low = hex_value(pair[1]).ok_or_else(bad)?;
            *byte = high << 4 | low;
        }
        Arc::make_mut(&mut self.entries).push(Entry {
            client: client.clone(),
            digest,
        });
        Ok(self)
    }

    /// Whether no key is configured (then no request needs one).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The client whose key `presented` is, if any.
    pub fn find(&self, presented: &[u8]) -> Option<ClientId> {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        let mut found: Option<&Entry> = None;
        // No early exit: every entry is compared, whatever matched.
        for entry in self.entries.iter() {
            if bool::from(entry.digest.ct_eq(&digest)) && found.is_none() {
                found = Some(entry);
            }
        }
        found.map(|e| e.client.clone())
    }
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| e.client.label().to_owned()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_found_by_its_secret_or_its_digest_and_nothing_else() {
        // sha256("sk-b")
        let digest = "d61e1a3d4a7fa6e8a1c7b4ed3b4f3b70b2e5b0f1b0e9b7ad5f4a16e4b0f3c2a1";
        let keys = ApiKeys::new().key(ClientId::key("a"), "sk-a");
        assert_eq!(
            keys.find(b"sk-a").map(|c| c.label().to_owned()),
            Some("a".into())
        );
        assert_eq!(keys.find(b"sk-a "), None);
        assert_eq!(keys.find(b""), None);
        let real: [u8; 32] = Sha256::digest(b"sk-b").into();
        let hex: String = real.iter().map(|b| format!("{b:02x}")).collect();
        let keys = keys
            .key_sha256(ClientId::key("b").with_tenant("acme"), &hex.to_uppercase())
            .unwrap();
        let b = keys.find(b"sk-b").unwrap();
        assert_eq!((b.key_name(), b.tenant()), (Some("b"), Some("acme")));
        assert!(
            keys.clone()
                .key_sha256(ClientId::key("c"), &digest[..63])
                .is_err()
        );
        assert!(
            keys.key_sha256(ClientId::key("c"), &"g".repeat(64))
                .is_err()
        );
    }

    #[test]
    fn debug_names_the_keys_and_never_their_secrets() {
        let keys = ApiKeys::new().key(ClientId::key("ci"), "sk-secret-123");
        let shown = format!("{keys:?}");
        assert!(shown.contains("ci") && !shown.contains("secret"), "{shown}");
    }
}
