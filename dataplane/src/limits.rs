//! Limits of the client side, with defaults comparable to nginx's: request head size (431),
//! request body size (413; per Ingress with `duet.dev/proxy-body-size`), and HTTP/2 stream limits
//! against floods and rapid reset (CVE-2023-44487).

use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto;

/// Largest request head (request line plus headers) on HTTP/1.1, and largest header list on
/// HTTP/2: 32 KiB, like nginx's `large_client_header_buffers 4 8k`. Larger heads get 431.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Default largest request body: 1 MiB, like nginx's `client_max_body_size`. Larger declared
/// bodies (`Content-Length`) get 413.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 1024 * 1024;

/// Concurrent streams per HTTP/2 connection (nginx `http2_max_concurrent_streams`: 128).
pub const H2_MAX_CONCURRENT_STREAMS: u32 = 128;

/// Streams a client may reset before the server has accepted them, per connection; more is a
/// rapid-reset attack and the connection is closed with GOAWAY.
pub const H2_MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;

/// Streams the server may reset because of client protocol errors, per connection, before the
/// connection is closed.
pub const H2_MAX_LOCAL_ERROR_RESET_STREAMS: usize = 256;

/// Applies the head-size and HTTP/2 limits to a listener's connection builder.
pub fn apply(builder: &mut auto::Builder<TokioExecutor>) {
    builder.http1().max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS)
        .max_pending_accept_reset_streams(H2_MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(H2_MAX_LOCAL_ERROR_RESET_STREAMS);
}

/// Parses a size as nginx writes it: bytes, or a number with `k`, `m` or `g` (powers of 1024,
/// either case); `0` means unlimited.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (number, unit) = match s.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&s[..i], c.to_ascii_lowercase()),
        _ => (s, 'b'),
    };
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = number.parse().ok()?;
    let factor: u64 = match unit {
        'b' => 1,
        'k' => 1024,
        'm' => 1024 * 1024,
        'g' => 1024 * 1024 * 1024,
        _ => return None,
    };
    n.checked_mul(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_nginx_writes_them() {
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("8k"), Some(8192));
        assert_eq!(parse_size("1m"), Some(1 << 20));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size(" 1g "), Some(1 << 30));
        for bad in ["", "m", "1.5m", "-1", "1t", "k1", "99999999999999999999g"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }
}
