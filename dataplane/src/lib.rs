//! duet's dataplane: the routing snapshot types, dual-stack listeners, the per-target balancer,
//! the HTTP proxy and the admin endpoints. It never talks to Kubernetes: the controller hands it
//! whole snapshots through [`Runtime::apply`].

pub mod access_log;
pub mod access_policy;
pub mod admin;
pub mod alt_svc;
pub mod balance;
pub mod cidr;
pub mod client_auth;
pub mod client_body;
pub mod client_hello;
pub mod clock;
pub mod conn;
pub mod error;
pub mod filters;
pub mod forwarded;
pub mod gateway_listen;
pub mod h1;
pub mod h2_write;
pub mod handshake;
pub mod host;
pub mod http3;
pub mod idle;
pub mod limits;
pub mod listen;
pub mod metrics;
mod names;
pub mod observe;
pub mod park;
pub mod passthrough;
pub mod path;
pub mod policy;
pub mod proxy;
pub mod proxy_protocol;
pub mod ptr_key;
pub mod read_timeout;
pub mod request_match;
pub mod route_policy;
pub mod runtime;
pub mod send_watch;
pub mod table;
pub mod tls;
pub mod tunnel;
pub mod upstream;
pub mod upstream_tls;
pub mod x509;

pub use runtime::{Live, PreparedRoutes, ProxyConfig, Runtime};
pub use table::{
    Backend, BackendId, BackendMap, Family, FamilyPolicy, LbPolicy, Origin, OriginKind, PathMatch,
    PathRule, RouteAction, RouteTable, Snapshot, Target, TargetId, TargetKey, TargetV6,
};
