//! Client certificates, ingress-nginx's `auth-tls-*`: per host, the TLS handshake asks for a
//! certificate (hinting the CA's subjects) when a route of the SNI host verifies them; the
//! certificate is accepted at the handshake (its signature over the handshake is checked, so the
//! client holds its key) and verified per route afterwards against the route's CA bundle, so
//! that a failure is ingress-nginx's HTTP 400 rather than a TLS alert.
//!
//! [`ClientAuth`] is the plain data a route carries, a leaf of the snapshot contract (no I/O, no
//! module of the crate but `x509`); [`ClientAuth::decide`] is the per-request verdict;
//! [`crate::handshake`] picks the server configuration by SNI.

use std::fmt::Write as _;
use std::sync::Arc;

use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls_pki_types::pem::PemObject;
pub use rustls_pki_types::CertificateDer;
pub use rustls_pki_types::CertificateRevocationListDer;
use rustls_pki_types::UnixTime;
use serde::{Serialize, Serializer};

/// `auth-tls-verify-client`: whether a certificate is required and verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifyClient {
    /// Required and verified (`on`, the default): without one, 400.
    On,
    /// Verified when sent; none is fine (`optional`).
    Optional,
    /// Asked for, never refused; the verification result goes upstream (`optional_no_ca`).
    OptionalNoCa,
}

/// The client-certificate settings of a route (from its Ingress).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClientAuth {
    /// The CA Secret, `namespace/name`.
    pub source: Arc<str>,
    /// The CA certificates (`ca.crt`), DER.
    #[serde(serialize_with = "count")]
    pub ca: Arc<[CertificateDer<'static>]>,
    /// The certificate revocation lists (`ca.crl`), DER; when there are some, each certificate
    /// of the client's chain (up to the CA) must be covered by one and not revoked, as nginx's
    /// `ssl_crl` (OpenSSL's CRL_CHECK_ALL); an expired list fails too.
    #[serde(serialize_with = "count")]
    pub crls: Arc<[CertificateRevocationListDer<'static>]>,
    /// `auth-tls-verify-client`.
    pub verify: VerifyClient,
    /// `auth-tls-verify-depth`: the most CA certificates above the client's (1: issued directly
    /// by a CA of the bundle).
    pub depth: u8,
    /// `auth-tls-pass-certificate-to-upstream`: send the URL-encoded PEM as `ssl-client-cert`.
    pub pass_certificate: bool,
    /// `auth-tls-error-page`: a failed verification redirects (302) here instead of 400.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_page: Option<Arc<str>>,
    /// Why nothing can be verified (the Secret is missing or has no usable `ca.crt`): every
    /// request gets 503 (fail closed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Arc<str>>,
    /// `auth-tls-match-cn`: the subject DN must match this regex, else 403.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub match_cn: Option<MatchCn>,
}

/// ingress-nginx's `auth-tls-match-cn`: nginx's `if ($ssl_client_s_dn !~ REGEX) { return 403; }`,
/// a case-sensitive regex found anywhere in the subject DN (RFC 2253, as `ssl-client-subject-dn`;
/// empty without a certificate). Compared and serialised by its pattern.
#[derive(Clone, Debug)]
pub struct MatchCn {
    pattern: Arc<str>,
    regex: regex::Regex,
}

/// Bounds on a compiled `auth-tls-match-cn` regex (hostile input).
const MATCH_CN_SIZE_LIMIT: usize = 1 << 20;

impl MatchCn {
    /// Compiles `pattern` (Rust `regex` syntax, unanchored).
    pub fn new(pattern: &str) -> Result<MatchCn, regex::Error> {
        let regex = regex::RegexBuilder::new(pattern)
            .size_limit(MATCH_CN_SIZE_LIMIT)
            .dfa_size_limit(MATCH_CN_SIZE_LIMIT)
            .build()?;
        Ok(MatchCn {
            pattern: pattern.into(),
            regex,
        })
    }

    /// Whether a subject DN is allowed.
    pub fn allows(&self, subject: &str) -> bool {
        self.regex.is_match(subject)
    }
}

impl PartialEq for MatchCn {
    fn eq(&self, other: &MatchCn) -> bool {
        self.pattern == other.pattern
    }
}

impl Eq for MatchCn {}

impl Serialize for MatchCn {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.pattern)
    }
}

fn count<T, S: Serializer>(items: &Arc<[T]>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(items.len() as u64)
}

