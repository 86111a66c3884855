//! The shape of a test pod: which of its families listen, are listed but refuse connections, or
//! are absent (`listen`, `closed`, `absent`). duet's dual-stack features use it for IPv4-only,
//! IPv6-only and half-broken pods; the stand-in kubelet reads it from the Pod annotation
//! [`crate::cluster::POD_SHAPE_ANNOTATION`].

use anyhow::bail;
use serde::{Deserialize, Serialize};

use crate::echo::Family;
use crate::fleet::{PodSpec, Port};

/// One pod's shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodShape {
    /// The pod name.
    pub name: String,
    /// `listen`, `closed` or `absent`.
    pub ipv4: String,
    /// `listen`, `closed` or `absent`.
    pub ipv6: String,
}

/// The [`Port`] of a word of [`PodShape`]: `listen`, `closed` or `absent`.
pub fn port_of(word: &str) -> anyhow::Result<Port> {
    Ok(match word {
        "listen" => Port::Listen,
        "closed" => Port::Closed,
        "absent" => Port::Absent,
        "hangup" => Port::Hangup,
        other => bail!("{other:?} is not listen, closed, hangup or absent"),
    })
}

fn word_of(port: Port) -> &'static str {
    match port {
        Port::Listen => "listen",
        Port::Closed => "closed",
        Port::Absent => "absent",
        Port::Hangup => "hangup",
    }
}

impl PodShape {
    /// The shape of a pod spec.
    pub fn of(spec: &PodSpec) -> PodShape {
        PodShape {
            name: spec.name.clone(),
            ipv4: word_of(spec.v4).into(),
            ipv6: word_of(spec.v6).into(),
        }
    }

    /// The pod spec of a shape.
    pub fn spec(&self) -> anyhow::Result<PodSpec> {
        Ok(PodSpec::dual(&self.name)
            .with(Family::V4, port_of(&self.ipv4)?)
            .with(Family::V6, port_of(&self.ipv6)?))
    }
}
