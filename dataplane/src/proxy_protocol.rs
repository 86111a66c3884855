//! PROXY protocol v1 (text) and v2 (binary) headers in front of inbound connections, as sent by
//! load balancers (HAProxy spec, <https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt>).
//! The parser is pure and total: any byte string yields a header, "need more bytes" or an
//! error, never a panic. The reader takes exactly the header's bytes off the socket, so what
//! follows (TLS or HTTP) is untouched.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The v2 signature.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The longest v1 header, CRLF included.
pub const V1_MAX: usize = 107;

/// The largest v2 header accepted (16 fixed bytes plus addresses and TLVs).
pub const V2_MAX: usize = 16 + 1024;

/// What a header says about the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    /// A proxied connection: the original client and the address it connected to.
    Proxied {
        /// The client.
        source: SocketAddr,
        /// The address the client connected to (the load balancer's).
        destination: SocketAddr,
    },
    /// A connection of the proxy's own (v2 `LOCAL`, v1 `UNKNOWN`, or an address family other
    /// than IPv4/IPv6): keep the socket's addresses.
    Local,
}

/// Why a header was refused; the connection is closed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProxyProtocolError {
    /// The bytes are neither a v1 nor a v2 header.
    #[error("not a PROXY protocol header")]
    NotProxyProtocol,
    /// A v1 line that does not follow the grammar.
    #[error("malformed PROXY v1 header: {0}")]
    BadV1(&'static str),
    /// A v2 header with a bad version, command or length.
    #[error("malformed PROXY v2 header: {0}")]
    BadV2(&'static str),
    /// The header is longer than allowed.
    #[error("PROXY header too long")]
    TooLong,
}

/// Parses a header at the start of `buf`: `Ok(Some((header, length)))` when complete,
/// `Ok(None)` when more bytes are needed.
pub fn parse(buf: &[u8]) -> Result<Option<(Header, usize)>, ProxyProtocolError> {
    let n = buf.len().min(V2_SIGNATURE.len());
    if buf[..n] == V2_SIGNATURE[..n] {
        return if n < V2_SIGNATURE.len() {
            Ok(None)
        } else {
            parse_v2(buf)
        };
    }
    let n = buf.len().min(6);
    if buf[..n] == b"PROXY "[..n] {
        return if n < 6 { Ok(None) } else { parse_v1(buf) };
    }
    Err(ProxyProtocolError::NotProxyProtocol)
}

fn parse_v1(buf: &[u8]) -> Result<Option<(Header, usize)>, ProxyProtocolError> {
    let bad = ProxyProtocolError::BadV1;
    let window = &buf[..buf.len().min(V1_MAX)];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        return if buf.len() >= V1_MAX {
            Err(ProxyProtocolError::TooLong)
        } else if window.contains(&b'\n') {
            Err(bad("a line feed without carriage return"))
        } else {
            Ok(None)
        };
    };
    let line = std::str::from_utf8(&buf[6..end]).map_err(|_| bad("not ASCII"))?;
    let mut parts = line.split(' ');
    let proto = parts.next().ok_or(bad("no protocol"))?;
    if proto == "UNKNOWN" {
        return Ok(Some((Header::Local, end + 2)));
    }
    let fields: Vec<&str> = parts.collect();
    let [src, dst, sport, dport] = fields[..] else {
        return Err(bad("expected four fields after the protocol"));
    };
    let (src, dst): (IpAddr, IpAddr) = match proto {
        "TCP4" => (
            IpAddr::V4(src.parse().map_err(|_| bad("bad IPv4 source"))?),
            IpAddr::V4(dst.parse().map_err(|_| bad("bad IPv4 destination"))?),
        ),
        "TCP6" => (
            IpAddr::V6(src.parse().map_err(|_| bad("bad IPv6 source"))?),
            IpAddr::V6(dst.parse().map_err(|_| bad("bad IPv6 destination"))?),
        ),
        _ => return Err(bad("protocol is not TCP4, TCP6 or UNKNOWN")),
    };
    let port = |p: &str| {
        if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("bad port"));
        }
        p.parse::<u16>().map_err(|_| bad("bad port"))
    };
    Ok(Some((
        Header::Proxied {
            source: SocketAddr::new(src, port(sport)?),
            destination: SocketAddr::new(dst, port(dport)?),
        },
        end + 2,
    )))
}

