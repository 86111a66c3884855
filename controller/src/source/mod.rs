//! Sources of object changes. Each source sends [`SourceEvent`]s on one channel: batches of
//! [`Change`]s, and [`SourceEvent::Synced`] once its first full listing has been sent, so the app
//! never publishes a partial view. The manifest folder is one source, the Kubernetes API
//! ([`kube`]) the other; both feed the same index.

mod file_maps;
pub mod files;
pub mod kube;
mod lean;
pub mod secrets;
pub mod watch;
pub mod yaml_fast;
mod yaml_lite;

use crate::index::Change;

/// What a source reports.
#[derive(Clone, Debug, PartialEq)]
pub enum SourceEvent {
    /// Objects created, modified or deleted.
    Changes(Vec<Change>),
    /// The source has sent its complete initial state.
    Synced,
}
