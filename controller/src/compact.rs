//! The compact form EndpointSlices are stored in ([`Slice`]): at 100,000 dual-stack pods the
//! k8s-openapi `EndpointSlice` costs about 450 bytes per endpoint (an `Endpoint` is 340 bytes
//! of mostly empty options, plus its address and uid strings); a [`Slice`] keeps its endpoints
//! encoded one after the other in one byte string, 22 bytes for the usual IPv4 endpoint and 34
//! for IPv6 (two tag bytes, the address's 4 or 16 bytes, the uid's 16, a zone index only when
//! zoned; the rare address or target kept as text is in a list of the slice's, the endpoint
//! holds its index).
//!
//! A [`Slice`] keeps exactly what translation reads ([`SliceView`]): name, namespace, resource
//! version (for the watcher), the `kubernetes.io/service-name` label (as a field of its own: a
//! one-entry label map costs a 544-byte B-tree node per slice), the address type, each
//! port's name, number and protocol, and each endpoint's first address, `ready` and
//! `terminating` conditions, zone and target identity. An address is kept as an [`IpAddr`] when
//! it is of the slice's family or written the way duet prints it, else as written, so that
//! translation refuses a bad address with the same diagnostic either way; a `targetRef` uid in
//! the usual lowercase UUID form is kept as its 16 bytes. Decoding never fails on a value (only
//! on the types the API declares, as k8s-openapi does) and never panics.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use dataplane::TargetKey;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use serde::Deserialize;

/// The label tying an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What translation reads of an EndpointSlice, from the API type or from a stored [`Slice`].
pub trait SliceView {
    /// The namespace (`default` when unset).
    fn namespace(&self) -> &str;
    /// The name (empty when unset).
    fn name(&self) -> &str;
    /// The `kubernetes.io/service-name` label.
    fn service(&self) -> Option<&str>;
    /// The `addressType` as written.
    fn address_type(&self) -> &str;
    /// Whether the slice lists no endpoint.
    fn has_no_endpoints(&self) -> bool;
    /// The port number of the first port named `name` (`""`: unnamed) whose protocol is TCP
    /// (unset: TCP); `None` without such a port, or when its number is missing or out of range.
    fn tcp_port(&self, name: &str) -> Option<u16>;
    /// Calls `f` with each endpoint, in order.
    fn for_each_endpoint<'a>(&'a self, f: &mut dyn FnMut(EndpointView<'a>));
}

/// What translation reads of one endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointView<'a> {
    /// `conditions.ready` (unset: ready).
    pub ready: bool,
    /// `conditions.terminating` (unset: not terminating).
    pub terminating: bool,
    /// The first address.
    pub address: Option<Written<'a>>,
    /// The target: the `targetRef` uid, else `kind/namespace/name` (kind `Pod` and the slice's
    /// namespace when unset); `None` without a named `targetRef`.
    pub target: Option<TargetName<'a>>,
    /// The zone.
    pub zone: Option<&'a str>,
}

/// An endpoint's target as text ([`EndpointView::target`]); a uid a [`Slice`] keeps as 16 bytes
/// is written out in place, not allocated (200,000 of them per full build at the 10k-Ingress size).
#[derive(Clone, Debug)]
pub enum TargetName<'a> {
    /// A uid in the lowercase UUID form: 36 ASCII bytes.
    Uid([u8; 36]),
    /// Any other target text.
    Text(Cow<'a, str>),
}

impl std::ops::Deref for TargetName<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            // Always ASCII (written by `uuid_ascii`): never the empty fallback.
            TargetName::Uid(ascii) => std::str::from_utf8(ascii).unwrap_or_default(),
            TargetName::Text(text) => text,
        }
    }
}

impl TargetName<'_> {
    /// The target's key; a uid's without validating its text as UTF-8 again (it is ASCII).
    pub fn key(&self) -> TargetKey {
        match self {
            TargetName::Uid(ascii) => {
                TargetKey::from_ascii(ascii).unwrap_or_else(|| TargetKey::new(self))
            }
            TargetName::Text(text) => TargetKey::new(text),
        }
    }
}

impl PartialEq for TargetName<'_> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for TargetName<'_> {}