fn parse_v2(buf: &[u8]) -> Result<Option<(Header, usize)>, ProxyProtocolError> {
    let bad = ProxyProtocolError::BadV2;
    if buf.len() < 16 {
        return Ok(None);
    }
    let version_command = buf[12];
    if version_command >> 4 != 2 {
        return Err(bad("version is not 2"));
    }
    let command = version_command & 0x0f;
    let family = buf[13];
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    let total = 16 + len;
    if total > V2_MAX {
        return Err(ProxyProtocolError::TooLong);
    }
    if buf.len() < total {
        return Ok(None);
    }
    let body = &buf[16..total];
    match command {
        0x0 => return Ok(Some((Header::Local, total))),
        0x1 => {}
        _ => return Err(bad("command is not LOCAL or PROXY")),
    }
    let header = match family {
        // TCP over IPv4, UDP over IPv4
        0x11 | 0x12 => {
            if body.len() < 12 {
                return Err(bad("IPv4 address block too short"));
            }
            let ip = |o: usize| Ipv4Addr::new(body[o], body[o + 1], body[o + 2], body[o + 3]);
            let port = |o: usize| u16::from_be_bytes([body[o], body[o + 1]]);
            Header::Proxied {
                source: SocketAddr::new(ip(0).into(), port(8)),
                destination: SocketAddr::new(ip(4).into(), port(10)),
            }
        }
        // TCP over IPv6, UDP over IPv6
        0x21 | 0x22 => {
            if body.len() < 36 {
                return Err(bad("IPv6 address block too short"));
            }
            let ip = |o: usize| {
                let mut a = [0u8; 16];
                a.copy_from_slice(&body[o..o + 16]);
                Ipv6Addr::from(a)
            };
            let port = |o: usize| u16::from_be_bytes([body[o], body[o + 1]]);
            Header::Proxied {
                source: SocketAddr::new(ip(0).into(), port(32)),
                destination: SocketAddr::new(ip(16).into(), port(34)),
            }
        }
        // UNSPEC, UNIX sockets: keep the socket's addresses.
        _ => Header::Local,
    };
    Ok(Some((header, total)))
}

/// Why reading a header failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The header did not arrive within the timeout.
    #[error("no PROXY header within {0:?}")]
    Timeout(Duration),
    /// The header is malformed.
    #[error(transparent)]
    Malformed(#[from] ProxyProtocolError),
    /// The socket failed or closed first.
    #[error("reading the PROXY header: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads one header off `stream` within `timeout`, consuming exactly its bytes.
pub async fn read_header<S: AsyncRead + Unpin>(
    stream: &mut S,
    timeout: Duration,
) -> Result<Header, ReadError> {
    tokio::time::timeout(timeout, read_exactly_header(stream))
        .await
        .map_err(|_| ReadError::Timeout(timeout))?
}

async fn read_exactly_header<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Header, ReadError> {
    // 12 bytes decide the version and never overrun: the shortest v1 line has 15.
    let mut buf = vec![0u8; 12];
    stream.read_exact(&mut buf).await?;
    loop {
        match parse(&buf)? {
            Some((header, used)) => {
                debug_assert_eq!(used, buf.len());
                return Ok(header);
            }
            None if buf.starts_with(&V2_SIGNATURE) && buf.len() == 12 => {
                buf.resize(16, 0);
                stream.read_exact(&mut buf[12..]).await?;
                let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
                if 16 + len > V2_MAX {
                    return Err(ProxyProtocolError::TooLong.into());
                }
                buf.resize(16 + len, 0);
                stream.read_exact(&mut buf[16..]).await?;
            }
            None => {
                // v1: one byte at a time up to CRLF, so nothing after the header is taken.
                let mut byte = [0u8; 1];
                stream.read_exact(&mut byte).await?;
                buf.push(byte[0]);
            }
        }
    }
}

/// Encodes a v2 PROXY header (for tests and tools).
pub fn encode_v2(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let mut out = V2_SIGNATURE.to_vec();
    out.push(0x21);
    match (source, destination) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            out.push(0x11);
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&s.ip().octets());
            out.extend_from_slice(&d.ip().octets());
            out.extend_from_slice(&s.port().to_be_bytes());
            out.extend_from_slice(&d.port().to_be_bytes());
        }
        (s, d) => {
            let v6 = |a: SocketAddr| match a.ip() {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            out.push(0x21);
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&v6(s).octets());
            out.extend_from_slice(&v6(d).octets());
            out.extend_from_slice(&s.port().to_be_bytes());
            out.extend_from_slice(&d.port().to_be_bytes());
        }
    }
    out
}

