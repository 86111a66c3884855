//! What a route applies to a request besides routing, configured by plain data on the route:
//! access ([`access`]: ingress-nginx's rate limits, basic and external auth, checked before a
//! target is chosen) and steering ([`steer`]: canary backends, session affinity, consistent
//! hashing, the upstream `Host`, CORS).

pub mod access;
pub mod affinity;
pub mod basic_auth;
pub mod canary;
pub mod cors;
pub mod ext_auth;
pub mod hash;
pub mod rate_limit;
pub mod steer;

pub use access::{Admission, Client, Gate, Refusal};
pub use steer::{
    cookie, cors_for, mix, preflight, respond, set_upstream_host, stable_hash, steer,
    steer_request, upstream_host, Backends, RequestView, Steered,
};
