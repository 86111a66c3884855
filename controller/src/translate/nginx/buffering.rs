//! ingress-nginx's buffering keys as duet can honour them: duet streams request and response
//! bodies (nginx's `proxy-request-buffering: off` and `proxy-buffering: off`) and accepts upstream
//! response heads up to 32 KiB. A value asking for what duet does is honoured; `on` (buffer the
//! whole body first) is reported not applied; a `proxy-buffer-size` above 32 KiB is honoured up
//! to 32 KiB, with the difference said.

use super::{Read, Status, PREFIX};

/// The keys this module reads (after the prefix).
pub const KEYS: [&str; 3] = [
    "proxy-buffering",
    "proxy-request-buffering",
    "proxy-buffer-size",
];

/// The largest upstream response head duet accepts (hyper's buffer, see `dataplane::limits`).
const HEAD_LIMIT: u64 = 32 * 1024;

/// The buffering annotations of one Ingress, validated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Annotations {
    /// `proxy-buffering: on` or `proxy-request-buffering: on`: buffering asked for.
    buffer_on: Vec<&'static str>,
    /// `proxy-buffer-size` in bytes.
    buffer_size: Option<u64>,
}

/// Whether this module reads a key.
pub fn reads(name: &str) -> bool {
    KEYS.contains(&name)
}

/// Applies one key's value, or says why it does not parse (ingress-nginx accepts `on` and `off`,
/// and nginx sizes).
pub fn apply(name: &str, value: &str, a: &mut Annotations) -> Result<(), String> {
    let key = KEYS
        .iter()
        .find(|k| **k == name)
        .copied()
        .unwrap_or_default();
    match (name, value.trim()) {
        ("proxy-buffer-size", v) => {
            a.buffer_size = Some(super::parse_size(v)?);
        }
        (_, "off") => {}
        (_, "on") => a.buffer_on.push(key),
        (_, other) => return Err(format!("{other:?} is not on or off; duet streams")),
    }
    Ok(())
}

/// `on` is not applied (duet streams); a buffer size over 32 KiB is applied up to 32 KiB.
pub fn settle(read: &mut Read) {
    let a = &read.settings.buffering;
    let (on, size) = (a.buffer_on.clone(), a.buffer_size);
    for f in &mut read.findings {
        let Some(name) = f.key.strip_prefix(PREFIX) else {
            continue;
        };
        if !f.status.is_honoured() {
            continue;
        }
        if on.contains(&name) {
            f.status = Status::IgnoredUnsupported;
            f.detail = "not implemented: duet streams bodies (as with off); a slow client holds the upstream connection as long as it reads".to_owned();
        } else if name == "proxy-buffer-size" && size.is_some_and(|s| s > HEAD_LIMIT) {
            f.status = Status::HonouredWithDifference;
            f.detail = "upstream response heads are accepted up to 32 KiB, not up to this size; a larger head is 502".to_owned();
        }
    }
}
