//! What a route applies to a request besides routing, configured by plain data on the route
//! ([`crate::access_policy`], [`crate::route_policy`]): access ([`access`]: ingress-nginx's rate
//! limits, basic and external auth, checked in the proxy's admit phase) and steering ([`steer`]:
//! canary backends, session affinity, consistent hashing, the upstream `Host`, CORS, in its
//! choose and respond phases). Nothing here is imported by the contract (`table`).

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
