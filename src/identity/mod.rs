//! Who is asking: the client identity every shared count is kept per.
//!
//! An identity layer in front (the gateway's key check, or an
//! application's own authentication) puts a [`ClientId`] in the request
//! extensions. Everything shared reads it: the retry budget keeps a share
//! per client, spend is charged to the client's tenant, health counts a
//! request-shaped failure once per client, and records name the client.
//! A request without one is the anonymous client, so a stack that adds no
//! identity behaves as a stack with one client.

mod future;
mod keys;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use keys::{ApiKeys, BadDigest};
pub use layer::IdentityLayer;
pub use service::Identity;

use std::fmt;
use std::sync::Arc;

/// The longest tenant name accepted, in bytes: a longer one names no
/// tenant (it would be a key in the spend store).
pub(crate) const MAX_TENANT_LEN: usize = 128;

/// A client of the gateway: the name of the key it presented and its
/// tenant (who pays). Cheap to clone.
///
/// The key's secret is never part of it: only the operator's name for the
/// key, which is safe to log and to use as a label.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct ClientId {
    key: Option<Arc<str>>,
    tenant: Option<Arc<str>>,
}

impl ClientId {
    /// The client that presented the key named `key`; its tenant is the
    /// key's name until [`tenant`](Self::with_tenant) says otherwise.
    pub fn key(key: impl Into<Arc<str>>) -> Self {
        Self {
            key: Some(key.into()),
            tenant: None,
        }
    }

    /// A request that presented no key.
    pub fn anonymous() -> Self {
        Self::default()
    }

    /// Whether this is the anonymous client: no key and no tenant.
    pub(crate) fn is_anonymous(&self) -> bool {
        self.key.is_none() && self.tenant.is_none()
    }

    /// With the tenant that pays for this client's turns.
    pub fn with_tenant(mut self, tenant: impl Into<Arc<str>>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// The key's name, or `None` for the anonymous client.
    pub fn key_name(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The tenant: the one set, else the key's name; `None` for an
    /// anonymous client without a tenant.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref().or(self.key.as_deref())
    }

    /// The client a request's extensions name, or the anonymous one.
    pub fn of(extensions: &http::Extensions) -> Self {
        extensions.get::<Self>().cloned().unwrap_or_default()
    }

    /// The witness a failure is counted under when health counts a failure
    /// once per client: the key's name; `None` for an anonymous request,
    /// which counts as a client of its own each time (so a gateway without
    /// keys counts every failure, as before keys existed).
    pub fn witness(&self) -> Option<Arc<str>> {
        self.key.clone()
    }

    /// A label value for logs and metrics: the key's name or `anonymous`.
    pub fn label(&self) -> &str {
        self.key.as_deref().unwrap_or("anonymous")
    }
}

impl fmt::Debug for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientId")
            .field("key", &self.label())
            .field("tenant", &self.tenant())
            .finish()
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_its_own_tenant_until_told_otherwise() {
        let a = ClientId::key("team-a");
        assert_eq!((a.key_name(), a.tenant()), (Some("team-a"), Some("team-a")));
        let b = ClientId::key("ci").with_tenant("acme");
        assert_eq!(b.tenant(), Some("acme"));
        assert!(b.key_name().is_some());
        let anon = ClientId::anonymous();
        assert!(anon.key_name().is_none());
        assert_eq!(
            (anon.tenant(), anon.label(), anon.witness()),
            (None, "anonymous", None)
        );
    }

    #[test]
    fn extensions_without_an_identity_name_the_anonymous_client() {
        let mut ext = http::Extensions::new();
        assert_eq!(ClientId::of(&ext), ClientId::anonymous());
        ext.insert(ClientId::key("k"));
        assert_eq!(ClientId::of(&ext).key_name(), Some("k"));
    }
}
