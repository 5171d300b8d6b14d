//! Which provider holds the state a request continues: answers a provider
//! was asked to keep (`store`) and the conversations it served, learned
//! from the turns this process committed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

/// Ids remembered at most: about 100 bytes each, a few megabytes in all.
/// The oldest is forgotten first; a turn that continues a forgotten id is
/// bound to the route's first target of the clients' dialect.
const CAPACITY: usize = 65_536;

/// Ids of provider-held state and the provider that holds each, bounded.
#[derive(Debug, Default)]
pub(crate) struct StateOwners {
    inner: Mutex<Owners>,
}

#[derive(Debug, Default)]
struct Owners {
    by_id: HashMap<Box<str>, Arc<str>>,
    /// Ids in the order they were learned, to forget the oldest.
    order: VecDeque<Box<str>>,
}

impl StateOwners {
    /// The provider that holds `id`, when this process learned it.
    pub(crate) fn owner(&self, id: &str) -> Option<Arc<str>> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.by_id.get(id).cloned()
    }

    /// Remembers that `provider` holds `id` (the first owner learned
    /// stays: a provider does not take over another's state).
    pub(crate) fn remember(&self, id: &str, provider: &Arc<str>) {
        if id.is_empty() {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.by_id.contains_key(id) {
            return;
        }
        if inner.order.len() >= CAPACITY
            && let Some(oldest) = inner.order.pop_front()
        {
            inner.by_id.remove(&oldest);
        }
        inner.by_id.insert(id.into(), Arc::clone(provider));
        inner.order.push_back(id.into());
    }
}

/// What a committed answer of a target of the clients' own dialect
/// teaches [`StateOwners`]: its id, when the provider was asked to keep it,
/// and the conversation it continued.
#[derive(Debug, Clone)]
pub(crate) struct Learn {
    pub(crate) owners: Arc<StateOwners>,
    pub(crate) provider: Arc<str>,
    /// The provider keeps the answer (`store`).
    pub(crate) stored: bool,
    /// The provider-held state the request continued.
    pub(crate) state: Option<String>,
}

impl Learn {
    /// Learns from an answer with this id.
    pub(crate) fn answer(&self, id: Option<&str>) {
        if self.stored
            && let Some(id) = id
        {
            self.owners.remember(id, &self.provider);
        }
        if let Some(state) = &self.state {
            self.owners.remember(state, &self.provider);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_owner_stays_and_the_oldest_is_forgotten() {
        let owners = StateOwners::default();
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        owners.remember("resp_1", &a);
        owners.remember("resp_1", &b);
        assert_eq!(owners.owner("resp_1").as_deref(), Some("a"));
        assert_eq!(owners.owner("resp_2"), None);
        for n in 0..CAPACITY {
            owners.remember(&format!("r{n}"), &b);
        }
        assert_eq!(owners.owner("resp_1"), None, "forgotten first");
        assert_eq!(owners.owner("r0").as_deref(), Some("b"));
        assert_eq!(
            owners
                .inner
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .by_id
                .len(),
            CAPACITY
        );
    }
}
