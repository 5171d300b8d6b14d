use std::sync::Arc;

use tower_layer::Layer;

use super::health::MemoryHealthStore;
use super::service::{Failover, FailoverBuilder};
use super::target::Target;

/// Makes the wrapped service the primary target of a [`Failover`], with the
/// backups and settings of a [`FailoverBuilder`].
///
/// ```
/// # use bytes::Bytes;
/// # use http::Request;
/// # use http_body_util::Full;
/// use tower::ServiceBuilder;
/// use tower_llm_failover::failover::{FailoverBuilder, FailoverLayer, Target};
/// use tower_llm_failover::testing::json_response;
///
/// let upstream = || tower::service_fn(|_req: Request<Full<Bytes>>| async {
///     Ok::<_, std::convert::Infallible>(json_response(503, "{}"))
/// });
/// let backups = FailoverBuilder::new().target(Target::new("backup", upstream()));
/// let service = ServiceBuilder::new()
///     .layer(FailoverLayer::new(Target::new("primary", ()), backups))
///     .service(upstream());
/// # let _ = service;
/// ```
#[derive(Debug, Clone)]
pub struct FailoverLayer<S> {
    primary: Target<()>,
    builder: FailoverBuilder<S>,
}

impl<S> FailoverLayer<S> {
    /// `primary` describes the wrapped service (its name, model,
    /// capabilities and price; its service is a placeholder); `builder`
    /// holds the backups (tried after it) and the settings.
    /// Without a health store in `builder`, one is made here, so every
    /// service this layer makes shares one health state.
    pub fn new(primary: Target<()>, builder: FailoverBuilder<S>) -> Self {
        let builder = if builder.has_health() {
            builder
        } else {
            let store = Arc::new(MemoryHealthStore::new(builder.cooldown_policy().clone()));
            builder.health(store)
        };
        Self { primary, builder }
    }
}

impl<S: Clone> Layer<S> for FailoverLayer<S> {
    type Service = Failover<S>;

    fn layer(&self, inner: S) -> Self::Service {
        let p = &self.primary;
        let primary = Target {
            name: Arc::clone(&p.name),
            provider: Arc::clone(&p.provider),
            model: p.model.clone(),
            capabilities: p.capabilities.clone(),
            pricing: p.pricing,
            service: inner,
        };
        self.builder.clone().with_primary(primary).build()
    }
}
