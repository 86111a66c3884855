//! Durations and sizes as written on the command line and in annotations, a leaf both the CLI
//! (`config`) and the translation (`translate::timeouts`, body sizes) parse with: durations as
//! `5`, `0.5`, `500ms`, `5s`, `2m` or `1h`; sizes in nginx syntax (`512`, `8k`, `10m`, `1g`; `0`
//! unlimited). Also the one doubling delay ([`Doubling`]) the retrying tasks share.

use std::time::Duration;

/// Largest duration a flag or annotation may give.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);

/// Largest `--max-body-size` and `duet.dev/proxy-body-size`: 64 GiB.
pub const MAX_BODY_SIZE: u64 = 64 << 30;

/// A delay that doubles after each use up to a maximum, back to its minimum on reset: the
/// retries of watches (`source::watch::WatchBackoff`, with jitter) and of Event writes
/// (`events::RetryBackoff`).
#[derive(Clone, Debug)]
pub struct Doubling {
    next: Duration,
    min: Duration,
    max: Duration,
}

impl Doubling {
    /// From `min` doubling up to `max`.
    pub const fn new(min: Duration, max: Duration) -> Doubling {
        Doubling {
            next: min,
            min,
            max,
        }
    }

    /// The next delay; the one after is twice as long (at most the maximum).
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// Back to the minimum.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

/// Why a body size does not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// Not a size in nginx syntax.
    NotASize,
    /// More than [`MAX_BODY_SIZE`].
    TooLarge,
}

/// A size in nginx syntax: bytes, or a number with `k`, `m` or `g` (powers of 1024, either
/// case); `0` means unlimited. Unbounded (the dataplane's parser).
pub fn parse_size(s: &str) -> Option<u64> {
    dataplane::limits::parse_size(s)
}

/// A request body limit: [`parse_size`], at most [`MAX_BODY_SIZE`].
pub fn parse_body_size(s: &str) -> Result<u64, SizeError> {
    match parse_size(s) {
        None => Err(SizeError::NotASize),
        Some(size) if size > MAX_BODY_SIZE => Err(SizeError::TooLarge),
        Some(size) => Ok(size),
    }
}

/// Parses a duration: a number of seconds (`5`, `0.5`) or a number with a unit `ms`, `s`, `m`
/// or `h` (`500ms`, `5s`, `1m`). Must be positive and at most [`MAX_DURATION`] (1 h).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let duration = parse_duration_or_zero(s)?;
    if duration.is_zero() {
        return Err(format!("{:?} must be more than zero", s.trim()));
    }
    Ok(duration)
}

/// [`parse_duration`], also accepting zero.
pub fn parse_duration_or_zero(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let bad = || format!("{s:?} is not a duration (examples: 5, 5s, 500ms, 2m)");
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(bad()),
    };
    if seconds < 0.0 {
        return Err(format!("{s:?} must not be negative"));
    }
    if seconds > MAX_DURATION.as_secs_f64() {
        return Err(format!("{s:?} is more than the maximum, 1h"));
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in [
            "",
            "s",
            "5x",
            "-1s",
            "0",
            "1e999",
            "3601",
            "61m",
            "2h",
            "18000000000000000000",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_duration_or_zero("0"), Ok(Duration::ZERO));
    }
}
