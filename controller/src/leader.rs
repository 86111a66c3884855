//! Leader election over a `coordination.k8s.io/v1` Lease: one replica at a time writes Ingress
//! status and Events.
//!
//! kube 5 has no election helper, so this is the client-go algorithm in small: every
//! `lease_duration / 3` a replica reads the Lease; the holder renews it (a replace with the
//! read `resourceVersion`, so a concurrent writer gets 409 Conflict and loses); another replica
//! takes it over only once the holder has not renewed for a whole `lease_duration` **as observed
//! on its own clock** (the Lease's `resourceVersion` did not change), never by comparing
//! timestamps written by other machines. Every request is bounded by the retry period (a hung
//! API server cannot hold an attempt), and a holder whose renewal has not succeeded within two
//! thirds of `lease_duration` (the renew deadline, measured from the start of its last successful
//! renewal) steps down on its own timer, even while a request is still in flight, before anyone
//! can take over. On shutdown the leader releases the Lease (empty holder), so another replica
//! takes over at its next attempt instead of waiting for expiry.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

/// The Lease's name unless `--election-id` names another.
pub const LEASE_NAME: &str = "duet-leader";

/// Where and how to elect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity (pod name or host name, plus a random suffix).
    pub identity: String,
    /// How long a Lease lasts without renewal.
    pub lease_duration: Duration,
}

impl ElectionConfig {
    /// How long a leader that cannot renew keeps acting as leader: two thirds of the lease
    /// duration, so it has stepped down before another replica can take over.
    pub fn renew_deadline(&self) -> Duration {
        self.lease_duration * 2 / 3
    }

    /// How often the Lease is read, renewed or tried.
    pub fn retry_period(&self) -> Duration {
        (self.lease_duration / 3).max(Duration::from_millis(100))
    }
}

/// A unique identity for this process: `POD_NAME` or the host name, and a random suffix.
pub fn identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "duet".to_owned());
    format!("{base}-{:08x}", fastrand::u32(..))
}

