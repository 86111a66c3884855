//! duet's control loop: sources of Kubernetes objects (a manifest folder or the Kubernetes API),
//! the object index, which Ingresses are ours, the pure translation to a dataplane snapshot, the
//! debounced loop that publishes it, and in Kubernetes mode leader election, Ingress status and
//! Events; plus the command line of the `duet` binary, and the reference pages rendered from the
//! code.

pub mod app;
pub mod class;
pub mod cluster;
pub mod compact;
pub mod config;
pub mod events;
pub mod gateway;
pub mod gateway_api;
pub mod http3;
pub mod index;
pub mod leader;
pub mod metrics;
pub mod migrate;
pub mod namespaces;
pub mod object;
pub mod reference;
pub mod resolve;
pub mod slices;
pub mod source;
pub mod status;
pub mod stored;
pub mod translate;
pub mod units;
