//! Fuzzes duet's own DER reading of certificates: the TLV reader (`x509::tlv`), a served
//! certificate's `notAfter` (`x509::not_after`) and a client certificate's subject and issuer
//! (`client_auth::distinguished_names`, from bytes a client sends). Any bytes give a value or
//! `None`, never a panic; an element's content and the bytes after it are the input's, in
//! order, after a header of 2 to 6 bytes; a subject or issuer is always a valid HTTP header
//! value (it goes upstream as `ssl-client-subject-dn` and `ssl-client-issuer-dn`).

#![no_main]

use libfuzzer_sys::fuzz_target;

// The modules' own source, compiled here with only their dependencies; `client_auth` names no
// module of the crate but `x509`.
#[path = "../../dataplane/src/x509.rs"]
mod x509;

#[allow(dead_code)]
#[path = "../../dataplane/src/client_auth.rs"]
mod client_auth;

fuzz_target!(|data: &[u8]| {
    if let Some((tag, content, rest)) = x509::tlv(data) {
        let header = data.len() - content.len() - rest.len();
        assert_eq!(tag, data[0]);
        assert!((2..=6).contains(&header), "a header of {header} bytes");
        assert_eq!(&data[header..header + content.len()], content);
        assert_eq!(&data[header + content.len()..], rest);
    }
    if let Some(at) = x509::not_after(data) {
        assert!(at >= std::time::UNIX_EPOCH);
    }
    let der = client_auth::CertificateDer::from(data);
    if let Some((subject, issuer)) = client_auth::distinguished_names(&der) {
        for name in [subject, issuer] {
            assert!(http::HeaderValue::from_str(&name).is_ok(), "{name:?}");
        }
    }
});