/// What a route does with a request, given the connection's client certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Proxy it, with these headers (ingress-nginx's `ssl-client-verify`, `-subject-dn`,
    /// `-issuer-dn` and `-cert`; every `ssl-client-*` header the client sent is removed).
    Pass(Vec<(&'static str, String)>),
    /// Answer 400 with this text (nginx's words).
    BadRequest(&'static str),
    /// Answer 302 to the error page.
    Redirect(Arc<str>),
    /// Answer 503: the route's CA cannot be used.
    Unavailable,
    /// Answer 403 ([`FORBIDDEN`]): the subject does not match `auth-tls-match-cn`.
    Forbidden,
}

/// nginx's 403 text when `auth-tls-match-cn` does not match.
pub const FORBIDDEN: &str = "403 client certificate unauthorized\n";

/// nginx's 400 text without a certificate.
pub const NO_CERTIFICATE: &str = "400 No required SSL certificate was sent\n";
/// nginx's 400 text for a certificate that does not verify.
pub const BAD_CERTIFICATE: &str = "400 The SSL certificate error\n";

impl ClientAuth {
    /// The verdict for a request on a connection that presented `chain` (leaf first; empty for
    /// none), as nginx's `ssl_verify_client` decides it.
    pub fn decide(&self, chain: &[CertificateDer<'_>]) -> Decision {
        if self.error.is_some() {
            return Decision::Unavailable;
        }
        let Some(leaf) = chain.first() else {
            return match self.verify {
                VerifyClient::On => self.refuse(NO_CERTIFICATE),
                _ if !self.subject_allowed("") => Decision::Forbidden,
                _ => Decision::Pass(vec![("ssl-client-verify", "NONE".to_owned())]),
            };
        };
        let verified = self.verify_chain(leaf, &chain[1..]);
        let status = match &verified {
            Ok(()) => "SUCCESS".to_owned(),
            Err(_) if self.verify != VerifyClient::OptionalNoCa => {
                return self.refuse(BAD_CERTIFICATE)
            }
            Err(why) => format!("FAILED:{why}"),
        };
        let mut headers = vec![("ssl-client-verify", status)];
        let names = distinguished_names(leaf);
        if !self.subject_allowed(names.as_ref().map_or("", |(subject, _)| subject)) {
            return Decision::Forbidden;
        }
        if let Some((subject, issuer)) = names {
            headers.push(("ssl-client-subject-dn", subject));
            headers.push(("ssl-client-issuer-dn", issuer));
        }
        if self.pass_certificate {
            headers.push(("ssl-client-cert", escaped_pem(leaf)));
        }
        Decision::Pass(headers)
    }

    /// Whether `auth-tls-match-cn` (if any) allows this subject DN.
    fn subject_allowed(&self, subject: &str) -> bool {
        self.match_cn.as_ref().is_none_or(|m| m.allows(subject))
    }

    fn refuse(&self, text: &'static str) -> Decision {
        match &self.error_page {
            Some(page) => Decision::Redirect(page.clone()),
            None => Decision::BadRequest(text),
        }
    }

    /// Verifies the client's chain for client authentication against the CA bundle, now, with
    /// at most `depth - 1` intermediates.
    fn verify_chain(
        &self,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<(), String> {
        let anchors: Vec<_> = self
            .ca
            .iter()
            .filter_map(|c| webpki::anchor_from_trusted_cert(c).ok())
            .collect();
        let cert = webpki::EndEntityCert::try_from(leaf).map_err(|e| e.to_string())?;
        let crls = self
            .crls
            .iter()
            .map(|der| webpki::OwnedCertRevocationList::from_der(der).map(Into::into))
            .collect::<Result<Vec<webpki::CertRevocationList<'_>>, _>>()
            .map_err(|e| e.to_string())?;
        let crl_refs: Vec<&webpki::CertRevocationList<'_>> = crls.iter().collect();
        let revocation = webpki::RevocationOptionsBuilder::new(&crl_refs)
            .ok()
            .map(|b| {
                b.with_depth(webpki::RevocationCheckDepth::Chain)
                    .with_status_policy(webpki::UnknownStatusPolicy::Deny)
                    .with_expiration_policy(webpki::ExpirationPolicy::Enforce)
                    .build()
            });
        let depth = usize::from(self.depth);
        let within_depth = |path: &webpki::VerifiedPath<'_>| {
            if path.intermediate_certificates().count() < depth {
                Ok(())
            } else {
                Err(webpki::Error::MaximumPathDepthExceeded)
            }
        };
        cert.verify_for_usage(
            algorithms().all,
            &anchors,
            intermediates,
            UnixTime::now(),
            webpki::KeyUsage::client_auth(),
            revocation,
            Some(&within_depth),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    }
}

/// The CA certificates of a PEM bundle (`ca.crt`), each checked to be a usable trust anchor.
pub fn parse_ca(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("ca.crt is not PEM ({e})"))?;
    if certs.is_empty() {
        return Err("ca.crt holds no certificate".to_owned());
    }
    for cert in &certs {
        webpki::anchor_from_trusted_cert(cert).map_err(|e| {
            format!("ca.crt holds a certificate that cannot be a trust anchor ({e})")
        })?;
    }
    Ok(certs)
}

/// The certificate revocation lists of a PEM bundle (`ca.crl`), each checked to parse.
pub fn parse_crl(pem: &[u8]) -> Result<Vec<CertificateRevocationListDer<'static>>, String> {
    let crls = CertificateRevocationListDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("ca.crl is not PEM ({e})"))?;
    if crls.is_empty() {
        return Err("ca.crl holds no X509 CRL".to_owned());
    }
    for crl in &crls {
        webpki::OwnedCertRevocationList::from_der(crl)
            .map_err(|e| format!("ca.crl holds a revocation list that does not parse ({e})"))?;
    }
    Ok(crls)
}

/// The signature algorithms of duet's provider (ring).
pub fn algorithms() -> WebPkiSupportedAlgorithms {
    rustls::crypto::ring::default_provider().signature_verification_algorithms
}

/// The subject and issuer of a certificate as nginx's `$ssl_client_s_dn` and `$ssl_client_i_dn`
/// write them (RFC 2253: most specific first, `,`-separated, short attribute names).
pub fn distinguished_names(der: &CertificateDer<'_>) -> Option<(String, String)> {
    use crate::x509::tlv;
    let (_, cert, _) = tlv(der)?;
    let (_, tbs, _) = tlv(cert)?;
    let mut rest = tbs;
    let (tag, _, after) = tlv(rest)?;
    if tag == 0xa0 {
        rest = after; // [0] version
    }
    rest = tlv(rest)?.2; // serial
    rest = tlv(rest)?.2; // signature algorithm
    let (_, issuer, after) = tlv(rest)?;
    let (_, subject, _) = tlv(tlv(after)?.2)?; // after the validity
    Some((rfc2253(subject)?, rfc2253(issuer)?))
}

/// A DER `Name` (the content of its SEQUENCE) as RFC 2253 text.
fn rfc2253(mut name: &[u8]) -> Option<String> {
    let mut rdns = Vec::new();
    while !name.is_empty() {
        let (_, mut set, rest) = crate::x509::tlv(name)?;
        name = rest;
        let mut attrs = Vec::new();
        while !set.is_empty() {
            let (_, pair, rest) = crate::x509::tlv(set)?;
            set = rest;
            let (_, oid, value) = crate::x509::tlv(pair)?;
            let (tag, value, _) = crate::x509::tlv(value)?;
            attrs.push(format!(
                "{}={}",
                attribute_name(oid),
                attribute_value(tag, value)
            ));
        }
        rdns.push(attrs.join("+"));
    }
    rdns.reverse();
    Some(rdns.join(","))
}

/// The short name OpenSSL prints for an attribute type, else its dotted OID.
fn attribute_name(oid: &[u8]) -> String {
    let short = match oid {
        [0x55, 0x04, 0x03] => "CN",
        [0x55, 0x04, 0x05] => "serialNumber",
        [0x55, 0x04, 0x06] => "C",
        [0x55, 0x04, 0x07] => "L",
        [0x55, 0x04, 0x08] => "ST",
        [0x55, 0x04, 0x09] => "street",
        [0x55, 0x04, 0x0a] => "O",
        [0x55, 0x04, 0x0b] => "OU",
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01] => "emailAddress",
        [0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19] => "DC",
        [0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x01] => "UID",
        _ => return dotted(oid),
    };
    short.to_owned()
}

