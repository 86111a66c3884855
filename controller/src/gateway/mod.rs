//! Gateway API support: the API types, GatewayClasses of our controller
//! accepted, each Gateway of our classes given its own addresses of both families through a
//! LoadBalancer Service duet manages, with the Gateway's status, and the status of the routes
//! attached to them (served through `translate::gateway`; README, "Gateway API").

pub mod class;
pub mod config;
pub mod controller;
pub mod listener_set_status;
pub mod policy_status;
pub mod ports;
pub mod route_status;
pub mod scope;
pub mod service;

pub use config::{GatewayArgs, GatewayConfig, DEFAULT_CONTROLLER_NAME};
pub use controller::spawn;
