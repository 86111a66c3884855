//! `floor-relay`: the least work any HTTP/1.1 reverse proxy on this kernel's socket API can do
//! per request, as a yardstick for `benches/load/h2-bench.sh` (`SERVERS="duet nginx floor"`).
//!
//! One thread, one epoll set (mio), one upstream connection per client connection opened at
//! accept, bytes relayed as they come in both directions: no parsing, no routing, no headers
//! added, no metrics, no timers. A keep-alive request and its response cost one read and one
//! write each way (a read that fills less than the buffer is taken as draining the socket: an
//! edge-triggered socket reports the next bytes as a new event), plus the share of
//! `epoll_wait` calls. A proxy that parses, routes and rewrites heads can only add to this, so
//! the relay's CPU per request against nginx's bounds the ratio any proxy can reach in the same
//! run. Not a proxy for use: no limits and no timeouts.
//!
//! ```text
//! floor-relay --listen 127.0.0.1:8080 --listen [::1]:8080 \
//!   --upstream 127.0.0.1:9000 --upstream [::1]:9000
//! ```
//! Each listener relays to the upstream of its own family. Exits 64 on a bad flag.

use std::collections::HashMap;
use std::io::{self, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::process::ExitCode;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

const BUF: usize = 16 * 1024;

/// One client connection and its upstream connection. `pending[side]` holds bytes read from
/// `side` that its peer has not taken yet; while it is not empty, `side` is not read.
struct Pair {
    streams: [TcpStream; 2],
    pending: [Vec<u8>; 2],
}

fn usage(message: &str) -> ExitCode {
    eprintln!("floor-relay: {message}");
    eprintln!("usage: floor-relay --listen ADDR... --upstream ADDR... (one upstream per family)");
    ExitCode::from(64)
}

fn main() -> ExitCode {
    let mut listens = Vec::new();
    let mut upstreams: Vec<SocketAddr> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let list = match flag.as_str() {
            "--listen" => &mut listens,
            "--upstream" => &mut upstreams,
            other => return usage(&format!("unknown flag {other:?}")),
        };
        let Some(value) = args.next() else {
            return usage(&format!("{flag} needs an address"));
        };
        match value.parse() {
            Ok(addr) => list.push(addr),
            Err(_) => return usage(&format!("{flag} {value:?}: not an IP address and port")),
        }
    }
    if listens.is_empty() {
        return usage("no --listen");
    }
    for listen in &listens {
        if !upstreams
            .iter()
            .any(|u: &SocketAddr| u.is_ipv4() == listen.is_ipv4())
        {
            return usage(&format!("no --upstream of {listen}'s family"));
        }
    }
    match run(&listens, &upstreams) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floor-relay: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(listens: &[SocketAddr], upstreams: &[SocketAddr]) -> io::Result<()> {
    let mut poll = Poll::new()?;
    let mut listeners = Vec::new();
    for (i, addr) in listens.iter().enumerate() {
        let mut listener = TcpListener::bind(*addr)?;
        poll.registry()
            .register(&mut listener, Token(i), Interest::READABLE)?;
        let upstream = *upstreams
            .iter()
            .find(|u| u.is_ipv4() == addr.is_ipv4())
            .expect("checked in main");
        listeners.push((listener, upstream));
    }
    // Pair n's client side is token `base + 2n`, its upstream side `base + 2n + 1`.
    let base = listeners.len();
    let mut pairs: HashMap<usize, Pair> = HashMap::new();
    let mut next = 0usize;
    let mut events = Events::with_capacity(1024);
    let mut buf = vec![0u8; BUF];
    loop {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for event in &events {
            let token = event.token().0;
            if token < base {
                let (listener, upstream) = &mut listeners[token];
                loop {
                    let (mut client, _) = match listener.accept() {
                        Ok(accepted) => accepted,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    };
                    let mut server = TcpStream::connect(*upstream)?;
                    client.set_nodelay(true)?;
                    server.set_nodelay(true)?;
                    let n = next;
                    next += 1;
                    let registry = poll.registry();
                    // Edge-triggered: writable reports only come when a full send buffer (or
                    // the upstream's connect) clears, so both interests cost nothing per request.
                    let both = Interest::READABLE | Interest::WRITABLE;
                    registry.register(&mut client, Token(base + 2 * n), both)?;
                    registry.register(&mut server, Token(base + 2 * n + 1), both)?;
                    pairs.insert(
                        n,
                        Pair {
                            streams: [client, server],
                            pending: [Vec::new(), Vec::new()],
                        },
                    );
                }
                continue;
            }
            let n = (token - base) / 2;
            let side = (token - base) % 2;
            let Some(pair) = pairs.get_mut(&n) else {
                continue;
            };
            // Writable: the peer's pending bytes go out, then the peer is read again (its
            // readable edge was taken while they waited).
            let open = (!event.is_writable()
                || pair.pending[1 - side].is_empty()
                || relay(pair, 1 - side, &mut buf))
                && (!event.is_readable() || relay(pair, side, &mut buf));
            if !open {
                if let Some(mut pair) = pairs.remove(&n) {
                    for stream in &mut pair.streams {
                        let _ = poll.registry().deregister(stream);
                    }
                }
            }
        }
    }
}

/// Writes what `from`'s peer has pending from `from`; false when the connection is done.
fn flush(pair: &mut Pair, from: usize) -> bool {
    let to = 1 - from;
    while !pair.pending[from].is_empty() {
        match pair.streams[to].write(&pair.pending[from]) {
            Ok(0) => return false,
            Ok(n) => {
                pair.pending[from].drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::NotConnected => return true,
            Err(_) => return false,
        }
    }
    true
}

/// Reads from `side` and writes to its peer; false when either side is done.
fn relay(pair: &mut Pair, side: usize, buf: &mut [u8]) -> bool {
    if !flush(pair, side) {
        return false;
    }
    if !pair.pending[side].is_empty() {
        // The peer has not taken the last bytes: leave these in the socket until it does.
        return true;
    }
    loop {
        let n = match pair.streams[side].read(buf) {
            Ok(0) => return false,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return false,
        };
        pair.pending[side].extend_from_slice(&buf[..n]);
        if !flush(pair, side) {
            return false;
        }
        if n < buf.len() || !pair.pending[side].is_empty() {
            return true;
        }
    }
}
