//! Balancing over targets (one per pod, whatever its families), then the choice of the target's
//! address by family policy. Per-target state survives snapshot swaps, keyed by `TargetId`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::table::{Backend, BackendId, Family, FamilyPolicy, LbPolicy, Target, TargetId};

/// Consecutive connect failures of one family of one target before that family is ejected.
pub const EJECT_AFTER_FAILURES: u32 = 3;
/// How long an ejected family stays skipped (doubling per repeated ejection, capped at 8x).
pub const EJECT_BASE: Duration = Duration::from_secs(5);

/// Milliseconds on the balancer's clock (monotonic, process-wide): what the `*_at` methods take.
/// Never 0, so that 0 means "never ejected".
pub fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    // Offset by one so that 0 means "never ejected".
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Failure counts of one family of one target (its ejection deadline is in
/// the target's state, so that the state fits 32 bytes).
#[derive(Debug, Default)]
struct FamilyHealth {
    consecutive_failures: AtomicU16,
    ejections: AtomicU16,
}

/// Mutable state of one target, shared by every snapshot that contains it. 32 bytes: one per pod
/// and Service port, kept by every live backend in its [`TargetStates`].
#[derive(Debug, Default)]
pub struct TargetState {
    in_flight: AtomicU32,
    health: [FamilyHealth; 2],
    /// Per family: until when it is ejected (0: never).
    ejected_until_ms: [AtomicU64; 2],
}

fn slot(f: Family) -> usize {
    match f {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

impl TargetState {
    /// Requests in flight to this target, over both families.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether one family of this target is ejected now.
    pub fn is_ejected(&self, family: Family) -> bool {
        self.is_ejected_at(family, now_ms())
    }

    /// Whether one family of this target is ejected at `now` (see [`now_ms`]).
    pub fn is_ejected_at(&self, family: Family, now: u64) -> bool {
        self.ejected_until_ms[slot(family)].load(Ordering::Relaxed) > now
    }

    /// Records a connect failure over one family; returns true when it ejected that family.
    pub fn record_failure(&self, family: Family) -> bool {
        self.record_failure_at(family, now_ms())
    }

    /// [`Self::record_failure`] at `now` (see [`now_ms`]).
    pub fn record_failure_at(&self, family: Family, now: u64) -> bool {
        let h = &self.health[slot(family)];
        let n = u32::from(h.consecutive_failures.fetch_add(1, Ordering::Relaxed)) + 1;
        if n >= EJECT_AFTER_FAILURES {
            h.consecutive_failures.store(0, Ordering::Relaxed);
            let before = h
                .ejections
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |e| {
                    Some(e.saturating_add(1))
                })
                .unwrap_or(u16::MAX);
            let window = EJECT_BASE * (1 << before.min(3));
            self.ejected_until_ms[slot(family)]
                .store(now + window.as_millis() as u64, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Records a successful connect over one family, which clears its failure count.
    pub fn record_success(&self, family: Family) {
        self.record_success_at(family, now_ms())
    }

    /// [`Self::record_success`] at `now` (see [`now_ms`]): after the ejection window has passed
    /// it also clears the ejection count, so the next ejection lasts [`EJECT_BASE`] again.
    pub fn record_success_at(&self, family: Family, now: u64) {
        let h = &self.health[slot(family)];
        if h.consecutive_failures.load(Ordering::Relaxed) != 0 {
            h.consecutive_failures.store(0, Ordering::Relaxed);
        }
        if h.ejections.load(Ordering::Relaxed) != 0 && !self.is_ejected_at(family, now) {
            h.ejections.store(0, Ordering::Relaxed);
        }
    }
}

/// The states of a backend's targets, index-aligned with them. A backend's first build keeps
/// them in one block (one allocation per backend, where an `Arc` per target took 48 bytes and an
/// allocation each, plus a pointer); a rebuild with the same targets in the same order shares the
/// block; one that keeps some targets and adds others points each kept target at its state where
/// it lives and puts the new ones in a block of their own. A kept target's state is the same
/// object across rebuilds: requests in flight and failures counted on it carry over. A clone
/// shares the same states (no new block).
#[derive(Clone, Debug)]
pub struct TargetStates(States);

#[derive(Clone, Debug)]
enum States {
    /// Target `i`'s state is `block[i]`.
    Block(Arc<[TargetState]>),
    /// Target `i`'s state is where `refs[i]` says.
    Mixed(Box<[StateRef]>),
}

/// Where one target's state lives: a block and an index in it.
#[derive(Clone, Debug)]
struct StateRef {
    block: Arc<[TargetState]>,
    index: u32,
}

impl StateRef {
    fn get(&self) -> &TargetState {
        &self.block[self.index as usize]
    }
}

/// A block of `n` fresh states.
fn block(n: usize) -> Arc<[TargetState]> {
    (0..n).map(|_| TargetState::default()).collect()
}

impl TargetStates {
    /// The states of `targets`: those of `previous` (its targets and their states) for the
    /// targets it has, by [`TargetId`]; fresh ones for the others.
    fn new(targets: &[Target], previous: Option<(&[Target], &TargetStates)>) -> TargetStates {
        let Some((old, states)) = previous else {
            return TargetStates(States::Block(block(targets.len())));
        };
        let same = |(a, b): (&Target, &Target)| a.id == b.id;
        if old.len() == targets.len() && old.iter().zip(targets).all(same) {
            return states.clone();
        }
        let known: HashMap<&TargetId, usize> =
            old.iter().enumerate().map(|(i, t)| (&t.id, i)).collect();
        let kept = targets.iter().filter(|t| known.contains_key(&t.id)).count();
        if kept == 0 {
            return TargetStates(States::Block(block(targets.len())));
        }
        let fresh = block(targets.len() - kept);
        let mut next = 0u32;
        let refs = targets.iter().map(|t| match known.get(&t.id) {
            Some(&i) => states.at(i),
            None => {
                next += 1;
                StateRef {
                    block: fresh.clone(),
                    index: next - 1,
                }
            }
        });
        TargetStates(States::Mixed(refs.collect()))
    }

    /// Where target `i`'s state lives.
    fn at(&self, i: usize) -> StateRef {
        match &self.0 {
            States::Block(block) => StateRef {
                block: block.clone(),
                index: u32::try_from(i).unwrap_or(u32::MAX),
            },
            States::Mixed(refs) => refs[i].clone(),
        }
    }

    /// The number of targets.
    pub fn len(&self) -> usize {
        match &self.0 {
            States::Block(block) => block.len(),
            States::Mixed(refs) => refs.len(),
        }
    }

    /// Whether the backend has no target.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks one request in flight on target `i` until the guard drops.
    pub fn start(&self, i: usize) -> InFlight {
        let at = self.at(i);
        at.get().in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(at)
    }
}

impl std::ops::Index<usize> for TargetStates {
    type Output = TargetState;

    fn index(&self, i: usize) -> &TargetState {
        match &self.0 {
            States::Block(block) => &block[i],
            States::Mixed(refs) => refs[i].get(),
        }
    }
}

/// Counts a request as in flight on a target while alive.
#[derive(Debug)]
pub struct InFlight(StateRef);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.get().in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A backend with the live state of its targets: what the request path balances over. 80
/// bytes (one per backend, 10,000 at the 10k-Ingress size).
#[derive(Debug)]
pub struct LiveBackend {
    /// The backend as the snapshot describes it.
    pub backend: Arc<Backend>,
    /// State per target, index-aligned with `backend.targets`.
    pub states: TargetStates,
    /// The indices of the targets having IPv4, and IPv6, when not every target has it (`None`:
    /// all do, as in a dual-stack backend).
    having: [Option<Box<[u32]>>; 2],
    /// A round-robin counter per candidate set (every target, IPv4, IPv6), wrapping.
    rr: [AtomicU32; 3],
}

/// One candidate set of a backend: every target (no list kept: the common case for the set of
/// all targets, and for a family every target has), or the indices of those having a family.
#[derive(Clone, Copy, Debug)]
enum Candidates<'a> {
    /// Targets `0..n`.
    All(usize),
    /// These targets.
    Listed(&'a [u32]),
}

/// The indices of the targets having an address of `family`; `None` when all do.
fn having(targets: &[Target], family: Family) -> Option<Box<[u32]>> {
    if targets.iter().all(|t| t.addr(family).is_some()) {
        return None;
    }
    let listed = (0..targets.len()).filter(|&i| targets[i].addr(family).is_some());
    Some(listed.filter_map(|i| u32::try_from(i).ok()).collect())
}

impl Candidates<'_> {
    fn len(&self) -> usize {
        match self {
            Candidates::All(n) => *n,
            Candidates::Listed(listed) => listed.len(),
        }
    }

    /// The target index of the `k`th candidate (`k < len()`).
    fn at(&self, k: usize) -> usize {
        match self {
            Candidates::All(_) => k,
            Candidates::Listed(listed) => listed[k] as usize,
        }
    }
}

/// The outcome of a pick: a target and the addresses to try on it, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pick {
    /// Index into the backend's targets.
    pub index: usize,
    /// Addresses to try, best first: the preferred family, then the fallback when the policy
    /// allows it and the target has it.
    pub addrs: [Option<(Family, SocketAddr)>; 2],
}

impl LiveBackend {
    /// Builds the live view of a backend, reusing the state of targets already known.
    pub fn new(backend: Arc<Backend>, previous: Option<&LiveBackend>) -> LiveBackend {
        let old = previous.map(|p| (&*p.backend.targets, &p.states));
        let states = TargetStates::new(&backend.targets, old);
        let with = |f: Family| having(&backend.targets, f);
        let having = [with(Family::V4), with(Family::V6)];
        let rr = std::array::from_fn(|k| {
            AtomicU32::new(previous.map_or(0, |p| p.rr[k].load(Ordering::Relaxed)))
        });
        LiveBackend {
            backend,
            states,
            having,
            rr,
        }
    }

    /// The backend's id.
    pub fn id(&self) -> &BackendId {
        &self.backend.id
    }

    fn usable(
        &self,
        i: usize,
        client: Family,
        policy: FamilyPolicy,
        now: u64,
        healthy: bool,
    ) -> bool {
        let t = &self.backend.targets[i];
        let s = &self.states[i];
        policy
            .order(client)
            .into_iter()
            .flatten()
            .any(|f| t.addr(f).is_some() && (!healthy || !s.is_ejected_at(f, now)))
    }

    /// Picks a target for a client, skipping the indices in `tried`, and orders its addresses.
    /// Targets whose allowed families are all ejected are used only when nothing else is left.
    pub fn pick(&self, client: Family, policy: FamilyPolicy, tried: &[usize]) -> Option<Pick> {
        self.pick_at(client, policy, tried, now_ms())
    }

    /// [`Self::pick`] at `now` (see [`now_ms`]).
    pub fn pick_at(
        &self,
        client: Family,
        policy: FamilyPolicy,
        tried: &[usize],
        now: u64,
    ) -> Option<Pick> {
        let index = self
            .choose(client, policy, tried, now, true)
            .or_else(|| self.choose(client, policy, tried, now, false))?;
        Some(self.addresses(index, client, policy, now))
    }

    /// The addresses of a target chosen elsewhere ([`crate::policy`]), ordered as [`Self::pick`]
    /// orders them.
    pub fn pick_index(&self, index: usize, client: Family, policy: FamilyPolicy) -> Pick {
        self.addresses(index, client, policy, now_ms())
    }

    /// Whether a target has a family the policy allows that is not ejected now.
    pub fn is_usable(&self, index: usize, client: Family, policy: FamilyPolicy) -> bool {
        self.usable(index, client, policy, now_ms(), true)
    }

    /// The candidate set for a client: targets having the client's family under
    /// RequireSameFamily, every target otherwise (each has at least one address). Precomputed
    /// so that round robin is exact over the set and P2C samples only candidates.
    fn candidates(&self, client: Family, policy: FamilyPolicy) -> (Candidates<'_>, &AtomicU32) {
        let k = match policy {
            FamilyPolicy::RequireSameFamily => 1 + slot(client),
            _ => 0,
        };
        (self.candidate_set(k), &self.rr[k])
    }

    /// Candidate set `k`: every target (0), those having IPv4 (1), those having IPv6 (2).
    fn candidate_set(&self, k: usize) -> Candidates<'_> {
        match k.checked_sub(1).and_then(|f| self.having[f].as_deref()) {
            Some(listed) => Candidates::Listed(listed),
            None => Candidates::All(self.backend.targets.len()),
        }
    }

    fn choose(
        &self,
        client: Family,
        policy: FamilyPolicy,
        tried: &[usize],
        now: u64,
        healthy: bool,
    ) -> Option<usize> {
        let (set, rr) = self.candidates(client, policy);
        let n = set.len();
        if n == 0 {
            return None;
        }
        let ok = |i: usize| !tried.contains(&i) && self.usable(i, client, policy, now, healthy);
        match self.backend.lb {
            LbPolicy::RoundRobin => {
                let start = rr.fetch_add(1, Ordering::Relaxed) as usize;
                (0..n).map(|k| set.at((start + k) % n)).find(|&i| ok(i))
            }
            LbPolicy::P2c => {
                // Two distinct random candidates; the one with fewer requests in flight wins.
                // Resamples skip tried or ejected targets cheaply; a scan settles the rare rest.
                let first = match (0..4)
                    .map(|_| fastrand::usize(..n))
                    .find(|&k| ok(set.at(k)))
                {
                    Some(k) => k,
                    None => return self.scan(&set, &ok),
                };
                let second = (n > 1)
                    .then(|| {
                        (0..4)
                            .map(|_| {
                                let k = fastrand::usize(..n - 1);
                                if k >= first {
                                    k + 1
                                } else {
                                    k
                                }
                            })
                            .find(|&k| ok(set.at(k)))
                    })
                    .flatten();
                let (a, b) = (set.at(first), second.map(|k| set.at(k)));
                Some(match b {
                    Some(b) if self.states[b].in_flight() < self.states[a].in_flight() => b,
                    _ => a,
                })
            }
        }
    }

    /// A fair fallback when sampling found nothing: the least loaded usable candidate, ties
    /// broken from a random offset so that no target is favoured.
    fn scan(&self, set: &Candidates<'_>, ok: &impl Fn(usize) -> bool) -> Option<usize> {
        let n = set.len();
        let start = fastrand::usize(..n);
        (0..n)
            .map(|k| set.at((start + k) % n))
            .filter(|&i| ok(i))
            .min_by_key(|&i| self.states[i].in_flight())
    }

    fn addresses(&self, index: usize, client: Family, policy: FamilyPolicy, now: u64) -> Pick {
        let t: &Target = &self.backend.targets[index];
        let s = &self.states[index];
        let mut addrs: [Option<(Family, SocketAddr)>; 2] = [None, None];
        let allowed = policy.order(client);
        let mut k = 0;
        // Healthy families in policy order first, then ejected ones as a last resort.
        for want_healthy in [true, false] {
            for f in allowed.into_iter().flatten() {
                if let Some(a) = t.addr(f) {
                    if s.is_ejected_at(f, now) != want_healthy
                        && !addrs.iter().flatten().any(|(g, _)| *g == f)
                    {
                        addrs[k] = Some((f, a));
                        k += 1;
                    }
                }
            }
        }
        Pick { index, addrs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::UpstreamProtocol;

    #[test]
    fn per_target_state_is_small() {
        // One per pod and Service port: 100,000 at the 10k-Ingress scale.
        assert!(std::mem::size_of::<TargetState>() <= 32);
    }

    #[test]
    fn a_live_backend_is_small() {
        // One per backend (10,000 at the 10k-Ingress scale): 80 bytes and the `Arc`'s counts fill
        // jemalloc's 96-byte class.
        let size = std::mem::size_of::<LiveBackend>();
        assert!(size <= 80, "{size} bytes");
    }

    #[test]
    fn dual_stack_backends_keep_no_candidate_lists() {
        let dual = LiveBackend::new(
            backend(
                LbPolicy::RoundRobin,
                vec![
                    target("a", Some("10.0.0.1:80"), Some("[fd00::1]:80")),
                    target("b", Some("10.0.0.2:80"), Some("[fd00::2]:80")),
                ],
            ),
            None,
        );
        assert!(dual.having.iter().all(Option::is_none));
        assert!((0..3).all(|k| matches!(dual.candidate_set(k), Candidates::All(2))));
        let mixed = mixed(LbPolicy::RoundRobin);
        assert_eq!(mixed.candidate_set(1).len(), 2);
        assert_eq!(
            (mixed.candidate_set(2).at(0), mixed.candidate_set(2).at(1)),
            (0, 2)
        );
    }

    fn target(id: &str, v4: Option<&str>, v6: Option<&str>) -> Target {
        Target {
            id: TargetId(id.into()),
            v4: v4.map(|a| a.parse().unwrap()),
            v6: v6.map(|a| a.parse().unwrap()),
            zone: None,
        }
    }

    fn backend(lb: LbPolicy, targets: Vec<Target>) -> Arc<Backend> {
        Arc::new(Backend {
            id: "ns/svc:80".parse::<BackendId>().unwrap(),
            targets: targets.into(),
            lb,
            protocol: UpstreamProtocol::Http1,
        })
    }

    fn mixed(lb: LbPolicy) -> LiveBackend {
        LiveBackend::new(
            backend(
                lb,
                vec![
                    target("dual", Some("10.0.0.1:80"), Some("[fd00::1]:80")),
                    target("v4only", Some("10.0.0.2:80"), None),
                    target("v6only", None, Some("[fd00::3]:80")),
                ],
            ),
            None,
        )
    }

    #[test]
    fn same_family_is_preferred_and_falls_back() {
        let b = mixed(LbPolicy::RoundRobin);
        for _ in 0..30 {
            let p = b
                .pick(Family::V4, FamilyPolicy::PreferSameFamily, &[])
                .unwrap();
            let first = p.addrs[0].unwrap();
            let t = &b.backend.targets[p.index];
            if t.v4.is_some() {
                assert_eq!(first.0, Family::V4);
            } else {
                assert_eq!(
                    first.0,
                    Family::V6,
                    "an IPv6-only pod still serves IPv4 clients"
                );
            }
        }
    }

    #[test]
    fn require_same_family_never_crosses() {
        let b = mixed(LbPolicy::P2c);
        for _ in 0..200 {
            let p = b
                .pick(Family::V6, FamilyPolicy::RequireSameFamily, &[])
                .unwrap();
            assert_ne!(b.backend.targets[p.index].id.0.as_ref(), "v4only");
            assert_eq!(p.addrs[0].unwrap().0, Family::V6);
            assert_eq!(p.addrs[1], None);
        }
        let only_v4 = LiveBackend::new(
            backend(LbPolicy::P2c, vec![target("a", Some("10.0.0.1:80"), None)]),
            None,
        );
        assert_eq!(
            only_v4.pick(Family::V6, FamilyPolicy::RequireSameFamily, &[]),
            None
        );
    }

    #[test]
    fn each_pod_counts_once() {
        for lb in [LbPolicy::P2c, LbPolicy::RoundRobin] {
            let b = mixed(lb);
            let mut counts = [0u32; 3];
            for i in 0..3000 {
                let client = if i % 2 == 0 { Family::V4 } else { Family::V6 };
                counts[b
                    .pick(client, FamilyPolicy::PreferSameFamily, &[])
                    .unwrap()
                    .index] += 1;
            }
            for c in counts {
                assert!((850..=1150).contains(&c), "{lb:?}: {counts:?}");
            }
        }
    }

    #[test]
    fn p2c_prefers_the_less_loaded_target() {
        let b = LiveBackend::new(
            backend(
                LbPolicy::P2c,
                vec![
                    target("a", Some("10.0.0.1:80"), None),
                    target("b", Some("10.0.0.2:80"), None),
                ],
            ),
            None,
        );
        let _busy: Vec<_> = (0..5).map(|_| b.states.start(0)).collect();
        for _ in 0..100 {
            assert_eq!(
                b.pick(Family::V4, FamilyPolicy::PreferSameFamily, &[])
                    .unwrap()
                    .index,
                1
            );
        }
    }

    #[test]
    fn a_failing_family_is_ejected_and_the_other_used() {
        let b = mixed(LbPolicy::RoundRobin);
        let dual = 0;
        for _ in 0..EJECT_AFTER_FAILURES {
            b.states[dual].record_failure(Family::V6);
        }
        assert!(b.states[dual].is_ejected(Family::V6));
        let p = b.addresses(dual, Family::V6, FamilyPolicy::PreferSameFamily, now_ms());
        assert_eq!(p.addrs[0].unwrap().0, Family::V4);
        assert_eq!(
            p.addrs[1].unwrap().0,
            Family::V6,
            "ejected family kept as last resort"
        );
    }

    /// Fails a family of a target until it is ejected, at `now`; returns the window it got (ms).
    fn eject(s: &TargetState, family: Family, now: u64) -> u64 {
        for k in 1..EJECT_AFTER_FAILURES {
            assert!(
                !s.record_failure_at(family, now),
                "ejected after {k} failures"
            );
        }
        assert!(
            s.record_failure_at(family, now),
            "not ejected after 3 failures"
        );
        // The window ends where the family is no longer ejected.
        let end = (now..now + 100_000)
            .find(|&t| !s.is_ejected_at(family, t))
            .expect("ejected for more than 100 s");
        end - now
    }

    fn other(f: Family) -> Family {
        match f {
            Family::V4 => Family::V6,
            Family::V6 => Family::V4,
        }
    }

    #[test]
    fn an_ejection_lasts_5_s_then_the_family_is_used_again() {
        for family in [Family::V4, Family::V6] {
            let b = mixed(LbPolicy::RoundRobin);
            let s = &b.states[0];
            let t0 = 1_000;
            assert_eq!(eject(s, family, t0), 5_000, "{family:?}");
            assert!(
                !s.is_ejected_at(other(family), t0),
                "{family:?}: other family kept"
            );
            // While ejected, the dual-stack pod is reached over its other family first.
            let during = b.addresses(0, family, FamilyPolicy::PreferSameFamily, t0 + 4_999);
            assert_eq!(during.addrs[0].unwrap().0, other(family), "{family:?}");
            // From 5 s on, the client's own family comes first again.
            let after = b.addresses(0, family, FamilyPolicy::PreferSameFamily, t0 + 5_000);
            assert_eq!(after.addrs[0].unwrap().0, family, "{family:?}");
            assert_eq!(after.addrs[1].unwrap().0, other(family), "{family:?}");
        }
    }

    #[test]
    fn repeated_ejections_double_up_to_40_s() {
        for family in [Family::V4, Family::V6] {
            let s = TargetState::default();
            let mut now = 1_000;
            let mut windows = Vec::new();
            for _ in 0..6 {
                // Each repeat fails right when the last window ends, with no success between.
                let w = eject(&s, family, now);
                windows.push(w);
                now += w;
            }
            assert_eq!(
                windows,
                [5_000, 10_000, 20_000, 40_000, 40_000, 40_000],
                "{family:?}"
            );
            assert!(!s.is_ejected_at(other(family), now), "{family:?}");
        }
    }

    #[test]
    fn a_success_after_the_window_restarts_at_5_s() {
        for family in [Family::V4, Family::V6] {
            let s = TargetState::default();
            let mut now = 1_000;
            for _ in 0..3 {
                now += eject(&s, family, now);
            }
            // A success while still ejected (a last-resort attempt) does not forgive the count:
            // the next ejection keeps the 40 s cap.
            s.record_success_at(family, now - 1);
            now += eject(&s, family, now);
            s.record_success_at(family, now - 1);
            assert_eq!(eject(&s, family, now), 40_000, "{family:?}");
            now += 40_000;
            // Recovered: a success once the window is over, then 3 new failures: 5 s again.
            s.record_success_at(family, now);
            assert!(!s.is_ejected_at(family, now), "{family:?}");
            assert_eq!(
                eject(&s, family, now + 60_000),
                5_000,
                "{family:?}: recovered"
            );
        }
    }

    #[test]
    fn picks_skip_a_pod_whose_only_family_is_ejected_until_it_expires() {
        for family in [Family::V4, Family::V6] {
            let b = mixed(LbPolicy::RoundRobin);
            // The pod having only `family`, under RequireSameFamily with a `family` client.
            let only = if family == Family::V4 { 1 } else { 2 };
            let t0 = 1_000;
            eject(&b.states[only], family, t0);
            let picks = |now| -> Vec<usize> {
                (0..20)
                    .map(|_| {
                        b.pick_at(family, FamilyPolicy::RequireSameFamily, &[], now)
                            .unwrap()
                            .index
                    })
                    .collect()
            };
            assert!(
                !picks(t0 + 4_999).contains(&only),
                "{family:?}: ejected pod picked"
            );
            assert!(
                picks(t0 + 5_000).contains(&only),
                "{family:?}: pod not back after 5 s"
            );
        }
    }

    #[test]
    fn state_survives_a_swap() {
        let old = mixed(LbPolicy::P2c);
        let _guard = old.states.start(1);
        let mut targets: Vec<Target> = old.backend.targets.to_vec();
        targets.reverse();
        targets.push(target("new", Some("10.0.0.9:80"), None));
        let new = LiveBackend::new(backend(LbPolicy::P2c, targets), Some(&old));
        let i = new
            .backend
            .targets
            .iter()
            .position(|t| t.id.0.as_ref() == "v4only")
            .unwrap();
        assert_eq!(new.states[i].in_flight(), 1);
        assert_eq!(new.states[3].in_flight(), 0);
    }

    #[test]
    fn states_are_one_block_per_build_and_kept_targets_keep_theirs() {
        let first = mixed(LbPolicy::P2c);
        assert!(matches!(first.states.0, States::Block(_)));
        // Same targets, new addresses: the block is shared.
        let moved: Vec<Target> = first
            .backend
            .targets
            .iter()
            .map(|t| Target {
                v4: t.v4.map(|a| std::net::SocketAddrV4::new(*a.ip(), 8080)),
                ..t.clone()
            })
            .collect();
        let same = LiveBackend::new(backend(LbPolicy::P2c, moved), Some(&first));
        assert!(matches!(&same.states.0, States::Block(b)
            if matches!(&first.states.0, States::Block(a) if Arc::ptr_eq(a, b))));
        // One target leaves, one comes: kept targets point at their states in the first block.
        let busy = first.states.start(2);
        let mut targets: Vec<Target> = first.backend.targets[1..].to_vec();
        targets.push(target("new", None, Some("[fd00::9]:80")));
        let second = LiveBackend::new(backend(LbPolicy::P2c, targets.clone()), Some(&same));
        assert!(matches!(second.states.0, States::Mixed(_)));
        assert_eq!(second.states.len(), 3);
        assert!(std::ptr::eq(&second.states[1], &first.states[2]));
        assert_eq!(second.states[1].in_flight(), 1);
        assert_eq!(second.states[2].in_flight(), 0);
        // A request started before the rebuild ends after it: counted off the same state.
        drop(busy);
        assert_eq!(second.states[1].in_flight(), 0);
        let during = second.states.start(0);
        assert_eq!(first.states[1].in_flight(), 1);
        // A third build keeps them again, the new target's state too.
        targets.reverse();
        let third = LiveBackend::new(backend(LbPolicy::P2c, targets), Some(&second));
        assert!(std::ptr::eq(&third.states[2], &first.states[1]));
        assert!(std::ptr::eq(&third.states[0], &second.states[2]));
        assert_eq!(third.states[2].in_flight(), 1);
        drop(during);
        assert_eq!(third.states[2].in_flight(), 0);
        // No target kept: a fresh block.
        let other = vec![target("x", Some("10.0.0.7:80"), None)];
        let fresh = LiveBackend::new(backend(LbPolicy::P2c, other), Some(&third));
        assert!(matches!(fresh.states.0, States::Block(_)));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// A pod shape: 0 dual-stack, 1 IPv4-only, 2 IPv6-only.
        fn pods(shapes: &[u8]) -> Vec<Target> {
            shapes
                .iter()
                .enumerate()
                .map(|(i, shape)| {
                    let v4 = format!("10.0.{}.{}:80", i / 250, i % 250 + 1);
                    let v6 = format!("[fd00::{:x}]:80", i + 1);
                    match shape {
                        0 => target(&format!("p{i}"), Some(&v4), Some(&v6)),
                        1 => target(&format!("p{i}"), Some(&v4), None),
                        _ => target(&format!("p{i}"), None, Some(&v6)),
                    }
                })
                .collect()
        }

        fn policies() -> impl Strategy<Value = FamilyPolicy> {
            prop_oneof![
                Just(FamilyPolicy::PreferSameFamily),
                Just(FamilyPolicy::RequireSameFamily),
                Just(FamilyPolicy::PreferIpv4),
                Just(FamilyPolicy::PreferIpv6),
            ]
        }

        proptest! {
            /// Whatever the mix, a pick's addresses follow the policy: the first is the most
            /// preferred family the target has, RequireSameFamily never crosses, and no address
            /// repeats.
            #[test]
            fn picks_follow_the_family_policy(
                shapes in proptest::collection::vec(0u8..3, 1..40),
                policy in policies(),
                v6_client in any::<bool>(),
                lb in prop_oneof![Just(LbPolicy::P2c), Just(LbPolicy::RoundRobin)],
            ) {
                let client = if v6_client { Family::V6 } else { Family::V4 };
                let b = LiveBackend::new(backend(lb, pods(&shapes)), None);
                let admitted = b.backend.targets.iter().filter(|t| policy.admits(t, client)).count();
                match b.pick(client, policy, &[]) {
                    None => prop_assert_eq!(admitted, 0),
                    Some(p) => {
                        let t = &b.backend.targets[p.index];
                        prop_assert!(policy.admits(t, client));
                        let order: Vec<Family> = policy.order(client).into_iter().flatten().collect();
                        let expected: Vec<Family> = order.iter().copied().filter(|f| t.addr(*f).is_some()).collect();
                        let got: Vec<Family> = p.addrs.iter().flatten().map(|(f, _)| *f).collect();
                        prop_assert_eq!(got, expected);
                        for (f, a) in p.addrs.iter().flatten() {
                            prop_assert_eq!(Family::of(a), *f);
                        }
                    }
                }
            }

            /// One target per pod: over many picks every admitted pod gets its share, whether it
            /// has one family or two.
            #[test]
            fn every_admitted_pod_gets_a_fair_share(
                shapes in proptest::collection::vec(0u8..3, 2..8),
                policy in policies(),
            ) {
                let b = LiveBackend::new(backend(LbPolicy::RoundRobin, pods(&shapes)), None);
                let mut counts = vec![0usize; shapes.len()];
                let rounds = 40;
                for client in [Family::V4, Family::V6] {
                    let admitted = b.backend.targets.iter().filter(|t| policy.admits(t, client)).count();
                    for _ in 0..admitted * rounds {
                        if let Some(p) = b.pick(client, policy, &[]) {
                            counts[p.index] += 1;
                        }
                    }
                }
                for (i, t) in b.backend.targets.iter().enumerate() {
                    let clients = [Family::V4, Family::V6].iter().filter(|c| policy.admits(t, **c)).count();
                    // Round robin over the admitted set: each admitted pod exactly `rounds` per family.
                    prop_assert_eq!(counts[i], clients * rounds, "pod {} counts {:?}", i, counts);
                }
            }
        }
    }
}
