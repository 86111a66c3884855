//! HTTP basic authentication against an htpasswd list (ingress-nginx's `auth-type: basic`), as
//! nginx's `auth_basic_user_file` verifies it: bcrypt (`$2a$`, `$2b$`, `$2y$`), Apache's
//! `$apr1$` and `$1$` MD5-crypt, `{SHA}`, `{SSHA}` and `{PLAIN}`. Hashes are compared in constant
//! time; other formats (DES or SHA-crypt `crypt()`) never match.

use std::sync::Arc;

use base64::Engine as _;
use http::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use md5::{Digest as _, Md5};
use sha1::Sha1;
use subtle::ConstantTimeEq as _;

pub use crate::access_policy::scheme;
use crate::access_policy::{BasicAuth, Credential};

/// Parses an htpasswd file: `user:hash[:comment]` per line; blank lines and `#` comments skipped.
pub fn parse_htpasswd(text: &str) -> Vec<Credential> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|line| {
            let (user, rest) = line.split_once(':')?;
            let hash = rest.split(':').next().unwrap_or_default();
            Some(Credential {
                user: user.into(),
                hash: hash.into(),
            })
        })
        .collect()
}

/// The user and password of an `Authorization: Basic …` header, if it carries one.
pub fn credentials(headers: &HeaderMap) -> Option<(String, Vec<u8>)> {
    let value = headers.get(AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at(value.iter().position(|b| *b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim_ascii())
        .ok()?;
    let colon = decoded.iter().position(|b| *b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((user, decoded[colon + 1..].to_vec()))
}

// The checks of the contract's data (`access_policy`), which holds no logic beyond it.
impl BasicAuth {
    /// The hash of a user, as nginx finds it (the first line naming the user).
    pub fn hash_of(&self, user: &str) -> Option<Arc<str>> {
        self.users
            .iter()
            .find(|c| &*c.user == user)
            .map(|c| c.hash.clone())
    }

    /// `WWW-Authenticate` of a 401: `Basic realm="<realm>"`.
    pub fn challenge(&self) -> HeaderValue {
        HeaderValue::from_str(&format!("Basic realm=\"{}\"", self.realm))
            .unwrap_or_else(|_| HeaderValue::from_static("Basic realm=\"\""))
    }
}

/// The longest password checked: 255 bytes, Apache `htpasswd`'s own limit (no hash it makes has
/// a longer password). A longer one gets 401 without being hashed: MD5-crypt's time grows with
/// the password's length.
pub const MAX_PASSWORD_BYTES: usize = 255;

/// The highest bcrypt cost accepted: 12 (2^12 rounds, about 0.2 s of one core per check, and
/// basic auth checks every request). `htpasswd -B` makes cost 5, Go's and most frameworks'
/// defaults are 10 to 12; a Secret with a higher cost is refused at translation (its routes
/// answer 503), and such a hash never matches here.
pub const MAX_BCRYPT_COST: u32 = 12;

/// The cost of a bcrypt hash (`$2y$05$…` is 5), `None` for other hashes or a malformed cost.
pub fn bcrypt_cost(hash: &str) -> Option<u32> {
    if scheme(hash) != "bcrypt" {
        return None;
    }
    let cost = hash.get(4..7)?.strip_suffix('$')?;
    if !cost.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    cost.parse().ok()
}

/// Whether checking a password against `hash` takes milliseconds (bcrypt, MD5-crypt) rather than
/// a single hash.
pub fn is_slow(hash: &str) -> bool {
    matches!(scheme(hash), "bcrypt" | "apr1" | "md5-crypt")
}

/// Whether `password` matches `hash` (any supported scheme; constant-time comparison). A bcrypt
/// hash above [`MAX_BCRYPT_COST`] never matches, and is never computed.
pub fn verify(hash: &str, password: &[u8]) -> bool {
    match scheme(hash) {
        "bcrypt" => {
            bcrypt_cost(hash).is_some_and(|cost| cost <= MAX_BCRYPT_COST)
                && bcrypt::verify(password, hash).unwrap_or(false)
        }
        "apr1" => md5_crypt_matches(hash, password, "$apr1$"),
        "md5-crypt" => md5_crypt_matches(hash, password, "$1$"),
        "sha1" => {
            let want = &hash["{SHA}".len()..];
            let got = base64::engine::general_purpose::STANDARD.encode(Sha1::digest(password));
            bool::from(got.as_bytes().ct_eq(want.as_bytes()))
        }
        "ssha" => ssha_matches(&hash["{SSHA}".len()..], password),
        "plain" => bool::from(hash.as_bytes()["{PLAIN}".len()..].ct_eq(password)),
        _ => false,
    }
}

fn md5_crypt_matches(hash: &str, password: &[u8], magic: &str) -> bool {
    let rest = &hash[magic.len()..];
    let Some((salt, _)) = rest.split_once('$') else {
        return false;
    };
    let computed = md5_crypt(password, salt.as_bytes(), magic);
    bool::from(computed.as_bytes().ct_eq(hash.as_bytes()))
}

fn ssha_matches(encoded: &str, password: &[u8]) -> bool {
    let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(encoded) else {
        return false;
    };
    if raw.len() <= 20 {
        return false;
    }
    let (digest, salt) = raw.split_at(20);
    let mut h = Sha1::new();
    h.update(password);
    h.update(salt);
    bool::from(h.finalize().as_slice().ct_eq(digest))
}

/// MD5-crypt (Poul-Henning Kamp's, as `$1$` in libc and `$apr1$` in Apache): the full hash
/// string for a password and salt (at most 8 bytes of it are used).
pub fn md5_crypt(password: &[u8], salt: &[u8], magic: &str) -> String {
    let salt = &salt[..salt.len().min(8)];
    let alternate = {
        let mut h = Md5::new();
        h.update(password);
        h.update(salt);
        h.update(password);
        h.finalize()
    };
    let mut ctx = Md5::new();
    ctx.update(password);
    ctx.update(magic.as_bytes());
    ctx.update(salt);
    let mut left = password.len();
    while left > 0 {
        ctx.update(&alternate[..left.min(16)]);
        left = left.saturating_sub(16);
    }
    let mut i = password.len();
    while i > 0 {
        if i & 1 == 1 {
            ctx.update([0u8]);
        } else {
            ctx.update(&password[..1]);
        }
        i >>= 1;
    }
    let mut digest: [u8; 16] = ctx.finalize().into();
    for round in 0..1000 {
        let mut h = Md5::new();
        if round & 1 == 1 {
            h.update(password);
        } else {
            h.update(digest);
        }
        if round % 3 != 0 {
            h.update(salt);
        }
        if round % 7 != 0 {
            h.update(password);
        }
        if round & 1 == 1 {
            h.update(digest);
        } else {
            h.update(password);
        }
        digest = h.finalize().into();
    }
    let mut out = String::with_capacity(magic.len() + salt.len() + 23);
    out.push_str(magic);
    out.push_str(&String::from_utf8_lossy(salt));
    out.push('$');
    let d = |i: usize| u32::from(digest[i]);
    for (a, b, c) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        to64(&mut out, (d(a) << 16) | (d(b) << 8) | d(c), 4);
    }
    to64(&mut out, d(11), 2);
    out
}

fn to64(out: &mut String, mut v: u32, n: usize) {
    const ITOA64: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    for _ in 0..n {
        out.push(char::from(ITOA64[(v & 0x3f) as usize]));
        v >>= 6;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Apache's documented examples (htpasswd -nbm / -nbs myName myPassword).
    const APR1: &str = "$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/";
    const SHA: &str = "{SHA}VBPuJHI7uixaa6LQGWx4s+5GKNE=";

    #[test]
    fn apr1_and_md5_crypt_match_published_vectors() {
        assert_eq!(md5_crypt(b"myPassword", b"r31.....", "$apr1$"), APR1);
        // `openssl passwd -1 -salt saltstri password`.
        assert_eq!(
            md5_crypt(b"password", b"saltstri", "$1$"),
            "$1$saltstri$qQY4WxjABChYG1ccLpfkz/"
        );
        assert!(verify(APR1, b"myPassword"));
        assert!(!verify(APR1, b"mypassword"));
        assert!(verify("$1$saltstri$qQY4WxjABChYG1ccLpfkz/", b"password"));
    }

    #[test]
    fn sha_ssha_plain_and_bcrypt_verify() {
        assert!(verify(SHA, b"myPassword"));
        assert!(!verify(SHA, b"myPassword "));
        // {SSHA}: base64(sha1(password + salt) + salt), salt "salt".
        let mut raw = Vec::new();
        let mut h = Sha1::new();
        h.update(b"secret");
        h.update(b"salt");
        raw.extend_from_slice(&h.finalize());
        raw.extend_from_slice(b"salt");
        let ssha = format!(
            "{{SSHA}}{}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        );
        assert!(verify(&ssha, b"secret"));
        assert!(!verify(&ssha, b"secreT"));
        assert!(verify("{PLAIN}open", b"open"));
        assert!(!verify("{PLAIN}open", b"ope"));
        // A bcrypt hash from the OpenBSD test vectors ("U*U", cost 5).
        let bcrypt = "$2a$05$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW";
        assert!(verify(bcrypt, b"U*U"));
        assert!(!verify(bcrypt, b"U*V"));
        let y = bcrypt.replacen("$2a$", "$2y$", 1);
        assert!(verify(&y, b"U*U"));
    }

    #[test]
    fn bcrypt_costs_read_and_above_the_bound_never_computed() {
        let vector = "$2a$05$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW";
        assert_eq!(bcrypt_cost(vector), Some(5));
        for bad in ["$2a$5$x", "$2a$x5$CC", "$2a$", "{SHA}05$", "$apr1$05$"] {
            assert_eq!(bcrypt_cost(bad), None, "{bad}");
        }
        // Cost 31 would take hours: refused before a single round.
        let hours = vector.replacen("$05$", "$31$", 1);
        assert_eq!(bcrypt_cost(&hours), Some(31));
        assert!(!verify(&hours, b"U*U"));
        assert!(is_slow(vector) && is_slow(APR1) && is_slow("$1$s$h"));
        assert!(!is_slow(SHA) && !is_slow("{PLAIN}x") && !is_slow("{SSHA}x"));
    }

    #[test]
    fn unknown_schemes_and_garbage_never_match() {
        for hash in [
            "rqXexS6ZhobKA",
            "$6$salt$abc",
            "",
            "$apr1$",
            "{SHA}",
            "{SSHA}!!",
            "$2y$",
        ] {
            assert!(!verify(hash, b"myPassword"), "{hash}");
            assert!(!verify(hash, b""), "{hash}");
        }
    }

    #[test]
    fn htpasswd_lines_and_authorization_headers_parse() {
        let users = parse_htpasswd(
            "# c\n\nalice:{PLAIN}a:comment\nbob:{PLAIN}b\r\nalice:{PLAIN}x\nnocolon\n",
        );
        let auth = BasicAuth {
            users: users.into(),
            ..BasicAuth::default()
        };
        assert_eq!(auth.users.len(), 3);
        assert_eq!(auth.hash_of("alice").as_deref(), Some("{PLAIN}a"));
        assert_eq!(auth.hash_of("bob").as_deref(), Some("{PLAIN}b"));
        assert_eq!(auth.hash_of("carol"), None);
        let mut h = HeaderMap::new();
        h.insert(
            AUTHORIZATION,
            HeaderValue::from_static("bAsIc YWxpY2U6YTpi"),
        );
        assert_eq!(credentials(&h), Some(("alice".into(), b"a:b".to_vec())));
        for bad in [
            "Bearer YWxpY2U6YQ==",
            "Basic !!!",
            "Basic bm9jb2xvbg==",
            "Basic",
        ] {
            h.insert(AUTHORIZATION, HeaderValue::from_static(bad));
            assert_eq!(credentials(&h), None, "{bad}");
        }
        assert_eq!(
            BasicAuth {
                realm: "Staff only".into(),
                ..BasicAuth::default()
            }
            .challenge(),
            "Basic realm=\"Staff only\""
        );
    }
}
