//! Passive health, keyed by what failed and shared by a whole gateway.
//!
//! A failure is charged to the scope its class names (see
//! [`ScopeRules`]): the provider's credential (every model behind it), one
//! upstream model of one provider, or nothing at all when the failure was
//! the request's own. One [`HealthStore`] serves every route and every
//! [`Failover`](crate::failover::Failover) of a gateway, so a provider used by two
//! routes has one health state.
//!
//! Health is keyed by what failed: a [`HealthKey`] is (provider credential,
//! upstream model), and the failure's class picks the scope it is charged
//! to ([`ScopeRules`], overridable per class):
//!
//! | scope | classes | what cools down |
//! |---|---|---|
//! | account | quota exhausted (billing), auth, permission | every model behind that credential |
//! | model | rate limit, overloaded, 5xx, connect, timeout, stream faults (invalid response), `model_not_found` for a model the operator configured (logged as an error), and a per-model quota or a 403 for a model the client named | that (provider, upstream model) |
//! | request | bad request, content filter, context length, payload too large, cancelled, `model_not_found` for a model the client named, a timeout the turn's own deadline caused, and an answer over the gateway's own size caps | nothing |
//!
//! A failure cools a provider only for what it says about the provider:
//!
//! - a wait the turn's deadline cut short, or an answer (a whole body, an
//!   event, a held preamble) over one of our own caps, is the request's;
//! - a model the client named and the provider does not know goes back to
//!   the client as the provider's 404: it never cools anything, and it is
//!   never answered by another model; its per-model quota or a 403 cools
//!   that model, never the credential;
//! - timeouts and stream faults count once per client
//!   ([`ClientId`](crate::identity::ClientId)) within the failure window, so
//!   one client's slow prompts never cool a model for everyone; anonymous
//!   requests each count as a client of their own;
//! - the provider's own signals (`retry-after`, 429/529, 5xx, connect
//!   errors, resets) count every time.
//!
//! A hintless model-scope rest doubles per failed probe only up to
//! [`CooldownPolicy::max_probe_interval`] (30 s): a recovered provider is
//! used again within that, however long its outage. Only the provider's
//! hint or an account failure rests a key longer.
//!
//! One [`HealthStore`] ([`MemoryHealthStore`] by default) serves every route
//! and every `Failover` that is given it
//! ([`FailoverBuilder::health`](crate::failover::FailoverBuilder::health)): a provider used by two routes has one
//! health state. When a key cools is the [`CooldownPolicy`]'s: account
//! failures at once; a provider's retry hint at once (capped); otherwise
//! only after 3 failures inside 30 s — one transient failure never cools
//! anything. After a cooldown one request probes the key.
//!
//! A turn never refuses while it can still try: when every eligible target
//! rests, the one whose rest ends first is probed, and its success clears
//! its cooldown. Only when that probe fails (or the operator chose
//! [`FailoverBuilder::refuse_when_cooling`](crate::failover::FailoverBuilder::refuse_when_cooling)) is the answer 503
//! `no_available_target`.
//!
//! # Backends
//!
//! [`HealthStore`] is the backend trait. [`MemoryHealthStore`] keeps one
//! process's view; a shared backend (the Redis one, or your own) keeps a
//! `MemoryHealthStore` as its local view and feeds it the fleet's state
//! through [`MemoryHealthStore::adopt`], so it answers the hot path from
//! memory. Nothing a backend needs is private to this crate.
//!
//! [`record_health`] publishes the store's states as gauges before a scrape.

mod key;
mod memory;
mod metrics;
mod policy;
mod store;

pub use key::{HealthKey, Scope, ScopeRules};
pub(crate) use memory::Admitted;
pub use memory::{FleetState, MemoryHealthStore};
pub use metrics::{record_cooldown, record_health, record_health_labelled};
pub use policy::CooldownPolicy;
pub use store::{
    Admission, Availability, FailureReport, HealthSnapshot, HealthStore, KeyState, SuccessReport,
};