/// An endpoint address: parsed when of the slice's family or written as duet prints it, else
/// the text as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written<'a> {
    /// An address of the slice's family, or one whose written form is its `Display` form.
    Ip(IpAddr),
    /// The address as written (of the other family and not canonical, or not an address).
    Text(&'a str),
}

impl Written<'_> {
    /// The address, when it is one.
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Written::Ip(ip) => Some(*ip),
            Written::Text(text) => text.parse().ok(),
        }
    }
}

impl fmt::Display for Written<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Written::Ip(ip) => ip.fmt(f),
            Written::Text(text) => f.write_str(text),
        }
    }
}

/// What a stored [`Slice`] or [`crate::stored::StoredService`] keeps of its metadata: name,
/// namespace and resource version (48 bytes, where a k8s-openapi `ObjectMeta` is 360 whatever it
/// holds: 6 MB at 20,000 slices).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredMeta {
    /// `metadata.name`.
    pub name: Option<Box<str>>,
    /// `metadata.namespace`.
    pub namespace: Option<Box<str>>,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<Box<str>>,
}

impl StoredMeta {
    /// Name, namespace and resource version of the API's metadata.
    pub fn of(name: Option<String>, namespace: Option<String>, version: Option<String>) -> Self {
        StoredMeta {
            name: name.map(Into::into),
            namespace: namespace.map(Into::into),
            resource_version: version.map(Into::into),
        }
    }
}

