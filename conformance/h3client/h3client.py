"""An HTTP/3 client for duet's end-to-end tests (controller/tests/e2e_http3.rs), on aioquic.

It reads one JSON plan as its only argument and prints one JSON report on stdout:

    {"connect": "127.0.0.1", "port": 8443, "sni": "a.test",
     "alt_svc_from_tcp": false,          # first GET https://connect:port/ over TCP, then use
                                         # the port its Alt-Svc h3=":PORT" names
     "client_cert": "-----BEGIN CERTIFICATE-----...", "client_key": "-----BEGIN PRIVATE KEY...",
                                         # presented when the server asks for a certificate
     "steps": [
       {"request": {"method": "GET", "path": "/", "authority": "a.test",
                    "headers": {"x-echo-body": "1"}, "body_size": 0}},
       {"migrate": "::1", "port": 8444},  # the same connection, now to this address
       {"wait_close": 10}                 # waits for the server to close the connection
     ]}

The report: {"alt_svc": str|null, "retry": bool, "responses": [{"status", "headers",
"length", "sha256", "text"} or {"error"}], "goaway": bool, "closed": {"error_code",
"reason"}|null, "server_cert": the server certificate's DER in hex|null,
"cert_requested": bool (the server asked for a client certificate), "error": str (the
connection failed)}. Request bodies are `body_size` bytes, byte i being i % 251 (as the echo
backend's x-echo-response-bytes).
"""

import asyncio
import hashlib
import http.client
import ipaddress
import json
import socket
import ssl
import sys
import tempfile

from cryptography.hazmat.primitives import serialization

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, FrameType, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection, QuicNetworkPath
from aioquic.quic.events import ConnectionTerminated

REQUEST_TIMEOUT = 10.0


def pattern(n):
    return bytes(i % 251 for i in range(n))


def mapped(host, port):
    """The address as the dual-stack client socket writes to it."""
    ip = ipaddress.ip_address(host)
    if ip.version == 4:
        return ("::ffff:" + host, port, 0, 0)
    return (host, port, 0, 0)


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.streams = {}
        self.goaway = False
        self.closed = None
        self.closed_event = asyncio.Event()
        # aioquic skips GOAWAY's payload without an event; its frame type is checked first.
        original = self.h3._check_control_frame_type

        def check_control_frame_type(frame_type):
            if frame_type == FrameType.GOAWAY:
                self.goaway = True
            return original(frame_type)

        self.h3._check_control_frame_type = check_control_frame_type

    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):
            self.closed = {"error_code": event.error_code, "reason": event.reason_phrase}
            self.closed_event.set()
            for stream in self.streams.values():
                if not stream["done"].done():
                    stream["done"].set_result(None)
            return
        for h3_event in self.h3.handle_event(event):
            stream = self.streams.get(getattr(h3_event, "stream_id", None))
            if stream is None:
                continue
            if isinstance(h3_event, HeadersReceived):
                if stream["headers"] is None:
                    stream["headers"] = h3_event.headers
                else:
                    stream["trailers"] = h3_event.headers
            elif isinstance(h3_event, DataReceived):
                stream["body"].extend(h3_event.data)
            if getattr(h3_event, "stream_ended", False) and not stream["done"].done():
                stream["done"].set_result(None)

    async def request(self, spec):
        stream_id = self._quic.get_next_available_stream_id()
        done = asyncio.get_running_loop().create_future()
        self.streams[stream_id] = {"headers": None, "trailers": None, "body": bytearray(), "done": done}
        body = spec.get("body", "").encode() or pattern(spec.get("body_size", 0))
        headers = [
            (b":method", spec.get("method", "GET").encode()),
            (b":scheme", b"https"),
            (b":authority", spec["authority"].encode()),
            (b":path", spec.get("path", "/").encode()),
        ]
        if body:
            headers.append((b"content-length", str(len(body)).encode()))
        for name, value in spec.get("headers", {}).items():
            headers.append((name.lower().encode(), value.encode()))
        self.h3.send_headers(stream_id, headers, end_stream=not body)
        if body:
            self.h3.send_data(stream_id, body, end_stream=True)
        self.transmit()
        try:
            await asyncio.wait_for(done, spec.get("timeout", REQUEST_TIMEOUT))
        except asyncio.TimeoutError:
            return {"error": "timeout"}
        stream = self.streams.pop(stream_id)
        if stream["headers"] is None:
            return {"error": "closed", "closed": self.closed}
        head = {k.decode(): v.decode() for k, v in stream["headers"]}
        data = bytes(stream["body"])
        return {
            "status": int(head.pop(":status")),
            "headers": head,
            "length": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "text": data[:65536].decode("utf-8", "replace"),
        }

    def migrate(self, host, port):
        """Moves the connection to another server address (and family): new connection ID,
        packets from the same dual-stack socket to the new address."""
        self._quic.change_connection_id()
        self._quic._network_paths.insert(0, QuicNetworkPath(mapped(host, port), is_validated=False))
        self._quic.send_ping(0)
        self.transmit()