fn dotted(oid: &[u8]) -> String {
    let mut parts: Vec<u64> = Vec::new();
    let mut n = 0u64;
    for &b in oid {
        n = (n << 7) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            if parts.is_empty() {
                parts.extend([(n / 40).min(2), n - 40 * (n / 40).min(2)]);
            } else {
                parts.push(n);
            }
            n = 0;
        }
    }
    parts
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

/// A string value as OpenSSL's RFC 2253 output (nginx's) writes it: `,+"\<>;` escaped with a
/// backslash, as are `#` first and a space first or last; control bytes and each byte of a
/// non-ASCII character as `\XX`, so that the value is always a valid header value. T61String is
/// read as Latin-1, as OpenSSL reads it. Other types as `#` and the hex of their content.
fn attribute_value(tag: u8, value: &[u8]) -> String {
    let latin1: String;
    let text = match tag {
        0x0c | 0x13 | 0x16 => value,
        0x14 => {
            latin1 = value.iter().copied().map(char::from).collect();
            latin1.as_bytes()
        }
        _ => {
            return value.iter().fold(String::from("#"), |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            })
        }
    };
    let mut out = String::with_capacity(text.len());
    for (i, &b) in text.iter().enumerate() {
        let edge = (i == 0 && matches!(b, b'#' | b' ')) || (i + 1 == text.len() && b == b' ');
        if !(0x20..0x7f).contains(&b) {
            let _ = write!(out, "\\{b:02X}");
            continue;
        }
        if edge || b",+\"\\<>;".contains(&b) {
            out.push('\\');
        }
        out.push(char::from(b));
    }
    out
}

