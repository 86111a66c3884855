//! X.509 dates read from DER without a certificate library: the `notAfter` of a served
//! certificate, for the expiry metric and the controller's warnings.

use std::time::SystemTime;

/// One DER element: (tag, content, the bytes after it).
pub(crate) fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = b.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, &b| (a << 8) | usize::from(b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The `notAfter` time of an X.509 certificate (DER), read from its `validity`.
pub fn not_after(der: &[u8]) -> Option<SystemTime> {
    let (_, cert, _) = tlv(der)?;
    let (_, tbs, _) = tlv(cert)?;
    let mut rest = tbs;
    let (tag, _, after) = tlv(rest)?;
    if tag == 0xa0 {
        rest = after; // [0] version
    }
    for _ in 0..3 {
        rest = tlv(rest)?.2; // serial, signature algorithm, issuer
    }
    let (_, validity, _) = tlv(rest)?;
    let (_, after_not_before) = tlv(validity).map(|(_, _, r)| ((), r))?;
    let (tag, time, _) = tlv(after_not_before)?;
    let text = std::str::from_utf8(time).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        0x17 => {
            let yy: i64 = text.get(..2)?.parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, text.get(2..)?)
        }
        0x18 => (text.get(..4)?.parse().ok()?, text.get(4..)?),
        _ => return None,
    };
    let num = |r: std::ops::Range<usize>| -> Option<i64> { rest.get(r)?.parse().ok() };
    let (month, day) = (num(0..2)?, num(2..4)?);
    let (hour, minute, second) = (num(4..6)?, num(6..8)?, num(8..10)?);
    let time = jiff::civil::DateTime::new(
        i16::try_from(year).ok()?,
        i8::try_from(month).ok()?,
        i8::try_from(day).ok()?,
        i8::try_from(hour).ok()?,
        i8::try_from(minute).ok()?,
        i8::try_from(second).ok()?,
        0,
    )
    .ok()?;
    let at = time.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp();
    (at >= jiff::Timestamp::UNIX_EPOCH).then(|| SystemTime::from(at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn certificate_expiry_from_der() {
        for (y, m, d, unix) in [(2031, 5, 6, 1_935_792_000u64), (2051, 1, 2, 2_556_230_400)] {
            let mut params = rcgen::CertificateParams::new(vec!["a.test".to_owned()]).unwrap();
            params.not_after = rcgen::date_time_ymd(y, m, d);
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = params.self_signed(&key).unwrap();
            assert_eq!(
                not_after(cert.der()),
                Some(UNIX_EPOCH + Duration::from_secs(unix)),
                "{y}-{m}-{d}"
            );
        }
        assert_eq!(not_after(b"\x30\x03\x02\x01\x00"), None);
        assert_eq!(not_after(&[]), None);
    }
}