def alt_svc_over_tcp(plan):
    """GET / over HTTPS/TCP; the Alt-Svc header of the answer."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    conn = http.client.HTTPSConnection(plan["connect"], plan["port"], context=context, timeout=10)
    # The SNI and Host of the plan, over the connect address.
    conn.sock = context.wrap_socket(
        socket.create_connection((plan["connect"], plan["port"]), timeout=10),
        server_hostname=plan["sni"],
    )
    conn.putrequest("GET", "/", skip_host=True)
    conn.putheader("Host", plan["sni"])
    conn.endheaders()
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.getheader("alt-svc")


def port_of(alt_svc):
    for entry in (alt_svc or "").split(","):
        proto, _, rest = entry.strip().partition("=")
        if proto == "h3":
            authority = rest.split(";")[0].strip().strip('"')
            return int(authority.rsplit(":", 1)[1])
    return None


async def run(plan):
    report = {"alt_svc": None, "retry": False, "responses": [], "goaway": False, "closed": None,
              "server_cert": None, "cert_requested": False}
    port = plan["port"]
    if plan.get("alt_svc_from_tcp"):
        report["alt_svc"] = alt_svc_over_tcp(plan)
        port = port_of(report["alt_svc"])
        if port is None:
            return report
    configuration = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    configuration.verify_mode = ssl.CERT_NONE
    configuration.server_name = plan["sni"]
    configuration.idle_timeout = plan.get("idle_timeout", 30.0)
    if plan.get("client_cert"):
        with tempfile.NamedTemporaryFile("w", suffix=".pem") as cert, \
                tempfile.NamedTemporaryFile("w", suffix=".pem") as key:
            cert.write(plan["client_cert"])
            key.write(plan["client_key"])
            cert.flush()
            key.flush()
            configuration.load_cert_chain(cert.name, key.name)
    quic = QuicConnection(configuration=configuration)
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", 0, 0, 0))
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_datagram_endpoint(lambda: Client(quic), sock=sock)
    try:
        client.connect(mapped(plan["connect"], port))
        await asyncio.wait_for(client.wait_connected(), plan.get("connect_timeout", 10))
        report["retry"] = quic._retry_count > 0
        for step in plan["steps"]:
            if "request" in step:
                report["responses"].append(await client.request(step["request"]))
            elif "migrate" in step:
                client.migrate(step["migrate"], step["port"])
            elif "wait_close" in step:
                try:
                    await asyncio.wait_for(client.closed_event.wait(), step["wait_close"])
                except asyncio.TimeoutError:
                    pass
    except (ConnectionError, asyncio.TimeoutError) as error:
        report["error"] = repr(error)
    finally:
        tls = getattr(quic, "tls", None)
        peer = getattr(tls, "_peer_certificate", None)
        if peer is not None:
            der = peer.public_bytes(serialization.Encoding.DER)
            report["server_cert"] = der.hex()
        report["cert_requested"] = getattr(tls, "_certificate_request", None) is not None
        report["goaway"] = client.goaway
        report["closed"] = client.closed
        client.close()
        transport.close()
    return report


def main():
    plan = json.loads(sys.argv[1])
    report = asyncio.run(run(plan))
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
