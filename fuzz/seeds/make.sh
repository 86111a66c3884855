#!/usr/bin/env bash
# Writes the seed inputs of the client_hello, x509 and basic_auth targets (small files: a
# ClientHello, a certificate, a line of text each); the YAML seeds are hand-made files in
# yaml_lite/ (yaml_fast/ links to it). Needs python3 and openssl; rerun after changing a
# target's input format.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
mkdir -p client_hello x509 basic_auth

# ClientHellos as OpenSSL's client sends them, each behind the target's two bytes (read size,
# flags): in one read, byte by byte, and in 7-byte reads repeated without end.
python3 - <<'PY'
import ssl

def hello(name, alpn, tls12):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    if alpn:
        ctx.set_alpn_protocols(alpn)
    out = ssl.MemoryBIO()
    conn = ctx.wrap_bio(ssl.MemoryBIO(), out, server_hostname=name)
    try:
        conn.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()

for file, prefix, args in [
    ("tls13-sni-alpn", b"\0\0", ("passthrough.example.com", ["h2", "http/1.1"], False)),
    ("tls12-sni-bytewise", b"\1\0", ("a.test", None, True)),
    ("tls13-no-sni-repeated", b"\7\1", (None, ["http/1.1"], False)),
]:
    with open(f"client_hello/{file}", "wb") as f:
        f.write(prefix + hello(*args))
PY

# Certificates: notAfter as UTCTime (before 2050) and as GeneralizedTime (after), subjects with the
# attributes duet names.
cert() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout /dev/null \
    -subj "$2" -days "$3" -outform DER -out "x509/$1" 2>/dev/null
}
cert utc-time "/CN=a.test/O=duet/OU=edge+L=Berlin/C=DE" 2000
cert generalized-time "/DC=test/UID=u1/emailAddress=a@a.test" 9500

# basic_auth: the first byte picks the check (0 file, 1 header, 2 hash and password, 3 and 4
# `$apr1$` and `$1$` from salt and password); NUL separates the two parts.
printf '\0# users\nalice:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/\nbob:{SHA}VBPuJHI7uixaa6LQGWx4s+5GKNE=:c\n\ncarol:{PLAIN}x\r\n' >basic_auth/file
printf '\1Basic YWxpY2U6YTpi' >basic_auth/header
printf '\2$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/\0myPassword' >basic_auth/apr1
printf '\2$1$saltstri$qQY4WxjABChYG1ccLpfkz/\0password' >basic_auth/md5-crypt
printf '\2{SHA}VBPuJHI7uixaa6LQGWx4s+5GKNE=\0myPassword' >basic_auth/sha
printf '\2{SSHA}gVK8WC9YyFT1gMsQHTGCgT3sSv5zYWx0\0secret' >basic_auth/ssha
printf '\2{PLAIN}open\0open' >basic_auth/plain
printf '\2$2a$04$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW\0U*U' >basic_auth/bcrypt
printf '\3r31.....\0myPassword' >basic_auth/apr1-hash
printf '\4saltstri\0password' >basic_auth/md5-crypt-hash
