//! Gateway API support (issue 14, in progress): the API types so far; the GatewayProcessor,
//! the per-Gateway Services and status follow (README, "Gateway API (in progress)").

pub mod api;
