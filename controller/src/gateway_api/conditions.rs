//! Status conditions as the Gateway API wants them: `observedGeneration` of the spec they judge,
//! `lastTransitionTime` kept while the status does not change.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// A condition before it is dated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cond {
    /// `type`.
    pub kind: &'static str,
    /// `status` is `"True"`.
    pub status: bool,
    /// `reason`.
    pub reason: &'static str,
    /// `message`.
    pub message: String,
}

impl Cond {
    /// A condition that holds.
    pub fn yes(kind: &'static str, reason: &'static str, message: impl Into<String>) -> Cond {
        Cond {
            kind,
            status: true,
            reason,
            message: message.into(),
        }
    }

    /// A condition that does not hold.
    pub fn no(kind: &'static str, reason: &'static str, message: impl Into<String>) -> Cond {
        Cond {
            kind,
            status: false,
            reason,
            message: message.into(),
        }
    }
}

/// The conditions to write: each carries `generation`; its `lastTransitionTime` is the old
/// one's when the old condition of that type had the same status, else `now`.
pub fn dated(
    conds: &[Cond],
    generation: Option<i64>,
    old: &[Condition],
    now: Timestamp,
) -> Vec<Condition> {
    conds
        .iter()
        .map(|c| {
            let status = if c.status { "True" } else { "False" };
            let since = old
                .iter()
                .find(|o| o.type_ == c.kind && o.status == status)
                .map_or(Time(now), |o| o.last_transition_time.clone());
            Condition {
                type_: c.kind.to_owned(),
                status: status.to_owned(),
                reason: c.reason.to_owned(),
                message: c.message.clone(),
                observed_generation: generation,
                last_transition_time: since,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_is_kept_while_the_status_holds() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let first = dated(&[Cond::yes("Accepted", "Accepted", "ok")], Some(1), &[], t0);
        assert_eq!(first[0].last_transition_time, Time(t0));
        let same = dated(
            &[Cond::yes("Accepted", "Accepted", "ok")],
            Some(2),
            &first,
            t1,
        );
        assert_eq!(same[0].last_transition_time, Time(t0));
        assert_eq!(same[0].observed_generation, Some(2));
        let flipped = dated(&[Cond::no("Accepted", "Invalid", "no")], Some(3), &same, t1);
        assert_eq!(flipped[0].last_transition_time, Time(t1));
        assert_eq!(flipped[0].status, "False");
    }
}