/// Whether this replica leads; dropped or released to step down.
#[derive(Debug)]
pub struct Elector {
    leading: watch::Receiver<bool>,
    release: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Elector {
    /// Whether this replica leads now, to watch for changes.
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// Steps down: stops renewing and, when leading, releases the Lease (waits at most
    /// `timeout`).
    pub async fn release(self, timeout: Duration) {
        let _ = self.release.send(true);
        let _ = tokio::time::timeout(timeout, self.task).await;
    }
}

/// What the last attempt learnt about the Lease.
#[derive(Debug, Default)]
struct Observed {
    /// The `resourceVersion` last seen and when it was first seen.
    version: Option<(String, Instant)>,
}

/// Starts electing; the returned elector says whether this replica leads.
///
/// Every API request is bounded by the retry period ([`bounded`]). While leading, a timer runs
/// out `renew_deadline` after the start of the last successful renewal: this replica steps down
/// then, whether or not the attempt in flight has answered, so it has stopped acting as leader
/// before another replica (which waits a whole lease duration from when it saw that renewal) can
/// take over.
pub fn spawn(api: Api<Lease>, config: ElectionConfig) -> Elector {
    let (leading_tx, leading) = watch::channel(false);
    let (release, mut released) = watch::channel(false);
    let task = tokio::spawn(async move {
        let mut observed = Observed::default();
        // When the last successful renewal started, while leading.
        let mut renewed_at: Option<Instant> = None;
        loop {
            let started = Instant::now();
            let attempt = attempt(&api, &config, &mut observed, started);
            let Some(outcome) = guarded(
                attempt,
                &leading_tx,
                &config,
                &mut renewed_at,
                &mut released,
            )
            .await
            else {
                break;
            };
            match outcome {
                Ok(true) => renewed_at = Some(started),
                Ok(false) => renewed_at = None,
                Err(error) => {
                    tracing::warn!(lease = %config.name, %error, "Lease update failed");
                    // Still leading until the renew deadline, well before the Lease can expire
                    // for the others.
                }
            }
            if renewed_at.is_some_and(|at| Instant::now() >= at + config.renew_deadline()) {
                renewed_at = None;
            }
            set_leading(&leading_tx, &config, renewed_at.is_some());
            let pause = tokio::time::sleep(config.retry_period());
            if guarded(pause, &leading_tx, &config, &mut renewed_at, &mut released)
                .await
                .is_none()
            {
                break;
            }
        }
        if *leading_tx.borrow() {
            leading_tx.send_replace(false);
            match bounded(&config, release_lease(&api, &config)).await {
                Ok(()) => tracing::info!(lease = %config.name, "Lease released"),
                Err(error) => tracing::warn!(lease = %config.name, %error, "Lease release failed"),
            }
        }
    });
    Elector {
        leading,
        release,
        task,
    }
}

/// Runs `work` (an attempt, or the pause between attempts) while the step-down timer runs: when
/// the renew deadline passes first, this replica steps down at once and `work` goes on. `None`
/// when the elector is released meanwhile.
async fn guarded<T>(
    work: impl std::future::Future<Output = T>,
    leading: &watch::Sender<bool>,
    config: &ElectionConfig,
    renewed_at: &mut Option<Instant>,
    released: &mut watch::Receiver<bool>,
) -> Option<T> {
    let mut work = std::pin::pin!(work);
    loop {
        let step_down_at = renewed_at.map(|at| at + config.renew_deadline());
        tokio::select! {
            out = &mut work => return Some(out),
            () = sleep_until(step_down_at), if step_down_at.is_some() => {
                step_down(leading, config, renewed_at);
            }
            _ = released.changed() => return None,
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The renew deadline passed without a successful renewal: stop acting as leader now.
fn step_down(
    leading: &watch::Sender<bool>,
    config: &ElectionConfig,
    renewed_at: &mut Option<Instant>,
) {
    tracing::warn!(
        lease = %config.name,
        deadline = ?config.renew_deadline(),
        "Lease not renewed within the renew deadline; stepping down"
    );
    *renewed_at = None;
    set_leading(leading, config, false);
}

fn set_leading(leading: &watch::Sender<bool>, config: &ElectionConfig, leads: bool) {
    leading.send_if_modified(|was| {
        if *was == leads {
            return false;
        }
        if leads {
            tracing::info!(lease = %config.name, identity = %config.identity, "Leading");
        } else {
            tracing::info!(lease = %config.name, identity = %config.identity, "No longer leading");
        }
        *was = leads;
        true
    });
}

/// Why an election request failed.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// The API answered with an error, or could not be reached.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// No answer within the retry period.
    #[error("no answer from the API within {0:?}")]
    Timeout(Duration),
}

/// One API request, given at most the retry period.
async fn bounded<T>(
    config: &ElectionConfig,
    request: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, ElectionError> {
    let limit = config.retry_period();
    match tokio::time::timeout(limit, request).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(ElectionError::Timeout(limit)),
    }
}

fn micro_now() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn lease_seconds(config: &ElectionConfig) -> i32 {
    i32::try_from(config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// One read and, when due, one write; returns whether this replica holds the Lease after it.
async fn attempt(
    api: &Api<Lease>,
    config: &ElectionConfig,
    observed: &mut Observed,
    now: Instant,
) -> Result<bool, ElectionError> {
    let Some(mut lease) = bounded(config, api.get_opt(&config.name)).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(config.identity.clone()),
                lease_duration_seconds: Some(lease_seconds(config)),
                acquire_time: Some(micro_now()),
                renew_time: Some(micro_now()),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match bounded(config, api.create(&PostParams::default(), &lease)).await {
            Ok(_) => Ok(true),
            Err(ElectionError::Api(e)) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        };
    };
    let version = lease.metadata.resource_version.clone().unwrap_or_default();
    let changed = observed.version.as_ref().is_none_or(|(v, _)| *v != version);
    if changed {
        observed.version = Some((version, now));
    }
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let ours = holder.as_deref() == Some(&*config.identity);
    if !ours && holder.is_some() {
        let duration = spec
            .lease_duration_seconds
            .filter(|s| *s > 0)
            .map_or(config.lease_duration, |s| {
                Duration::from_secs(u64::try_from(s).unwrap_or(1))
            });
        let since = observed.version.as_ref().map_or(now, |(_, at)| *at);
        if now - since < duration {
            return Ok(false);
        }
        tracing::info!(lease = %config.name, previous = holder.as_deref().unwrap_or(""), "Lease expired; taking over");
    }
    if !ours {
        spec.holder_identity = Some(config.identity.clone());
        spec.acquire_time = Some(micro_now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.lease_duration_seconds = Some(lease_seconds(config));
    spec.renew_time = Some(micro_now());
    match bounded(
        config,
        api.replace(&config.name, &PostParams::default(), &lease),
    )
    .await
    {
        Ok(written) => {
            observed.version = written.metadata.resource_version.map(|v| (v, now));
            Ok(true)
        }
        Err(ElectionError::Api(e)) if is_conflict(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Empties the holder so that another replica takes over at once.
async fn release_lease(api: &Api<Lease>, config: &ElectionConfig) -> Result<(), kube::Error> {
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        return Ok(());
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(&*config.identity) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.renew_time = Some(micro_now());
    api.replace(&config.name, &PostParams::default(), &lease)
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_unique_and_retry_is_a_third() {
        assert_ne!(identity(), identity());
        let config = ElectionConfig {
            namespace: "duet".to_owned(),
            name: LEASE_NAME.to_owned(),
            identity: identity(),
            lease_duration: Duration::from_secs(15),
        };
        assert_eq!(config.retry_period(), Duration::from_secs(5));
        assert_eq!(config.renew_deadline(), Duration::from_secs(10));
    }
}