/// A stored EndpointSlice (see the module documentation).
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "EndpointSlice")]
pub struct Slice {
    /// Name, namespace and resource version only (no labels: see `service`).
    pub metadata: StoredMeta,
    /// The `kubernetes.io/service-name` label.
    service: Option<Box<str>>,
    address_type: AddressType,
    ports: Box<[Port]>,
    /// The endpoints, encoded one after the other (see [`push_endpoint`]).
    endpoints: Option<Box<[u8]>>,
    /// The zones the endpoints name, each once (an endpoint holds an index).
    zones: Box<[Box<str>]>,
    /// Addresses and targets kept as written, in the order met (an endpoint holds an index).
    texts: Box<[Box<str>]>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum AddressType {
    V4,
    V6,
    /// Boxed twice: a thin pointer keeps the field at 16 bytes (a `Slice` in 144).
    Other(Box<Box<str>>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Port {
    name: Option<Box<str>>,
    port: Option<i32>,
    protocol: Option<Box<str>>,
}

const READY_SET: u8 = 1;
const READY: u8 = 2;
const TERMINATING_SET: u8 = 4;
const TERMINATING: u8 = 8;
/// In the conditions byte: a zone index follows the address and the target.
const ZONED: u8 = 16;

/// An endpoint's first address, while decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Address {
    None,
    V4(Ipv4Addr),
    V6(Ipv6Addr),
    Text(Box<str>),
}

/// An endpoint's target, while decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    None,
    Uuid([u8; 16]),
    Text(Box<str>),
}

/// The kinds' numbers in an endpoint's kinds byte (the same for addresses and targets).
const NONE: u8 = 0;
const V4: u8 = 1;
const V6: u8 = 2;
const UUID: u8 = 1;
const TEXT: u8 = 3;

impl PartialEq for Slice {
    /// Equal in all translation reads: the resource version is not compared (a write that
    /// changes nothing else has nothing to rebuild).
    fn eq(&self, other: &Slice) -> bool {
        let (a, b) = (&self.metadata, &other.metadata);
        (&a.name, &a.namespace) == (&b.name, &b.namespace)
            && self.service == other.service
            && self.address_type == other.address_type
            && self.ports == other.ports
            && self.endpoints == other.endpoints
            && self.zones == other.zones
            && self.texts == other.texts
    }
}

impl From<EndpointSlice> for Slice {
    fn from(slice: EndpointSlice) -> Slice {
        let meta = slice.metadata;
        let namespace = meta.namespace.as_deref().unwrap_or("default").to_owned();
        let service = meta
            .labels
            .and_then(|mut labels| labels.remove(SERVICE_NAME_LABEL));
        let address_type = match slice.address_type.as_str() {
            "IPv4" => AddressType::V4,
            "IPv6" => AddressType::V6,
            other => AddressType::Other(Box::new(other.into())),
        };
        let ports = slice.ports.unwrap_or_default().into_iter().map(Port::from);
        let (mut zones, mut texts) = (Vec::new(), Vec::new());
        let endpoints = slice.endpoints.map(|endpoints| {
            let mut bytes = Vec::with_capacity(endpoints.len() * 22);
            for e in endpoints {
                push_endpoint(
                    &mut bytes,
                    e,
                    (&namespace, &address_type),
                    &mut zones,
                    &mut texts,
                );
            }
            bytes.into_boxed_slice()
        });
        Slice {
            metadata: StoredMeta::of(meta.name, meta.namespace, meta.resource_version),
            service: service.map(Into::into),
            address_type,
            ports: ports.collect(),
            endpoints,
            zones: zones.into(),
            texts: texts.into(),
        }
    }
}

impl From<EndpointPort> for Port {
    fn from(port: EndpointPort) -> Port {
        Port {
            name: port.name.map(Into::into),
            port: port.port,
            protocol: port.protocol.map(Into::into),
        }
    }
}

/// Appends one endpoint to `out`: its kinds byte (the [`Address`] kind in the low nibble, the
/// [`Target`] kind in the high one), its conditions byte ([`READY_SET`], [`READY`],
/// [`TERMINATING_SET`], [`TERMINATING`], [`ZONED`]), then the address (4 or 16 bytes, or a
/// 4-byte index in `texts`), the target (a UUID's 16 bytes, or a 4-byte index in `texts`) and,
/// when zoned, the zone's 1-based index in `zones` (4 bytes). All numbers little-endian. The
/// usual endpoint (an address of the slice's family, a UUID uid, no zone) is 22 bytes (IPv4) or
/// 34 (IPv6).
fn push_endpoint(
    out: &mut Vec<u8>,
    endpoint: Endpoint,
    (namespace, address_type): (&str, &AddressType),
    zones: &mut Vec<Box<str>>,
    texts: &mut Vec<Box<str>>,
) {
    let conditions = endpoint.conditions.map_or(0, |c| {
        let bits = |set: Option<bool>, is_set: u8, is: u8| match set {
            Some(true) => is_set | is,
            Some(false) => is_set,
            None => 0,
        };
        bits(c.ready, READY_SET, READY) | bits(c.terminating, TERMINATING_SET, TERMINATING)
    });
    let target = endpoint.target_ref.map_or(Target::None, |r| {
        if let Some(uid) = r.uid.filter(|u| !u.is_empty()) {
            return uuid_bytes(&uid).map_or_else(|| Target::Text(uid.into()), Target::Uuid);
        }
        match r.name.filter(|n| !n.is_empty()) {
            Some(name) => Target::Text(
                format!(
                    "{}/{}/{}",
                    r.kind.as_deref().unwrap_or("Pod"),
                    r.namespace.as_deref().unwrap_or(namespace),
                    name
                )
                .into(),
            ),
            None => Target::None,
        }
    });
    let zone = endpoint.zone.map_or(0, |zone| zone_index(zones, zone));
    let address = endpoint.addresses.into_iter().next();
    let address = address.map_or(Address::None, |a| Address::of(a, address_type));
    let address_kind = match address {
        Address::None => NONE,
        Address::V4(_) => V4,
        Address::V6(_) => V6,
        Address::Text(_) => TEXT,
    };
    let target_kind = match target {
        Target::None => NONE,
        Target::Uuid(_) => UUID,
        Target::Text(_) => TEXT,
    };
    out.push(address_kind | (target_kind << 4));
    out.push(conditions | if zone == 0 { 0 } else { ZONED });
    match address {
        Address::None => {}
        Address::V4(ip) => out.extend_from_slice(&ip.octets()),
        Address::V6(ip) => out.extend_from_slice(&ip.octets()),
        Address::Text(text) => out.extend_from_slice(&text_index(texts, text)),
    }
    match target {
        Target::None => {}
        Target::Uuid(bytes) => out.extend_from_slice(&bytes),
        Target::Text(text) => out.extend_from_slice(&text_index(texts, text)),
    }
    if zone != 0 {
        out.extend_from_slice(&zone.to_le_bytes());
    }
}

/// Reads the endpoint at the start of `bytes` (written by [`push_endpoint`]) and moves past it;
/// `None` at the end.
fn next_endpoint<'a>(
    bytes: &mut &[u8],
    texts: &'a [Box<str>],
    zones: &'a [Box<str>],
) -> Option<EndpointView<'a>> {
    let (&[kinds, conditions], rest) = bytes.split_first_chunk::<2>()?;
    *bytes = rest;
    let address = match kinds & 0xf {
        V4 => take::<4>(bytes).map(|b| Written::Ip(IpAddr::V4(Ipv4Addr::from(b)))),
        V6 => take::<16>(bytes).map(|b| Written::Ip(IpAddr::V6(Ipv6Addr::from(b)))),
        TEXT => take::<4>(bytes).map(|at| Written::Text(text_at(texts, at))),
        _ => None,
    };
    let target = match kinds >> 4 {
        UUID => take::<16>(bytes).map(|b| TargetName::Uid(uuid_ascii(&b))),
        TEXT => take::<4>(bytes).map(|at| TargetName::Text(Cow::Borrowed(text_at(texts, at)))),
        _ => None,
    };
    let zone = match conditions & ZONED {
        0 => None,
        _ => take::<4>(bytes).map(u32::from_le_bytes),
    };
    let zone = zone.and_then(|z| usize::try_from(z).ok()?.checked_sub(1));
    Some(EndpointView {
        ready: conditions & READY_SET == 0 || conditions & READY != 0,
        terminating: conditions & TERMINATING != 0,
        address,
        target,
        zone: zone.and_then(|at| zones.get(at)).map(|z| &**z),
    })
}

