//! The catalogue of every `nginx.ingress.kubernetes.io/` key ingress-nginx defines (its final
//! release's `annotations-risk.md`: 137 keys and 2 aliases), the keys it removed or never had
//! that still sit in manifests, and what duet does with each today.

/// What duet does with a key that ingress-nginx defines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Applied with ingress-nginx's semantics.
    Honoured,
    /// Applied, with the difference given.
    Different(&'static str),
    /// Not applied; the note says what to do instead, or that it is not done yet.
    Unsupported(&'static str),
    /// Raw nginx configuration: never interpreted (served without it, or refused whole under
    /// `--strict-annotations`).
    Snippet,
}

/// One key ingress-nginx defines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// The name after the prefix.
    pub name: &'static str,
    /// What duet does with it.
    pub support: Support,
}

const fn key(name: &'static str, support: Support) -> Key {
    Key { name, support }
}

use Support::{Different, Honoured, Snippet, Unsupported};

const NOT_YET: &str = "not implemented yet";
const REGEX: &str = "paths compile with Rust's regex crate, not PCRE: lookaround and backreferences do not compile (that path is skipped, reported invalid-value); the path is matched as received (after dot-segment and slash normalisation), percent-encoding not decoded";
const REWRITE: &str = "as use-regex for the paths; in the target only $1..$9 are expanded (nginx variables such as $host are not)";
const REDIRECT: &str = "not implemented yet: requests are proxied, not redirected";
const ACL: &str = "the client is the connection's peer (after PROXY protocol; IPv4-mapped IPv6 peers match IPv4 ranges), never X-Forwarded-For, as ingress-nginx without use-forwarded-headers; a ConfigMap-wide list does not exist";
const RATE: &str = "not implemented yet: responses are not bandwidth limited";
const BASIC_AUTH: &str = "htpasswd hashes bcrypt, apr1 and $1$ MD5-crypt, {SHA}, {SSHA} and {PLAIN} are verified; DES and SHA-crypt ($5$, $6$) hashes never match (a diagnostic names their users)";
const EXT_AUTH: &str = "IPv6-literal URLs work (ingress-nginx rejects the Ingress); of nginx variables only $host, $http_host, $best_http_host, $scheme, $pass_access_scheme, $request_uri and $escaped_request_uri are expanded (others: invalid-value); in the URL's host and port $http_host and $best_http_host are the routed host without the client's port; auth requests go over pooled HTTP/1.1 connections (a fresh one when a variable names the host), without cache, only to addresses --auth-allowed-destinations allows (by default none on loopback, link-local or unspecified addresses); their Host is the URL's authority (port and IPv6 brackets kept); https is not verified, as ingress-nginx";
const LIMIT: &str = "clients are keyed per address as ingress-nginx; duet.dev/limit-ipv6-prefix: \"64\" keys IPv6 clients by their /64 instead (one host rotating addresses in its /64 escapes per-address limits); the client is the connection's peer, IPv4-mapped as IPv4; per duet replica, as ingress-nginx; over the limit: 503 (limit-req-status-code is a ConfigMap option in ingress-nginx, fixed at 503 in duet); checked after the source ranges (nginx: before)";
const AFFINITY: &str = "the cookie names the pod (an opaque 16-hex-digit token, never an address), so a dual-stack pod keeps its sessions when the client switches family; HttpOnly always, Secure over HTTPS or with session-cookie-secure";
const AFFINITY_LATER: &str = "not implemented yet: the affinity cookie's other attributes apply";
const CORS: &str = "allowed origins are matched whole (scheme, host, port; ingress-nginx's regex is anchored at the end only); the headers go on proxied responses and preflights, not on duet's own error answers; the 204 preflight carries no Content-Length: 0 (HTTP forbids it on 204)";
const CLIENT_TLS: &str = "the CA Secret must be in the Ingress's namespace (as ingress-nginx without allow-cross-namespace-resources); a certificate is asked for by TLS server name (SNI) and verified per route of the Ingress that sets it, so a Host other than the server name gets 421 (as nginx); plain HTTP without the HTTPS redirect counts as no certificate (nginx does not check it); ca.crl is checked as nginx's ssl_crl (every certificate of the chain covered by an unexpired CRL), a ca.crl that does not parse makes the routes answer 503";
const PROXY_TLS: &str = "not implemented yet: see duet.dev/backend-ca-secret, duet.dev/backend-tls-server-name, duet.dev/backend-tls-skip-verify";
const BUFFERING: &str = "not implemented yet: duet streams request and response bodies";
const HASH: &str = "rendezvous hashing of the key over the pods (a leaving pod moves only its keys); $remote_addr is the full IPv6 address, an IPv4-mapped peer counts as its IPv4 address; only $remote_addr, $binary_remote_addr, $request_uri, $uri, $host, $http_NAME, $cookie_NAME, $arg_NAME";
const NO_EQUIVALENT: &str = "no duet equivalent";
const PASSTHROUGH: &str = "needs --enable-ssl-passthrough, as ingress-nginx; connections whose TLS server name is an exact host of the Ingress go unterminated to a pod of the backend of the host's / rule (as ingress-nginx), picked by the balancer with the client's family first under the family policy; without a / rule the host's connections are terminated by duet (ingress-nginx relays them to its default backend); the Ingress's other annotations do not apply to the relayed connections, only to plain HTTP";
const LOGS: &str = "not implemented yet: the access log is global (--access-log)";

