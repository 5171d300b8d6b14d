use http::HeaderName;
use tower_layer::Layer;

use super::keys::ApiKeys;
use super::service::Identity;
use crate::dialect::DefaultDialect;

/// Names the client of each request: checks its key against an
/// [`ApiKeys`] table and puts the [`ClientId`](super::ClientId) in the
/// request extensions, or answers `401` in the dialect's error shape. The
/// anonymous client is put as no entry (and one already there is taken
/// out): [`ClientId::of`](super::ClientId::of) reads a request without one
/// as anonymous.
///
/// - The key is read from `Authorization: Bearer <key>` or `x-api-key:
///   <key>` (what the OpenAI and Anthropic SDKs send).
/// - With an empty table no key is needed: every request is the anonymous
///   client (unless a trusted tenant header names its tenant).
/// - With keys configured, both credential headers are removed from the
///   request: a client's key is the gateway's, never the provider's.
/// - A tenant header is read only when the operator trusts it
///   ([`trust_tenant_header`](Self::trust_tenant_header), for a gateway
///   behind an authenticating proxy); otherwise the key's tenant stands and
///   a client's header cannot spend against another tenant's ceiling.
#[derive(Debug, Clone)]
pub struct IdentityLayer<D = DefaultDialect> {
    pub(crate) keys: ApiKeys,
    pub(crate) tenant_header: Option<HeaderName>,
    pub(crate) dialect: D,
}

impl IdentityLayer {
    /// Checks keys against `keys`; refusals speak the default dialect.
    pub fn new(keys: ApiKeys) -> Self {
        Self {
            keys,
            tenant_header: None,
            dialect: DefaultDialect::default(),
        }
    }
}

impl<D> IdentityLayer<D> {
    /// Refusals in another dialect's error shape.
    pub fn dialect<D2>(self, dialect: D2) -> IdentityLayer<D2> {
        IdentityLayer {
            keys: self.keys,
            tenant_header: self.tenant_header,
            dialect,
        }
    }

    /// Takes the tenant from this request header when present (at most
    /// 128 bytes): only for
    /// a gateway whose every request comes through a proxy that sets it.
    pub fn trust_tenant_header(mut self, header: HeaderName) -> Self {
        self.tenant_header = Some(header);
        self
    }
}

impl<S, D: Clone> Layer<S> for IdentityLayer<D> {
    type Service = Identity<S, D>;

    fn layer(&self, inner: S) -> Self::Service {
        Identity {
            inner,
            layer: self.clone(),
        }
    }
}