/// The next `N` bytes of `bytes`, moving past them (`None`, and nothing left, when fewer remain,
/// which [`push_endpoint`] never writes).
fn take<const N: usize>(bytes: &mut &[u8]) -> Option<[u8; N]> {
    match bytes.split_first_chunk::<N>() {
        Some((head, rest)) => {
            *bytes = rest;
            Some(*head)
        }
        None => {
            *bytes = &[];
            None
        }
    }
}

/// Adds `text` to `texts`; its index (4 bytes, little-endian).
fn text_index(texts: &mut Vec<Box<str>>, text: Box<str>) -> [u8; 4] {
    texts.push(text);
    // A slice decoded from at most a few GiB of text has fewer than `u32::MAX` endpoints.
    let at = u32::try_from(texts.len() - 1).unwrap_or(u32::MAX);
    at.to_le_bytes()
}

/// The text at the index `text_index` wrote (empty past the end, which decoding never makes).
fn text_at(texts: &[Box<str>], index: [u8; 4]) -> &str {
    let at = usize::try_from(u32::from_le_bytes(index)).unwrap_or(usize::MAX);
    texts.get(at).map_or("", |t| &**t)
}

/// The 1-based index of `zone` in `zones`, added when new (0 past `u32::MAX` zones: no zone).
fn zone_index(zones: &mut Vec<Box<str>>, zone: String) -> u32 {
    let at = match zones.iter().position(|z| **z == *zone) {
        Some(at) => at,
        None => {
            zones.push(zone.into());
            zones.len() - 1
        }
    };
    u32::try_from(at + 1).unwrap_or(0)
}

impl Address {
    /// An address of the slice's family is kept parsed however it is written (`fd00::0:1`):
    /// its text would only show in the diagnostic of an address of the wrong family. Parsing it
    /// at every build cost about 800 instructions (10k-Ingress scale folder: 100,000 of them),
    /// and its text 40 bytes more than its 16.
    fn of(written: String, address_type: &AddressType) -> Address {
        match (written.parse::<IpAddr>(), address_type) {
            (Ok(IpAddr::V4(ip)), AddressType::V4) => Address::V4(ip),
            (Ok(IpAddr::V6(ip)), AddressType::V6) => Address::V6(ip),
            (Ok(IpAddr::V4(ip)), _) if ip.to_string() == written => Address::V4(ip),
            (Ok(IpAddr::V6(ip)), _) if ip.to_string() == written => Address::V6(ip),
            _ => Address::Text(written.into()),
        }
    }
}

