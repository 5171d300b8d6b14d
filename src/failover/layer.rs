use std::sync::Arc;

use tower_layer::Layer;

use super::service::{Failover, FailoverBuilder};
use super::target::Target;
use crate::dialect::{DefaultDialect, Dialect};
use crate::health::MemoryHealthStore;

/// Makes the wrapped service the primary target of a [`Failover`], with the
/// backups and settings of a [`FailoverBuilder`].
///
/// `primary` turns the wrapped service into its [`Target`] (name, model,
/// capabilities, price): no placeholder target is needed.
///
/// ```
/// # use bytes::Bytes;
/// # use http::Request;
/// # use http_body_util::Full;
/// use tower::ServiceBuilder;
/// use tower_llm_failover::failover::{Failover, FailoverLayer, Target};
/// use tower_llm_testing::json_response;
///
/// let upstream = || tower::service_fn(|_req: Request<Full<Bytes>>| async {
///     Ok::<_, std::convert::Infallible>(json_response(503, "{}"))
/// });
/// let backups = Failover::builder().target(Target::new("backup", upstream()));
/// let service = ServiceBuilder::new()
///     .layer(FailoverLayer::new(|s| Target::new("primary", s), backups))
///     .service(upstream());
/// # let _ = service;
/// ```
#[derive(Clone)]
pub struct FailoverLayer<S, F, D = DefaultDialect> {
    primary: F,
    builder: FailoverBuilder<S, D>,
}

impl<S, F, D> std::fmt::Debug for FailoverLayer<S, F, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailoverLayer")
            .field("builder", &self.builder)
            .finish_non_exhaustive()
    }
}

impl<S, F, D> FailoverLayer<S, F, D>
where
    F: Fn(S) -> Target<S>,
    D: Dialect,
{
    /// `primary` makes the wrapped service's target; `builder` holds the
    /// backups (tried after it) and the settings. Without a health store in
    /// `builder`, one is made here, so every service this layer makes
    /// shares one health state.
    pub fn new(primary: F, builder: FailoverBuilder<S, D>) -> Self {
        let builder = if builder.has_health() {
            builder
        } else {
            let store = Arc::new(MemoryHealthStore::default());
            builder.health(store)
        };
        Self { primary, builder }
    }
}

impl<S, F, D> Layer<S> for FailoverLayer<S, F, D>
where
    S: Clone,
    F: Fn(S) -> Target<S>,
    D: Dialect,
{
    type Service = Failover<S, D>;

    fn layer(&self, inner: S) -> Self::Service {
        self.builder
            .clone()
            .with_primary((self.primary)(inner))
            .build()
    }
}
