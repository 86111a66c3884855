//! Deadline arithmetic that cannot panic: `Instant + Duration` overflows for durations near
//! `Duration::MAX`, so every deadline is computed here and saturates at a far future instead.

use std::time::Duration;

/// About 30 years: a deadline that never comes (as tokio's `far_future`).
const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `at + after`, or a far future instant when that overflows.
pub fn deadline(at: tokio::time::Instant, after: Duration) -> tokio::time::Instant {
    at.checked_add(after)
        .or_else(|| at.checked_add(FAR))
        .unwrap_or(at)
}

/// [`deadline`] for `std::time::Instant`.
pub fn std_deadline(at: std::time::Instant, after: Duration) -> std::time::Instant {
    at.checked_add(after)
        .or_else(|| at.checked_add(FAR))
        .unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_durations_saturate() {
        let now = tokio::time::Instant::now();
        assert_eq!(
            deadline(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert!(deadline(now, Duration::MAX) > now + Duration::from_secs(86_400 * 365));
        let now = std::time::Instant::now();
        assert!(std_deadline(now, Duration::MAX) > now);
    }
}