/// The 16 bytes of a UUID written in lowercase hexadecimal as 8-4-4-4-12, the form the API
/// server gives; `None` for any other text (kept as written).
fn uuid_bytes(uid: &str) -> Option<[u8; 16]> {
    let bytes = uid.as_bytes();
    if bytes.len() != 36 || [8, 13, 18, 23].iter().any(|&i| bytes[i] != b'-') {
        return None;
    }
    let mut digits = bytes.iter().filter(|&&b| b != b'-');
    let mut out = [0u8; 16];
    for byte in &mut out {
        let mut value = 0;
        for _ in 0..2 {
            let digit = match *digits.next()? {
                d @ b'0'..=b'9' => d - b'0',
                d @ b'a'..=b'f' => d - b'a' + 10,
                _ => return None,
            };
            value = (value << 4) | digit;
        }
        *byte = value;
    }
    digits.next().is_none().then_some(out)
}

/// The two lowercase hexadecimal digits of each byte.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0; 2]; 256];
    let mut byte = 0;
    while byte < 256 {
        pairs[byte] = [HEX[byte >> 4], HEX[byte & 0xf]];
        byte += 1;
    }
    pairs
};

/// The text of [`uuid_bytes`]' result.
fn uuid_ascii(bytes: &[u8; 16]) -> [u8; 36] {
    let mut ascii = [b'-'; 36];
    // Where each byte's two digits go in 8-4-4-4-12.
    const AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
    // One table lookup per byte, not `write!` (200,000 of these per full build at scale).
    for (byte, at) in bytes.iter().zip(AT) {
        ascii[at..at + 2].copy_from_slice(&HEX_PAIRS[usize::from(*byte)]);
    }
    ascii
}

impl SliceView for Slice {
    fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("default")
    }

    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    fn service(&self) -> Option<&str> {
        self.service.as_deref()
    }

    fn address_type(&self) -> &str {
        match &self.address_type {
            AddressType::V4 => "IPv4",
            AddressType::V6 => "IPv6",
            AddressType::Other(other) => other,
        }
    }

    fn has_no_endpoints(&self) -> bool {
        self.endpoints.as_deref().is_none_or(<[_]>::is_empty)
    }

    fn tcp_port(&self, name: &str) -> Option<u16> {
        let port = self.ports.iter().find(|p| {
            p.name.as_deref().unwrap_or_default() == name
                && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
        })?;
        u16::try_from(port.port?).ok()
    }

    fn for_each_endpoint<'a>(&'a self, f: &mut dyn FnMut(EndpointView<'a>)) {
        let mut bytes = self.endpoints.as_deref().unwrap_or_default();
        while let Some(endpoint) = next_endpoint(&mut bytes, &self.texts, &self.zones) {
            f(endpoint);
        }
    }
}