/// What duet does with a snippet key.
pub const SNIPPET_NOTE: &str = "raw nginx configuration is never interpreted: the Ingress is served without it (refused whole under --strict-annotations)";

/// Every key of ingress-nginx's final release, in its table's order (by group).
pub const KEYS: [Key; 137] = [
    key("server-alias", Unsupported(NOT_YET)),
    key("allowlist-source-range", Different(ACL)),
    key("backend-protocol", Different("HTTPS and GRPCS send SNI SERVICE.NAMESPACE.svc (ingress-nginx sends none) and, as ingress-nginx, do not verify the certificate unless duet.dev/backend-ca-secret is set; GRPC and GRPCS speak HTTP/2 for every request, not only gRPC")),
    key("auth-realm", Honoured),
    key("auth-secret", Honoured),
    key("auth-secret-type", Honoured),
    key("auth-type", Different(BASIC_AUTH)),
    key("canary", Honoured),
    key("canary-by-cookie", Honoured),
    key("canary-by-header", Honoured),
    key("canary-by-header-pattern", Different("Rust's regex crate, not PCRE (lookaround and backreferences are invalid-value); matched anywhere in the value, as ngx.re.match")),
    key("canary-by-header-value", Honoured),
    key("canary-weight", Honoured),
    key("canary-weight-total", Honoured),
    key("auth-tls-error-page", Honoured),
    key("auth-tls-match-cn", Different("Rust's regex crate, not PCRE (lookaround and backreferences are invalid-value, and an invalid value makes the routes answer 503)")),
    key("auth-tls-pass-certificate-to-upstream", Honoured),
    key("auth-tls-secret", Different(CLIENT_TLS)),
    key("auth-tls-verify-client", Honoured),
    key("auth-tls-verify-depth", Honoured),
    key("client-body-buffer-size", Unsupported(BUFFERING)),
    key("configuration-snippet", Snippet),
    key("connection-proxy-header", Unsupported(NOT_YET)),
    key("cors-allow-credentials", Honoured),
    key("cors-allow-headers", Honoured),
    key("cors-allow-methods", Honoured),
    key("cors-allow-origin", Different(CORS)),
    key("cors-expose-headers", Honoured),
    key("cors-max-age", Honoured),
    key("enable-cors", Different(CORS)),
    key("custom-http-errors", Unsupported(NOT_YET)),
    key("custom-headers", Unsupported(NOT_YET)),
    key("default-backend", Unsupported(NOT_YET)),
    key("denylist-source-range", Different(ACL)),
    key("disable-proxy-intercept-errors", Unsupported(NOT_YET)),
    key("enable-global-auth", Unsupported("duet has no global auth-url (ingress-nginx's ConfigMap global-auth-url): nothing to opt out of")),
    key("auth-always-set-cookie", Unsupported("not implemented yet: the auth response's Set-Cookie reaches the client with the responses nginx's add_header applies to (200, 201, 204, 206, 301 to 304, 307, 308) and the auth-signin redirect")),
    key("auth-cache-duration", Unsupported("not implemented yet: every request asks auth-url (no cache)")),
    key("auth-cache-key", Unsupported("not implemented yet: every request asks auth-url (no cache)")),
    key("auth-keepalive", Unsupported("not implemented yet: each auth request has its own connection")),
    key("auth-keepalive-requests", Unsupported("not implemented yet: each auth request has its own connection")),
    key("auth-keepalive-share-vars", Unsupported("not implemented yet: each auth request has its own connection")),
    key("auth-keepalive-timeout", Unsupported("not implemented yet: each auth request has its own connection")),
    key("auth-method", Honoured),
    key("auth-proxy-set-headers", Unsupported("not implemented yet: no extra headers are sent to auth-url")),
    key("auth-request-redirect", Honoured),
    key("auth-response-headers", Honoured),
    key("auth-signin", Different("$host, $escaped_request_uri and the other variables of auth-url are expanded; a 401 becomes 302 with rd= as ingress-nginx builds it")),
    key("auth-signin-redirect-param", Honoured),
    key("auth-snippet", Snippet),
    key("auth-url", Different(EXT_AUTH)),
    key("fastcgi-index", Unsupported(NO_EQUIVALENT)),
    key("fastcgi-params-configmap", Unsupported(NO_EQUIVALENT)),
    key("http2-push-preload", Unsupported(NO_EQUIVALENT)),
    key("load-balance", Unsupported("not implemented yet: every backend is balanced by --lb (p2c or round-robin)")),
    key("enable-access-log", Unsupported(LOGS)),
    key("enable-rewrite-log", Unsupported(NO_EQUIVALENT)),
    key("mirror-host", Unsupported(NOT_YET)),
    key("mirror-request-body", Unsupported(NOT_YET)),
    key("mirror-target", Unsupported(NOT_YET)),
    key("enable-modsecurity", Unsupported(NO_EQUIVALENT)),
    key("enable-owasp-core-rules", Unsupported(NO_EQUIVALENT)),
    key("modsecurity-snippet", Snippet),
    key("modsecurity-transaction-id", Unsupported(NO_EQUIVALENT)),
    key("enable-opentelemetry", Unsupported(NO_EQUIVALENT)),
    key("opentelemetry-operation-name", Unsupported(NO_EQUIVALENT)),
    key("opentelemetry-trust-incoming-span", Unsupported(NO_EQUIVALENT)),
    key("proxy-body-size", Honoured),
    key("proxy-buffer-size", Different("upstream response heads up to 32 KiB are accepted whatever the value (nginx answers 502 to a head larger than it); the bound is checked between reads, so a head arriving at once may pass up to about 40 KiB")),
    key("proxy-buffering", Honoured),
    key("proxy-buffers-number", Unsupported(BUFFERING)),
    key("proxy-busy-buffers-size", Unsupported(BUFFERING)),
    key("proxy-connect-timeout", Honoured),
    key("proxy-cookie-domain", Unsupported(NOT_YET)),
    key("proxy-cookie-path", Unsupported(NOT_YET)),
    key("proxy-http-version", Unsupported("not implemented yet: HTTP/1.1, or HTTP/2 by the Service port's appProtocol")),
    key("proxy-max-temp-file-size", Unsupported(BUFFERING)),
    key("proxy-next-upstream", Unsupported("not implemented yet: duet retries connect failures only (other family, then up to three pods)")),
    key("proxy-next-upstream-timeout", Unsupported(NOT_YET)),
    key("proxy-next-upstream-tries", Unsupported(NOT_YET)),
    key("proxy-read-timeout", Honoured),
    key("proxy-redirect-from", Unsupported(NOT_YET)),
    key("proxy-redirect-to", Unsupported(NOT_YET)),
    key("proxy-request-buffering", Honoured),
    key("proxy-send-timeout", Different("the clock runs only while the upstream does not take more of the request body that duet has to give (waiting on a slow client does not count); a request the upstream stalls on answers 504; unset, proxy-read-timeout (or --upstream-timeout) bounds the whole wait for the response head, sending included")),
    key("proxy-ssl-ciphers", Unsupported(PROXY_TLS)),
    key("proxy-ssl-name", Unsupported(PROXY_TLS)),
    key("proxy-ssl-protocols", Unsupported(PROXY_TLS)),
    key("proxy-ssl-secret", Unsupported(PROXY_TLS)),
    key("proxy-ssl-server-name", Unsupported(PROXY_TLS)),
    key("proxy-ssl-verify", Unsupported(PROXY_TLS)),
    key("proxy-ssl-verify-depth", Unsupported(PROXY_TLS)),
    key("limit-allowlist", Different(LIMIT)),
    key("limit-burst-multiplier", Honoured),
    key("limit-connections", Different(LIMIT)),
    key("limit-rate", Unsupported(RATE)),
    key("limit-rate-after", Unsupported(RATE)),
    key("limit-rpm", Different(LIMIT)),
    key("limit-rps", Different(LIMIT)),
    key("from-to-www-redirect", Different("308 to the other spelling keeping the scheme, the port the client wrote and the path as sent (nginx strips a trailing slash and writes its HTTPS port); served over HTTPS when the Ingress's TLS lists the other spelling too")),
    key("permanent-redirect", Honoured),
    key("permanent-redirect-code", Honoured),
    key("relative-redirects", Unsupported(REDIRECT)),
    key("temporal-redirect", Honoured),
    key("temporal-redirect-code", Honoured),
    key("app-root", Honoured),
    key("force-ssl-redirect", Different("the scheme is X-Forwarded-Proto from a --trusted-proxies peer, else the connection's (ingress-nginx's use-forwarded-headers); the Location keeps a trailing slash")),
    key("preserve-trailing-slash", Unsupported("duet's HTTPS redirect always keeps the path as sent")),
    key("rewrite-target", Different(REWRITE)),
    key("ssl-redirect", Different("the Location keeps a trailing slash (ingress-nginx strips it unless preserve-trailing-slash) and /.well-known/acme-challenge/ of the same Ingress is redirected too")),
    key("use-regex", Different(REGEX)),
    key("ssl-ciphers", Unsupported("duet offers rustls's TLS 1.2 and 1.3 suites")),
    key("ssl-prefer-server-ciphers", Unsupported("duet offers rustls's TLS 1.2 and 1.3 suites")),
    key("ssl-passthrough", Different(PASSTHROUGH)),
    key("satisfy", Unsupported("not implemented yet: every access check must pass (nginx's satisfy all)")),
    key("server-snippet", Snippet),
    key("service-upstream", Different("one target holding the Service's IPv4 and IPv6 cluster IPs (spec.clusterIPs): the client's family picks the cluster IP under the family policy; ingress-nginx uses spec.clusterIP only, the primary family")),
    key("affinity", Different(AFFINITY)),
    key("affinity-canary-behavior", Honoured),
    key("affinity-mode", Different("balanced and persistent both keep a session on its pod while the pod is ready; duet never moves sessions to new pods (ingress-nginx's balanced mode moves some)")),
    key("session-cookie-change-on-failure", Honoured),
    key("session-cookie-conditional-samesite-none", Unsupported(AFFINITY_LATER)),
    key("session-cookie-domain", Honoured),
    key("session-cookie-expires", Honoured),
    key("session-cookie-max-age", Honoured),
    key("session-cookie-name", Different("letters, digits and -._~ only (/ and : are not valid in a cookie name)")),
    key("session-cookie-partitioned", Unsupported(AFFINITY_LATER)),
    key("session-cookie-path", Honoured),
    key("session-cookie-samesite", Honoured),
    key("session-cookie-secure", Honoured),
    key("stream-snippet", Snippet),
    key("upstream-hash-by", Different(HASH)),
    key("upstream-hash-by-subset", Different(HASH)),
    key("upstream-hash-by-subset-size", Honoured),
    key("upstream-vhost", Different("a literal host only: nginx variables ($host, $service_name, ...) are invalid-value")),
    key("use-port-in-redirects", Unsupported(NOT_YET)),
    key("x-forwarded-prefix", Honoured),
];