/// The certificate as PEM (64-character lines, as OpenSSL writes it), URL-encoded as nginx's
/// `$ssl_client_escaped_cert`: every byte but letters, digits and `-._~` as `%XX`.
pub fn escaped_pem(der: &CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    let mut out = String::with_capacity(pem.len() * 2);
    for b in pem.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

    /// A CA named `name`, self-signed or signed by `by`: its DER and its issuer.
    fn ca(
        name: &str,
        by: Option<&Issuer<'static, KeyPair>>,
    ) -> (Vec<u8>, Issuer<'static, KeyPair>) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
        let cert = match by {
            Some(issuer) => params.signed_by(&key, issuer).unwrap(),
            None => params.self_signed(&key).unwrap(),
        };
        (cert.der().to_vec(), Issuer::new(params, key))
    }

    /// A client certificate with `dn` as its subject, signed by `by`.
    fn client(dn: &[(DnType, &str)], by: &Issuer<'static, KeyPair>) -> CertificateDer<'static> {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (kind, value) in dn {
            params.distinguished_name.push(kind.clone(), *value);
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        CertificateDer::from(params.signed_by(&key, by).unwrap().der().to_vec())
    }

    fn auth(ca: &[u8], verify: VerifyClient, depth: u8) -> ClientAuth {
        ClientAuth {
            source: "ns/ca".into(),
            ca: vec![CertificateDer::from(ca.to_vec())].into(),
            crls: Arc::from([]),
            verify,
            depth,
            pass_certificate: false,
            error_page: None,
            error: None,
            match_cn: None,
        }
    }

    fn verdict(d: &Decision) -> &str {
        match d {
            Decision::Pass(h) => &h[0].1,
            Decision::BadRequest(text) => text,
            Decision::Redirect(_) => "redirect",
            Decision::Unavailable => "unavailable",
            Decision::Forbidden => FORBIDDEN,
        }
    }

    #[test]
    fn match_cn_refuses_other_subjects_with_403_and_no_certificate_unless_it_matches_empty() {
        let (root, issuer) = ca("root", None);
        let alice = [client(&[(DnType::CommonName, "alice")], &issuer)];
        let bob = [client(&[(DnType::CommonName, "bob")], &issuer)];
        let only_alice = |mode| ClientAuth {
            match_cn: Some(MatchCn::new("CN=alice").unwrap()),
            ..auth(&root, mode, 1)
        };
        assert_eq!(
            verdict(&only_alice(VerifyClient::On).decide(&alice)),
            "SUCCESS"
        );
        assert_eq!(
            only_alice(VerifyClient::On).decide(&bob),
            Decision::Forbidden
        );
        // nginx's `$ssl_client_s_dn` is empty without a certificate: no match, 403.
        assert_eq!(
            only_alice(VerifyClient::Optional).decide(&[]),
            Decision::Forbidden
        );
        // A certificate that does not verify is still refused as such first.
        let (_, other) = ca("other", None);
        let forged = [client(&[(DnType::CommonName, "alice")], &other)];
        assert_eq!(
            verdict(&only_alice(VerifyClient::On).decide(&forged)),
            BAD_CERTIFICATE
        );
        assert!(MatchCn::new("CN=(").is_err());
    }

    #[test]
    fn verify_depth_counts_the_cas_above_the_client() {
        let (root, root_issuer) = ca("root", None);
        let (inter, inter_issuer) = ca("intermediate", Some(&root_issuer));
        let leaf = client(&[(DnType::CommonName, "alice")], &inter_issuer);
        let chain = [leaf, CertificateDer::from(inter)];
        let one = auth(&root, VerifyClient::On, 1);
        assert_eq!(
            verdict(&one.decide(&chain)),
            BAD_CERTIFICATE,
            "depth 1: no intermediate"
        );
        let two = auth(&root, VerifyClient::On, 2);
        assert_eq!(verdict(&two.decide(&chain)), "SUCCESS");
        // Without the intermediate the chain does not reach the root.
        assert_eq!(verdict(&two.decide(&chain[..1])), BAD_CERTIFICATE);
    }

    #[test]
    fn verify_client_modes_decide_as_nginx() {
        let (root, issuer) = ca("root", None);
        let (_, other) = ca("other", None);
        let good = [client(&[(DnType::CommonName, "a")], &issuer)];
        let bad = [client(&[(DnType::CommonName, "b")], &other)];
        let cases = [
            (VerifyClient::On, &[][..], NO_CERTIFICATE),
            (VerifyClient::On, &bad[..], BAD_CERTIFICATE),
            (VerifyClient::On, &good[..], "SUCCESS"),
            (VerifyClient::Optional, &[][..], "NONE"),
            (VerifyClient::Optional, &bad[..], BAD_CERTIFICATE),
            (VerifyClient::OptionalNoCa, &[][..], "NONE"),
            (VerifyClient::OptionalNoCa, &good[..], "SUCCESS"),
        ];
        for (mode, chain, want) in cases {
            assert_eq!(
                verdict(&auth(&root, mode, 1).decide(chain)),
                want,
                "{mode:?}"
            );
        }
        let no_ca = auth(&root, VerifyClient::OptionalNoCa, 1).decide(&bad);
        assert!(verdict(&no_ca).starts_with("FAILED:"), "{no_ca:?}");
        let page = ClientAuth {
            error_page: Some("https://e.example/".into()),
            ..auth(&root, VerifyClient::On, 1)
        };
        assert_eq!(
            page.decide(&[]),
            Decision::Redirect("https://e.example/".into())
        );
        let broken = ClientAuth {
            error: Some("no ca.crt".into()),
            ..auth(&root, VerifyClient::Optional, 1)
        };
        assert_eq!(broken.decide(&good), Decision::Unavailable);
    }

    #[test]
    fn distinguished_names_are_rfc2253_most_specific_first_escaped_as_openssl() {
        let (_, issuer) = ca("Duet CA", None);
        // Control and non-ASCII bytes as `\XX`: `openssl x509 -nameopt RFC2253` prints the same,
        // and the value is always a valid header value.
        let odd = "\u{e9} a=b\tc\u{7f}\r\n";
        for (dn, want) in [
            (
                &[
                    (DnType::CountryName, "DE"),
                    (DnType::OrganizationName, "Duet, Inc."),
                    (DnType::CommonName, "alice+bob"),
                ][..],
                "CN=alice\\+bob,O=Duet\\, Inc.,C=DE",
            ),
            (
                &[
                    (DnType::OrganizationName, " x; y "),
                    (DnType::OrganizationalUnitName, "#x"),
                    (DnType::CommonName, odd),
                ][..],
                r"CN=\C3\A9 a=b\09c\7F\0D\0A,OU=\#x,O=\ x\; y\ ",
            ),
        ] {
            let (subject, issuer_dn) = distinguished_names(&client(dn, &issuer)).unwrap();
            assert_eq!(subject, want);
            assert!(http::HeaderValue::from_str(&subject).is_ok());
            assert_eq!(issuer_dn, "CN=Duet CA");
        }
        assert_eq!(
            distinguished_names(&CertificateDer::from(vec![0x30, 0x00])),
            None
        );
    }

    #[test]
    fn the_certificate_goes_upstream_url_encoded_as_nginx() {
        let (_, issuer) = ca("root", None);
        let leaf = client(&[(DnType::CommonName, "a")], &issuer);
        let escaped = escaped_pem(&leaf);
        assert!(escaped.starts_with("-----BEGIN%20CERTIFICATE-----%0A"));
        assert!(escaped.ends_with("%0A-----END%20CERTIFICATE-----%0A"));
        assert!(escaped
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)));
    }

    #[test]
    fn ca_bundles_must_hold_certificates() {
        let (root, _) = ca("root", None);
        let text = format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD.encode(&root)
            }
        );
        assert_eq!(parse_ca(text.as_bytes()).unwrap().len(), 1);
        assert!(parse_ca(b"not pem").is_err());
        assert!(
            parse_ca(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").is_err()
        );
    }
}