impl SliceView for EndpointSlice {
    fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("default")
    }

    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    fn service(&self) -> Option<&str> {
        let labels = self.metadata.labels.as_ref()?;
        labels.get(SERVICE_NAME_LABEL).map(String::as_str)
    }

    fn address_type(&self) -> &str {
        &self.address_type
    }

    fn has_no_endpoints(&self) -> bool {
        self.endpoints.as_ref().is_none_or(Vec::is_empty)
    }

    fn tcp_port(&self, name: &str) -> Option<u16> {
        let port = self.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or_default() == name
                && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
        })?;
        u16::try_from(port.port?).ok()
    }

    fn for_each_endpoint<'a>(&'a self, f: &mut dyn FnMut(EndpointView<'a>)) {
        let namespace = self.namespace();
        for endpoint in self.endpoints.iter().flatten() {
            let conditions = endpoint.conditions.as_ref();
            f(EndpointView {
                ready: conditions.and_then(|c| c.ready).unwrap_or(true),
                terminating: conditions.and_then(|c| c.terminating).unwrap_or(false),
                address: endpoint.addresses.first().map(|a| Written::Text(a)),
                target: endpoint.target_ref.as_ref().and_then(|r| {
                    if let Some(uid) = r.uid.as_deref().filter(|u| !u.is_empty()) {
                        return Some(TargetName::Text(Cow::Borrowed(uid)));
                    }
                    let name = r.name.as_deref().filter(|n| !n.is_empty())?;
                    Some(TargetName::Text(Cow::Owned(format!(
                        "{}/{}/{}",
                        r.kind.as_deref().unwrap_or("Pod"),
                        r.namespace.as_deref().unwrap_or(namespace),
                        name
                    ))))
                }),
                zone: endpoint.zone.as_deref(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The endpoints as translation reads them: an address of the slice's family by its value
    /// (however written), any other by its text (which a diagnostic quotes).
    fn views(slice: &dyn SliceView) -> Vec<EndpointView<'static>> {
        let mut all = Vec::new();
        let family = slice.address_type();
        slice.for_each_endpoint(&mut |e| {
            all.push(EndpointView {
                ready: e.ready,
                terminating: e.terminating,
                address: e.address.map(|a| match a.ip() {
                    Some(ip @ IpAddr::V4(_)) if family == "IPv4" => Written::Ip(ip),
                    Some(ip @ IpAddr::V6(_)) if family == "IPv6" => Written::Ip(ip),
                    _ => Written::Text(a.to_string().leak()),
                }),
                target: e
                    .target
                    .map(|t| TargetName::Text(Cow::Owned(t.to_string()))),
                zone: e.zone.map(|z| &*z.to_owned().leak()),
            })
        });
        all
    }

    fn decode(yaml: &str) -> (EndpointSlice, Slice) {
        let api: EndpointSlice = serde_saphyr::from_str(yaml).expect("an EndpointSlice");
        let stored: Slice = serde_saphyr::from_str(yaml).expect("a stored slice");
        (api, stored)
    }

    const DUAL: &str = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-v6
  namespace: shop
  resourceVersion: "7"
  labels: {kubernetes.io/service-name: web, app: web}
  annotations: {note: dropped}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP, appProtocol: http}, {name: dns, port: 53, protocol: UDP}]
endpoints:
  - addresses: ["2001:db8::1", "2001:db8::2"]
    conditions: {ready: true, serving: true}
    nodeName: node-a
    hostname: pod-a
    zone: zone-a
    targetRef: {kind: Pod, namespace: shop, name: pod-a, uid: 0f8fad5b-d9cb-469f-a165-70867728950e}
  - addresses: ["2001:DB8:0::3"]
    conditions: {ready: false, terminating: true}
    zone: zone-a
    targetRef: {kind: Pod, name: pod-b, uid: Not-A-UUID}
  - addresses: ["::ffff:10.0.0.4"]
    targetRef: {name: pod-c}
  - addresses: ["not an address"]
    zone: zone-b
"#;

    #[test]
    fn a_stored_slice_reads_as_the_api_object() {
        let (api, stored) = decode(DUAL);
        assert_eq!(views(&stored), views(&api));
        for view in [&api as &dyn SliceView, &stored] {
            assert_eq!(
                (view.namespace(), view.name(), view.service()),
                ("shop", "web-v6", Some("web"))
            );
            assert_eq!(view.address_type(), "IPv6");
            assert_eq!(view.tcp_port("http"), Some(8080));
            assert_eq!(view.tcp_port("dns"), None, "UDP");
            assert!(!view.has_no_endpoints());
        }
        let seen = views(&stored);
        assert_eq!(
            seen[0].target.as_deref(),
            Some("0f8fad5b-d9cb-469f-a165-70867728950e")
        );
        assert_eq!(seen[1].target.as_deref(), Some("Not-A-UUID"));
        assert_eq!(seen[2].target.as_deref(), Some("Pod/shop/pod-c"));
        assert_eq!(seen[3].target, None);
        assert_eq!((seen[1].ready, seen[1].terminating), (false, true));
        assert_eq!((seen[2].ready, seen[2].terminating), (true, false));
        assert_eq!(
            seen.iter().map(|e| e.zone).collect::<Vec<_>>(),
            [Some("zone-a"), Some("zone-a"), None, Some("zone-b")]
        );
        // Only what translation reads is kept: `StoredMeta` has no labels or annotations (the
        // Service label is a field of the slice, checked above).
        assert_eq!(stored.metadata.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn addresses_of_the_slice_family_are_parsed_others_kept_as_written() {
        let (_, stored) = decode(DUAL);
        let mut written = Vec::new();
        stored.for_each_endpoint(&mut |e| written.push(e.address));
        let ip = |text: &str| Some(Written::Ip(text.parse().unwrap()));
        // IPv6 addresses in an IPv6 slice, however written: nothing to parse at each build.
        assert_eq!(
            written,
            [
                ip("2001:db8::1"),
                ip("2001:db8::3"),
                ip("::ffff:10.0.0.4"),
                Some(Written::Text("not an address"))
            ]
        );
        // In a slice of the other family an address is kept as written only when it is not
        // written as duet prints it, so that its diagnostic quotes what the user wrote.
        let (_, v4) = decode(
            &DUAL
                .replace("addressType: IPv6", "addressType: IPv4")
                .replace("\"2001:db8::1\", ", "\"10.0.0.1\", \"10.0.0.9\", "),
        );
        let mut written = Vec::new();
        v4.for_each_endpoint(&mut |e| written.push(e.address.map(|a| (a, a.to_string()))));
        let texts: Vec<_> = written.iter().flatten().map(|(_, t)| t.as_str()).collect();
        assert_eq!(
            texts,
            [
                "10.0.0.1",
                "2001:DB8:0::3",
                "::ffff:10.0.0.4",
                "not an address"
            ]
        );
        assert_eq!(written[0].as_ref().map(|(a, _)| *a), ip("10.0.0.1"));
        assert!(matches!(written[1], Some((Written::Text(_), _))));
        assert_eq!(
            written[1].as_ref().and_then(|(a, _)| a.ip()),
            Some("2001:db8::3".parse().unwrap())
        );
    }

    #[test]
    fn resource_version_alone_does_not_make_a_change() {
        let (_, stored) = decode(DUAL);
        let mut rewritten = stored.clone();
        rewritten.metadata.resource_version = Some("8".into());
        assert_eq!(stored, rewritten);
        let (_, moved) = decode(&DUAL.replace("2001:db8::1\"", "2001:db8::9\""));
        assert_ne!(stored, moved);
    }

    #[test]
    fn hostile_slices_decode_or_are_refused_without_panic() {
        // Types the API declares are enforced as k8s-openapi does: a refusal, never a panic.
        for bad in [
            "addressType: IPv4\nendpoints: [{addresses: 7}]",
            "addressType: IPv4\nports: [{port: eighty}]",
            "addressType: [IPv4]\nendpoints: []",
        ] {
            let text = format!("metadata: {{name: x}}\n{bad}\n");
            assert!(serde_saphyr::from_str::<Slice>(&text).is_err(), "{bad}");
        }
        // Values are data: odd ones decode and translation judges them.
        let odd = "metadata: {name: x}\naddressType: FQDN\nports: [{port: 99999999}]\nendpoints: [{addresses: []}, {addresses: [\"\"], targetRef: {uid: \"\"}}]\n";
        let stored: Slice = serde_saphyr::from_str(odd).expect("odd values decode");
        assert_eq!(stored.address_type(), "FQDN");
        assert_eq!(stored.tcp_port(""), None, "out of range");
        let seen = views(&stored);
        assert_eq!(seen[0].address, None);
        assert_eq!(seen[1].address, Some(Written::Text("")));
        assert_eq!(seen[1].target, None);
    }

    #[test]
    fn uuids_round_trip_and_other_uids_are_kept_as_written() {
        for uid in [
            "00000000-0000-4000-8000-00000001869f",
            "0f8fad5b-d9cb-469f-a165-70867728950e",
            "ffffffff-abcd-ef01-2345-6789abcdef10",
        ] {
            let name = uuid_bytes(uid).map(|b| TargetName::Uid(uuid_ascii(&b)));
            assert_eq!(name.as_deref(), Some(uid));
            let key = name.map(|n| n.key());
            assert_eq!(key.as_deref(), Some(uid));
            assert!(key.is_some_and(|k| k.is_inline()));
        }
        for other in [
            "00000000-0000-4000-8000-00000001869F",
            "00000000-0000-4000-8000-00000001869",
            "00000000-0000-4000-8000-00000001869fa",
            "000000000-000-4000-8000-00000001869f",
            "g0000000-0000-4000-8000-00000001869f",
            "00000000-0000-4000-8000-0000000186é",
        ] {
            assert_eq!(uuid_bytes(other), None, "{other}");
        }
    }

    #[test]
    fn the_usual_endpoint_is_22_bytes_for_ipv4_and_34_for_ipv6_without_allocations() {
        // The usual endpoint (a canonical address, a UUID uid) puts nothing in the texts.
        for (family, address, size) in [("IPv4", "10.0.0.", 22), ("IPv6", "fd00::", 34)] {
            let mut yaml = format!("metadata: {{name: u}}\naddressType: {family}\nendpoints:\n");
            for i in 0..10 {
                yaml.push_str(&format!("  - {{addresses: [\"{address}{}\"], targetRef: {{uid: 0f8fad5b-d9cb-469f-a165-70867728950{i}}}}}\n", i + 1));
            }
            let (api, stored) = decode(&yaml);
            assert_eq!(views(&stored), views(&api));
            assert!(stored.texts.is_empty(), "{:?}", stored.texts);
            let bytes = stored.endpoints.as_deref().map(<[u8]>::len);
            assert_eq!(bytes, Some(10 * size), "{family}");
        }
    }

    #[test]
    fn slices_differing_in_one_endpoint_field_are_unequal() {
        let base = "metadata: {name: e}\naddressType: IPv4\nendpoints:\n  - {addresses: [10.0.0.1], zone: a, conditions: {ready: true}, targetRef: {uid: 0f8fad5b-d9cb-469f-a165-70867728950e}}\n";
        let (_, stored) = decode(base);
        assert_eq!(stored, decode(base).1);
        for other in [
            base.replace("10.0.0.1", "10.0.0.2"),
            base.replace("zone: a", "zone: b"),
            base.replace(", zone: a", ""),
            base.replace("ready: true", "ready: false"),
            base.replace("950e", "950f"),
            base.replace("endpoints:\n  - ", "endpoints: []\n#"),
        ] {
            assert_ne!(stored, decode(&other).1, "{other}");
        }
    }

    #[test]
    fn texts_of_addresses_and_targets_keep_their_endpoints() {
        // Text and parsed addresses and targets interleaved: each endpoint reads its own.
        let mut yaml =
            String::from("metadata: {name: m, namespace: ns}\naddressType: IPv4\nendpoints:\n");
        for i in 0..40 {
            let address = match i % 4 {
                0 => format!("10.0.0.{i}"),
                1 => format!("010.0.0.{i}"),
                2 => format!("::ffff:10.0.0.{i}"),
                _ => format!("2001:db8::{i:x}"),
            };
            let target = match i % 3 {
                0 => format!("{{uid: 00000000-0000-4000-8000-0000000000{i:02x}}}"),
                1 => format!("{{uid: UID-{i}}}"),
                _ => format!("{{name: pod-{i}}}"),
            };
            let zone = if i % 5 == 0 {
                String::new()
            } else {
                format!(", zone: z{}", i % 7)
            };
            yaml.push_str(&format!(
                "  - {{addresses: [\"{address}\"], targetRef: {target}{zone}}}\n"
            ));
        }
        let (api, stored) = decode(&yaml);
        assert_eq!(views(&stored), views(&api));
        let seen = views(&stored);
        assert_eq!(seen[5].address, Some(Written::Text("010.0.0.5")));
        assert_eq!(seen[7].address, Some(Written::Text("2001:db8::7")));
        assert_eq!(seen[4].target.as_deref(), Some("UID-4"));
        assert_eq!(seen[5].target.as_deref(), Some("Pod/ns/pod-5"));
    }

    #[test]
    fn a_stored_slice_and_its_metadata_are_small() {
        // 144 bytes and the `Arc`'s counts fill jemalloc's 160-byte class (20,000 slices at the
        // 10k-Ingress size); the API's `ObjectMeta` alone is 360.
        let size = std::mem::size_of::<Slice>();
        assert!(size <= 144, "{size} bytes");
        assert!(std::mem::size_of::<StoredMeta>() <= 48);
        let (_, stored) = decode(DUAL);
        let other = DUAL.replace("addressType: IPv6", "addressType: FQDN");
        let (_, fqdn) = decode(&other);
        assert_eq!(
            (stored.address_type(), fqdn.address_type()),
            ("IPv6", "FQDN")
        );
    }
}