/// ingress-nginx's aliases: `(alias, canonical key)`; the alias applies when the canonical key is
/// absent.
pub const ALIASES: [(&str, &str); 2] = [
    ("whitelist-source-range", "allowlist-source-range"),
    ("limit-whitelist", "limit-allowlist"),
];

/// Keys ingress-nginx removed, or never read as annotations, that still appear in manifests:
/// `(key, what happened to it)`. ingress-nginx ignored them silently.
pub const REMOVED: [(&str, &str); 20] = [
    ("secure-backends", "removed in ingress-nginx 0.18; backend-protocol: HTTPS replaced it (in duet: appProtocol https on the Service port)"),
    ("grpc-backend", "removed in ingress-nginx 0.18; backend-protocol: GRPC replaced it (in duet: appProtocol kubernetes.io/h2c on the Service port)"),
    ("add-base-url", "removed in ingress-nginx 0.22 with the rewrite rework"),
    ("base-url-scheme", "removed in ingress-nginx 0.22 with the rewrite rework"),
    ("session-cookie-hash", "removed from ingress-nginx; the affinity cookie is opaque"),
    ("upstream-max-fails", "removed from ingress-nginx (Lua balancer)"),
    ("upstream-fail-timeout", "removed from ingress-nginx (Lua balancer)"),
    ("enable-opentracing", "removed in ingress-nginx 1.10 (OpenTracing dropped)"),
    ("opentracing-trust-incoming-span", "removed in ingress-nginx 1.10 (OpenTracing dropped)"),
    ("opentracing-operation-name", "removed in ingress-nginx 1.10 (OpenTracing dropped)"),
    ("opentracing-location-operation-name", "removed in ingress-nginx 1.10 (OpenTracing dropped)"),
    ("global-rate-limit", "removed in ingress-nginx 1.12"),
    ("global-rate-limit-window", "removed in ingress-nginx 1.12"),
    ("global-rate-limit-key", "removed in ingress-nginx 1.12"),
    ("global-rate-limit-ignored-cidrs", "removed in ingress-nginx 1.12"),
    ("enable-influxdb", "removed from ingress-nginx"),
    ("influxdb-measurement", "removed from ingress-nginx"),
    ("influxdb-port", "removed from ingress-nginx"),
    ("influxdb-host", "removed from ingress-nginx"),
    ("influxdb-server-name", "removed from ingress-nginx"),
];

