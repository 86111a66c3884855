//! `access-log.md`: every field of a JSON access-log line, from [`FIELDS`], with example lines
//! the writer itself writes.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use dataplane::access_log::{Entry, TlsInfo, FIELDS, QUEUE_BYTES};
use dataplane::table::UpstreamProtocol;
use http::{HeaderValue, Method, Version};

use super::{code, head, table};

pub(super) fn page() -> String {
    let mut out = head(
        "Access log",
        &format!(
            "With `--access-log json` (the default) duet writes one JSON object per request to \
             standard output, from a queue bounded at {} MiB: when the writer cannot keep up, \
             lines are dropped and counted in `duet_access_log_dropped_total`. `--access-log off` \
             turns it off. Addresses are written in one form whatever the family: IPv4-mapped \
             IPv6 addresses as IPv4, IPv6 in RFC 5952 form and bracketed before a port.",
            QUEUE_BYTES >> 20
        ),
    );
    let rows = FIELDS
        .iter()
        .map(|f| vec![code(f.name), f.format.to_owned(), f.meaning.to_owned()]);
    out.push_str(&table(&["Field", "Format", "Meaning"], rows));
    out.push_str("\nA request from an IPv6 client over TLS, proxied to an IPv4 pod:\n\n");
    out.push_str(&example(example_entry(
        "[2001:db8::7]:51544",
        "[::]:8443",
        true,
    )));
    out.push_str("\nA request from an IPv4 client over plain HTTP that matched no route:\n\n");
    let mut unmatched = example_entry("192.0.2.7:40112", "0.0.0.0:8080", false);
    (unmatched.status, unmatched.upstream, unmatched.route) = (404, None, None);
    unmatched.upstream_time = None;
    out.push_str(&example(unmatched));
    out
}

fn example_entry(client: &str, listener: &str, tls: bool) -> Entry {
    Entry {
        time: UNIX_EPOCH + Duration::from_millis(1_764_448_487_123),
        client: client.parse().expect("an example address"),
        listener: listener.parse().expect("an example address"),
        host: Some(HeaderValue::from_static("shop.example.com")),
        method: Method::GET,
        uri: "/cart?item=7".parse().expect("an example target"),
        version: if tls {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        },
        status: 200,
        bytes: 5120,
        duration: Duration::from_micros(4250),
        upstream: Some("10.244.1.12:8080".parse().expect("an example address")),
        upstream_time: Some(Duration::from_micros(3900)),
        upstream_protocol: Some(UpstreamProtocol::Http1),
        route: Some([Arc::from("shop"), Arc::from("web"), Arc::from("cart")]),
        tls: tls.then(|| TlsInfo {
            version: "TLSv1.3",
            sni: Some("shop.example.com".into()),
        }),
    }
}

fn example(entry: Entry) -> String {
    let mut line = Vec::new();
    entry
        .write_json(&mut line)
        .expect("writing into a Vec does not fail");
    format!("```json\n{}```\n", String::from_utf8_lossy(&line))
}