/// Encodes a v1 PROXY line (for tests and tools).
pub fn encode_v1(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let proto = if source.is_ipv4() { "TCP4" } else { "TCP6" };
    format!(
        "PROXY {proto} {} {} {} {}\r\n",
        source.ip(),
        destination.ip(),
        source.port(),
        destination.port()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn addrs() -> [(SocketAddr, SocketAddr); 2] {
        [
            (
                "192.0.2.1:4711".parse().unwrap(),
                "198.51.100.2:443".parse().unwrap(),
            ),
            (
                "[2001:db8::1]:4711".parse().unwrap(),
                "[2001:db8::2]:443".parse().unwrap(),
            ),
        ]
    }

    #[test]
    fn v1_and_v2_round_trip_for_both_families() {
        for (src, dst) in addrs() {
            for bytes in [encode_v1(src, dst), encode_v2(src, dst)] {
                let mut with_tail = bytes.clone();
                with_tail.extend_from_slice(b"GET / HTTP/1.1\r\n");
                let (header, used) = parse(&with_tail).unwrap().unwrap();
                assert_eq!(used, bytes.len());
                assert_eq!(
                    header,
                    Header::Proxied {
                        source: src,
                        destination: dst
                    }
                );
                for cut in 0..bytes.len() {
                    assert_eq!(parse(&bytes[..cut]), Ok(None), "prefix of {cut}");
                }
            }
        }
    }

    #[test]
    fn local_and_unknown_keep_the_socket_addresses() {
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\nGET").unwrap(),
            Some((Header::Local, 15))
        );
        let mut local = V2_SIGNATURE.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0, 0]);
        assert_eq!(parse(&local).unwrap(), Some((Header::Local, 16)));
    }

    /// Bytes from hex digits, ignoring spaces and newlines.
    fn hex(text: &str) -> Vec<u8> {
        let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    // v2 headers written by hand from proxy-protocol.txt section 2.2, not by `encode_v2`: the
    // 12-byte signature, version 2 with command PROXY (0x21) or LOCAL (0x20), the family and
    // transport byte (0x11 TCP over IPv4, 0x21 TCP over IPv6, 0x00 UNSPEC), the big-endian
    // length of what follows, the address block (source, destination, source port, destination
    // port), then TLVs (type, big-endian length, value), which the parser skips.
    const SIG: &str = "0d0a0d0a000d0a515549540a";
    /// TCP over IPv4, 192.0.2.33:4711 -> 198.51.100.1:443, no TLVs.
    const V2_TCP4: &str = "21 11 000c  c0000221 c6336401 1267 01bb";
    /// TCP over IPv6, [2001:db8::33]:4711 -> [2001:db8::1]:443, no TLVs.
    const V2_TCP6: &str = "21 21 0024
        20010db8000000000000000000000033 20010db8000000000000000000000001 1267 01bb";
    /// As an AWS NLB sends it through a VPC endpoint (TLS listener): TCP over IPv4, then
    /// PP2_TYPE_ALPN "h2", PP2_TYPE_AUTHORITY "edge.test", PP2_TYPE_AWS (0xEA) with subtype
    /// PP2_SUBTYPE_AWS_VPCE_ID (0x01) "vpce-08d2bf15fac5001c9", and PP2_TYPE_NOOP padding.
    const V2_TCP4_AWS_TLVS: &str = "21 11 003d  c0000221 c6336401 1267 01bb
        01 0002 6832
        02 0009 656467652e74657374
        ea 0017 01 767063652d3038643262663135666163353030316339
        04 0003 000000";
    /// As a GCP load balancer sends it (Private Service Connect): TCP over IPv6, then
    /// PP2_TYPE_ALPN "http/1.1", the PSC connection id (type 0xE0, 8 bytes big-endian) and a
    /// one-byte PP2_TYPE_NOOP.
    const V2_TCP6_GCP_TLVS: &str = "21 21 003e
        20010db8000000000000000000000033 20010db8000000000000000000000001 1267 01bb
        01 0008 687474702f312e31
        e0 0008 0000000000002a17
        04 0001 00";
    /// LOCAL, as a load balancer's health check sends it: no address block.
    const V2_LOCAL: &str = "20 00 0000";
    /// LOCAL with an IPv4 address block, which the receiver must ignore.
    const V2_LOCAL_WITH_ADDRESSES: &str = "20 11 000c  c0000221 c6336401 1267 01bb";
    /// UNSPEC under PROXY: the receiver keeps the socket's addresses.
    const V2_PROXY_UNSPEC: &str = "21 00 0000";

    fn spec_vector(body: &str) -> Vec<u8> {
        hex(&format!("{SIG}{body}"))
    }

    #[test]
    fn spec_vectors_parse_to_their_addresses_and_length() {
        let (v4, v6) = (
            Header::Proxied {
                source: "192.0.2.33:4711".parse().unwrap(),
                destination: "198.51.100.1:443".parse().unwrap(),
            },
            Header::Proxied {
                source: "[2001:db8::33]:4711".parse().unwrap(),
                destination: "[2001:db8::1]:443".parse().unwrap(),
            },
        );
        for (name, body, want, len) in [
            ("TCP4", V2_TCP4, v4, 28),
            ("TCP6", V2_TCP6, v6, 52),
            ("TCP4 + AWS TLVs", V2_TCP4_AWS_TLVS, v4, 16 + 61),
            ("TCP6 + GCP TLVs", V2_TCP6_GCP_TLVS, v6, 16 + 62),
            ("LOCAL", V2_LOCAL, Header::Local, 16),
            (
                "LOCAL + addresses",
                V2_LOCAL_WITH_ADDRESSES,
                Header::Local,
                28,
            ),
            ("PROXY UNSPEC", V2_PROXY_UNSPEC, Header::Local, 16),
        ] {
            let bytes = spec_vector(body);
            assert_eq!(bytes.len(), len, "{name}: the vector itself");
            // What follows the header (a TLS ClientHello here) is left alone.
            let mut with_tail = bytes.clone();
            with_tail.extend_from_slice(&[0x16, 0x03, 0x01]);
            assert_eq!(parse(&with_tail), Ok(Some((want, len))), "{name}");
            for cut in 0..len {
                assert_eq!(parse(&bytes[..cut]), Ok(None), "{name}: prefix of {cut}");
            }
        }
        // Our encoder writes exactly the specification's bytes.
        let (
            Header::Proxied {
                source,
                destination,
            },
            Header::Proxied {
                source: s6,
                destination: d6,
            },
        ) = (v4, v6)
        else {
            unreachable!()
        };
        assert_eq!(encode_v2(source, destination), spec_vector(V2_TCP4));
        assert_eq!(encode_v2(s6, d6), spec_vector(V2_TCP6));
    }

    #[tokio::test]
    async fn the_reader_takes_exactly_a_spec_header_with_tlvs() {
        for body in [V2_TCP4_AWS_TLVS, V2_TCP6_GCP_TLVS, V2_LOCAL] {
            let mut input = spec_vector(body);
            input.extend_from_slice(b"GET / HTTP/1.1\r\n");
            let mut reader = &input[..];
            read_header(&mut reader, Duration::from_secs(1))
                .await
                .unwrap();
            assert_eq!(reader, b"GET / HTTP/1.1\r\n", "{body}");
        }
    }

    #[test]
    fn the_longest_v1_line_of_the_specification_is_accepted() {
        // proxy-protocol.txt 2.1: the worst case is 107 bytes, CRLF included.
        let line = "PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff \
                    ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";
        assert_eq!(line.len(), V1_MAX);
        assert_eq!(parse(line.as_bytes()), Ok(Some((Header::Local, V1_MAX))));
        let tcp4 = "PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n";
        assert_eq!(
            parse(tcp4.as_bytes()),
            Ok(Some((
                Header::Proxied {
                    source: "255.255.255.255:65535".parse().unwrap(),
                    destination: "255.255.255.255:65535".parse().unwrap(),
                },
                56
            )))
        );
    }

    #[test]
    fn garbage_is_refused() {
        for bad in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 99999\r\n",
            b"PROXY TCP4 ::1 ::1 1 2\r\n",
            b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n",
            b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\x00",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let mut long = b"PROXY TCP4 ".to_vec();
        long.resize(200, b'1');
        assert_eq!(parse(&long), Err(ProxyProtocolError::TooLong));
        let mut v3 = V2_SIGNATURE.to_vec();
        v3.extend_from_slice(&[0x31, 0x11, 0, 12]);
        assert!(parse(&v3).is_err());
        let mut short = V2_SIGNATURE.to_vec();
        short.extend_from_slice(&[0x21, 0x21, 0, 12]);
        short.resize(28, 0);
        assert!(parse(&short).is_err());
    }

    #[tokio::test]
    async fn the_reader_takes_exactly_the_header() {
        for (src, dst) in addrs() {
            for bytes in [encode_v1(src, dst), encode_v2(src, dst)] {
                let mut input = bytes.clone();
                input.extend_from_slice(b"rest");
                let mut reader = &input[..];
                let header = read_header(&mut reader, Duration::from_secs(1))
                    .await
                    .unwrap();
                assert!(matches!(header, Header::Proxied { source, .. } if source == src));
                assert_eq!(reader, b"rest");
            }
        }
        let mut reader = &b"PROXY TCP4 1.2.3.4"[..];
        assert!(matches!(
            read_header(&mut reader, Duration::from_secs(1)).await,
            Err(ReadError::Io(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_times_out() {
        let (mut client, mut server) = tokio::io::duplex(64);
        let read =
            tokio::spawn(async move { read_header(&mut server, Duration::from_secs(5)).await });
        tokio::io::AsyncWriteExt::write_all(&mut client, b"PROXY TCP4")
            .await
            .unwrap();
        assert!(matches!(read.await.unwrap(), Err(ReadError::Timeout(_))));
    }

    proptest! {
        // The fuzz target: arbitrary bytes never panic, and a success never claims more
        // bytes than it was given.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(Some((_, used))) = parse(&bytes) {
                prop_assert!(used <= bytes.len());
            }
        }

        // Valid headers with random bytes flipped: still total.
        #[test]
        fn mutated_headers_never_panic(
            v6 in any::<bool>(),
            v2 in any::<bool>(),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
            cut in any::<usize>(),
        ) {
            let (src, dst) = addrs()[usize::from(v6)];
            let mut bytes = if v2 { encode_v2(src, dst) } else { encode_v1(src, dst) };
            for (at, value) in flips {
                let i = at % bytes.len();
                bytes[i] = value;
            }
            let cut = cut % (bytes.len() + 1);
            if let Ok(Some((_, used))) = parse(&bytes[..cut]) {
                prop_assert!(used <= cut);
            }
        }
    }
}
