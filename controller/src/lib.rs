//! duet's control loop: sources of Kubernetes objects (a manifest folder now, the API later), the
//! object index, which Ingresses are ours, the pure translation to a dataplane snapshot, the
//! debounced loop that publishes it, and the command line of the `duet` binary.

pub mod app;
pub mod class;
pub mod cluster;
pub mod config;
pub mod index;
pub mod source;
pub mod translate;
