//! Fuzzes duet's htpasswd reading and password checks (`policy::basic_auth`): an htpasswd file,
//! an `Authorization` header and a (hash, password) pair never panic; every credential of a
//! file comes from one of its lines, in order; header credentials round-trip; a hash duet makes
//! (MD5-crypt, `$apr1$` and `$1$`) verifies its password and no other.
//!
//! Input: one byte choosing what is fuzzed (file, header, check, `$apr1$`, `$1$`), then its
//! bytes; a check and MD5-crypt split them at the first NUL into hash (or salt) and password.

#![no_main]

use base64::Engine as _;
use http::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use libfuzzer_sys::fuzz_target;

// The module's own source and the contract types it names, compiled here with only their
// dependencies.
#[allow(dead_code)]
#[path = "../../dataplane/src/cidr.rs"]
mod cidr;

#[allow(dead_code)]
#[path = "../../dataplane/src/access_policy.rs"]
mod access_policy;

#[allow(dead_code)]
#[path = "../../dataplane/src/policy/basic_auth.rs"]
mod basic_auth;

use basic_auth::{credentials, md5_crypt, parse_htpasswd, scheme, verify};

/// The htpasswd lines that name a user, as nginx reads them.
fn user_lines(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && l.contains(':'))
        .collect()
}

fn file(text: &str) {
    let users = parse_htpasswd(text);
    let lines = user_lines(text);
    assert_eq!(users.len(), lines.len());
    for (user, line) in users.iter().zip(lines) {
        assert!(!user.user.contains(':') && !user.hash.contains(':'));
        assert!(line.starts_with(&format!("{}:{}", user.user, user.hash)));
    }
}

fn header(value: &[u8]) {
    let Ok(value) = HeaderValue::from_bytes(value) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert(AUTHORIZATION, value);
    let Some((user, password)) = credentials(&headers) else {
        return;
    };
    assert!(!user.contains(':'));
    let mut pair = format!("{user}:").into_bytes();
    pair.extend_from_slice(&password);
    let token = base64::engine::general_purpose::STANDARD.encode(pair);
    headers.insert(AUTHORIZATION, format!("Basic {token}").parse().unwrap());
    assert_eq!(credentials(&headers), Some((user, password)));
}

/// Whether checking `hash` is cheap: bcrypt only at its least cost (the cost of each check is
/// bounded where a hash is admitted, not here).
fn cheap(hash: &str) -> bool {
    scheme(hash) != "bcrypt"
        || hash
            .split('$')
            .filter(|p| !p.is_empty())
            .nth(1)
            .and_then(|cost| cost.parse::<u32>().ok())
            .is_none_or(|cost| cost <= 4)
}

fn check(hash: &[u8], password: &[u8]) {
    if let Ok(hash) = std::str::from_utf8(hash) {
        if cheap(hash) {
            verify(hash, password);
        }
    }
}

fn md5(magic: &str, salt: &[u8], password: &[u8]) {
    // Salts as htpasswd and crypt() make them: up to 8 characters of the crypt alphabet.
    let salt: Vec<u8> = salt
        .iter()
        .filter(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'/'))
        .take(8)
        .copied()
        .collect();
    let hash = md5_crypt(password, &salt, magic);
    assert!(verify(&hash, password), "{hash} does not verify");
    let mut other = password.to_vec();
    other.push(b'x');
    assert!(!verify(&hash, &other), "{hash} verifies another password");
}

fuzz_target!(|input: &[u8]| {
    let [what, data @ ..] = input else {
        return;
    };
    let zero = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let (a, b) = (&data[..zero], data.get(zero + 1..).unwrap_or_default());
    match what % 5 {
        0 => file(&String::from_utf8_lossy(data)),
        1 => header(data),
        2 => check(a, b),
        3 => md5("$apr1$", a, b),
        _ => md5("$1$", a, b),
    }
});
