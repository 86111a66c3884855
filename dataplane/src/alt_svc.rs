//! `Alt-Svc` (RFC 7838) on HTTPS answers over TCP: `h3=":PORT"; ma=N` while the HTTP/3 listener of
//! the connection's family is up, so that clients of either family learn HTTP/3 only where duet
//! answers it.

use arc_swap::ArcSwapOption;
use http::HeaderValue;
use std::sync::Arc;
use std::time::Duration;

use crate::table::Family;

/// The `Alt-Svc` value per client family (`None`: no HTTP/3 listener of that family is up).
#[derive(Debug, Default)]
pub struct AltSvc {
    values: [ArcSwapOption<HeaderValue>; 2],
}

fn slot(family: Family) -> usize {
    match family {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

impl AltSvc {
    /// Advertises HTTP/3 on UDP `port` to clients of `family`, for `max_age`.
    pub fn up(&self, family: Family, port: u16, max_age: Duration) {
        let value = format!("h3=\":{port}\"; ma={}", max_age.as_secs());
        let value = HeaderValue::from_str(&value).expect("a port and a number are a header value");
        self.values[slot(family)].store(Some(Arc::new(value)));
    }

    /// Stops advertising HTTP/3 to clients of `family`.
    pub fn down(&self, family: Family) {
        self.values[slot(family)].store(None);
    }

    /// The value for a client of `family`, if HTTP/3 is up for it.
    pub fn get(&self, family: Family) -> Option<HeaderValue> {
        self.values[slot(family)].load().as_deref().cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertises_per_family_until_down() {
        let alt = AltSvc::default();
        assert_eq!(alt.get(Family::V4), None);
        alt.up(Family::V6, 8443, Duration::from_secs(3600));
        assert_eq!(alt.get(Family::V4), None);
        assert_eq!(alt.get(Family::V6).unwrap(), "h3=\":8443\"; ma=3600");
        alt.down(Family::V6);
        assert_eq!(alt.get(Family::V6), None);
    }
}
