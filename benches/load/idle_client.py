#!/usr/bin/env python3
"""idle_client.py: opens many client connections, one request each, and keeps them idle.

    idle_client.py --kind h1|h1-tls|h2-tls --port P --conns 5000 --host bench.example

Half the connections go to 127.0.0.1:P, half to [::1]:P. Connections (and TLS handshakes) are
opened up to --concurrency at a time, but requests go one at a time, so a proxy's upstream pool
stays small and the figure is per client connection. Every request must get a 200 (HTTP/2: a
HEADERS frame whose first header is the indexed `:status: 200`), else the client exits 1 saying
which. Once all are open it prints `open N` on stdout and holds them until SIGTERM. Used by
idle-conns.sh; loopback only.
"""

import argparse
import asyncio
import signal
import ssl
import struct
import sys


class Failure(Exception):
    pass


async def read_http1_response(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ")
    if len(status) < 2 or status[1] != "200":
        raise Failure(f"status line {lines[0]!r}")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        await reader.readuntil(b"\r\n0\r\n\r\n")
    else:
        raise Failure(f"response without a length: {head!r}")


def h2_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def hpack_literal(index: int, value: str) -> bytes:
    """A literal header field without indexing, name from the static table (index < 15)."""
    data = value.encode()
    assert index < 15 and len(data) < 127
    return bytes([index, len(data)]) + data


async def h2_request(reader, writer, host: str) -> None:
    block = bytes([0x82, 0x87, 0x84]) + hpack_literal(1, host)  # GET https / :authority
    writer.write(
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        + h2_frame(4, 0, 0)  # SETTINGS
        + h2_frame(1, 0x5, 1, block)  # HEADERS, END_STREAM | END_HEADERS
    )
    await writer.drain()
    status_seen = False
    while True:
        header = await reader.readexactly(9)
        length = int.from_bytes(header[:3], "big")
        kind, flags = header[3], header[4]
        stream = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
        payload = await reader.readexactly(length)
        if kind == 4 and not flags & 0x1:  # SETTINGS: acknowledge
            writer.write(h2_frame(4, 0x1, 0))
            await writer.drain()
        elif kind == 7:  # GOAWAY
            raise Failure(f"GOAWAY {payload.hex()}")
        elif kind == 3 and stream == 1:
            raise Failure(f"RST_STREAM {payload.hex()}")
        elif kind == 1 and stream == 1 and not status_seen:
            offset = (1 if flags & 0x8 else 0) + (5 if flags & 0x20 else 0)  # PADDED, PRIORITY
            if payload[offset : offset + 1] != b"\x88":
                raise Failure(f"response HEADERS do not start with :status 200: {payload.hex()}")
            status_seen = True
        if stream == 1 and kind in (0, 1) and flags & 0x1:  # END_STREAM
            if not status_seen:
                raise Failure("stream ended without a :status 200")
            return


async def open_one(args, host_addr: str, ctx, gate: asyncio.Semaphore, turn: asyncio.Lock):
    async with gate:
        reader, writer = await asyncio.open_connection(
            host_addr, args.port, ssl=ctx, server_hostname=args.host if ctx else None
        )
        if args.kind == "h2-tls":
            alpn = writer.get_extra_info("ssl_object").selected_alpn_protocol()
            if alpn != "h2":
                raise Failure(f"ALPN chose {alpn!r}, not h2")
    async with turn:
        if args.kind == "h2-tls":
            await h2_request(reader, writer, args.host)
        else:
            writer.write(f"GET / HTTP/1.1\r\nHost: {args.host}\r\n\r\n".encode())
            await writer.drain()
            await read_http1_response(reader)
    return writer


async def main(args) -> int:
    ctx = None
    if args.kind != "h1":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"] if args.kind == "h2-tls" else ["http/1.1"])
    gate, turn = asyncio.Semaphore(args.concurrency), asyncio.Lock()
    addrs = ["127.0.0.1" if i % 2 == 0 else "::1" for i in range(args.conns)]
    results = await asyncio.gather(
        *(open_one(args, a, ctx, gate, turn) for a in addrs), return_exceptions=True
    )
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        print(
            f"idle_client: {len(failures)} of {args.conns} connections failed, first: {failures[0]!r}",
            file=sys.stderr,
        )
        return 1
    print(f"open {len(results)}", flush=True)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, done.set)
    await done.wait()
    for writer in results:
        writer.close()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kind", choices=["h1", "h1-tls", "h2-tls"], required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--conns", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--host", default="bench.example")
    sys.exit(asyncio.run(main(parser.parse_args())))
