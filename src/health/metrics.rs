//! The store's states as gauges.

use std::sync::Arc;

use super::{HealthStore, KeyState};
use crate::observe::{attr, metric};

/// The states a health gauge names.
const HEALTH_STATES: [&str; 4] = ["healthy", "cooling", "probe", "probing"];

/// Sets the `failover.health.state` gauge for every key `store` knows, each model
/// as its own label value. For a gateway whose clients may name models,
/// use [`record_health_labelled`]: every distinct label value is a series
/// a Prometheus server keeps.
pub fn record_health(store: &dyn HealthStore) {
    record_health_labelled(store, &|_| true);
}

/// One health gauge's labels (provider, model label, scope) and the keys
/// in each of [`HEALTH_STATES`].
type HealthSeries = (Arc<str>, Arc<str>, &'static str, [u32; 4]);

/// Sets the `failover.health.state` gauge with only the models `configured` accepts
/// as label values; every other model is labelled `other`, and the gauge
/// of an `other` series counts the keys in each state (a configured
/// key's gauge is 1 for its state and 0 for the others).
pub fn record_health_labelled(store: &dyn HealthStore, configured: &dyn Fn(&str) -> bool) {
    let mut series: Vec<HealthSeries> = Vec::new();
    for entry in store.snapshot() {
        let model = match entry.key.upstream_model() {
            None => "*",
            Some(model) if configured(model) => model,
            Some(_) => "other",
        };
        let current = match entry.state {
            KeyState::Healthy => 0,
            KeyState::Cooling { .. } => 1,
            KeyState::Probe => 2,
            KeyState::Probing => 3,
            // A state added later reads as none of the four.
            #[allow(unreachable_patterns)]
            _ => usize::MAX,
        };
        let (provider, scope) = (entry.key.provider(), entry.key.scope().as_str());
        let at = series
            .iter()
            .position(|(p, m, s, _)| &**p == provider && &**m == model && *s == scope);
        let at = at.unwrap_or_else(|| {
            series.push((Arc::from(provider), Arc::from(model), scope, [0; 4]));
            series.len() - 1
        });
        if let Some(count) = series[at].3.get_mut(current) {
            *count += 1;
        }
    }
    for (provider, model, scope, counts) in series {
        for (state, count) in HEALTH_STATES.into_iter().zip(counts) {
            metrics::gauge!(
                metric::HEALTH_STATE,
                attr::GEN_AI_PROVIDER_NAME => metrics::SharedString::from(Arc::clone(&provider)),
                attr::GEN_AI_REQUEST_MODEL => metrics::SharedString::from(Arc::clone(&model)),
                attr::FAILOVER_SCOPE => scope,
                attr::FAILOVER_STATE => state,
            )
            .set(f64::from(count));
        }
    }
}

/// Counts a cooldown (`failover.cooldowns`, by provider and scope name).
/// The failover layer counts the ones [`HealthStore::failure`] returns; a
/// shared backend calls this for a cooldown it learns of otherwise (another
/// replica's failures tipped it), as the Redis store does.
pub fn record_cooldown(provider: &str, scope: &'static str) {
    crate::observe::cooldown_started(provider, scope);
}
