//! Time arithmetic that never panics on a huge configured duration.

use std::time::Duration;

use tokio::time::Instant;

/// How far "never" is: where [`later`] saturates. Thirty years outlives any
/// process, and stays far from the platform's `Instant` limit.
const FAR: Duration = Duration::from_secs(60 * 60 * 24 * 365 * 30);

/// `at + duration`, saturating far in the future instead of panicking, so a
/// configured `Duration::MAX` (a lease, a TTL, a wait) means "very long".
pub(crate) fn later(at: Instant, duration: Duration) -> Instant {
    at.checked_add(duration)
        .or_else(|| at.checked_add(FAR))
        // Unreachable on real clocks; still no panic.
        .unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_saturates_on_a_huge_duration() {
        let now = Instant::now();
        assert_eq!(
            later(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
        assert!(later(now, Duration::MAX) >= now + FAR);
    }
}
