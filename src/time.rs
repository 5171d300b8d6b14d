//! Time arithmetic that never panics on a huge configured duration.

use std::time::Duration;

use tokio::time::Instant;

/// `at + duration`, saturating far in the future instead of panicking.
pub(crate) fn later(at: Instant, duration: Duration) -> Instant {
    at.checked_add(duration)
        .unwrap_or_else(|| at + Duration::from_secs(60 * 60 * 24 * 365 * 30))
}