/// ConfigMap options of ingress-nginx that appear as annotations by mistake: `(key, note)`.
pub const CONFIGMAP_ONLY: [(&str, &str); 5] = [
    ("enable-websockets", "never an annotation of ingress-nginx: WebSocket upgrades always work, there and in duet"),
    ("use-forwarded-headers", "a ConfigMap option of ingress-nginx, never an annotation: see duet's --trusted-proxies"),
    ("large-client-header-buffers", "a ConfigMap option of ingress-nginx, never an annotation: duet accepts request heads up to 32 KiB"),
    ("client-header-buffer-size", "a ConfigMap option of ingress-nginx, never an annotation: duet accepts request heads up to 32 KiB"),
    ("use-proxy-protocol", "a ConfigMap option of ingress-nginx, never an annotation: see duet's --proxy-protocol"),
];

/// The catalogue entry of a key name (canonical names only).
pub fn find(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// The canonical key an alias stands for.
pub fn alias(name: &str) -> Option<&'static str> {
    ALIASES.iter().find(|(a, _)| *a == name).map(|(_, c)| *c)
}

/// What became of a key ingress-nginx removed.
pub fn removed(name: &str) -> Option<&'static str> {
    REMOVED
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, note)| *note)
}

/// What a ConfigMap option written as an annotation does.
pub fn configmap_only(name: &str) -> Option<&'static str> {
    CONFIGMAP_ONLY
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, note)| *note)
}

/// Every name ingress-nginx reads: the keys and the aliases.
pub fn known_names() -> impl Iterator<Item = &'static str> {
    KEYS.iter()
        .map(|k| k.name)
        .chain(ALIASES.iter().map(|(a, _)| *a))
}
