//! `duet-conformance`: runs Ingress conformance `.feature` files (the upstream ones unmodified,
//! and duet's own) with cucumber against the real control plane (or a `--kubeconfig` cluster), once per
//! address family.

pub mod cluster;
pub mod expect;
pub mod gateway;
pub mod gateway_images;
pub mod gateway_report;
pub mod kube_api;
pub mod node_load;
pub mod node_scenarios;
pub mod parse;
pub mod pod_shape;
pub mod steps;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use cucumber::event::ScenarioFinished;
use cucumber::{StatsWriter, World as _};

use crate::echo::Family;
use steps::{ConformanceWorld, Shared, SHARED};

/// Which families to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Profile {
    /// Connect to the IPv4 status address.
    Ipv4,
    /// Connect to the IPv6 status address.
    Ipv6,
    /// Both, in sequence.
    Both,
}

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "duet-conformance",
    about = "Run Ingress conformance features against duet"
)]
pub struct Cli {
    /// Feature files or folders (default: the upstream features beside the checkout).
    #[arg(value_name = "PATH")]
    pub features: Vec<PathBuf>,
    /// Address family profile.
    #[arg(long, value_enum, default_value = "both")]
    pub family: Profile,
    /// How long the ingress_class scenario waits for a status that must not appear.
    #[arg(long, value_name = "SECONDS", default_value = "30")]
    pub ingress_class_wait: u64,
    /// How long a status address may take to appear.
    #[arg(long, value_name = "SECONDS", default_value = "60")]
    pub status_timeout: u64,
    /// The duet binary (default: `duet` next to this program; not with --kubeconfig).
    #[arg(long, value_name = "PATH")]
    pub duet: Option<PathBuf>,
    /// Test a real cluster: create the backends there and read the status that the controller
    /// under test writes, instead of starting a control plane and duet.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The IngressClass Ingresses name by default (with --kubeconfig it must exist).
    #[arg(long, value_name = "NAME", default_value = cluster::INGRESS_CLASS)]
    pub ingress_class: String,
    /// The IngressClass's `spec.controller`, which duet is started with (`--controller-name`;
    /// not with --kubeconfig): `k8s.io/ingress-nginx` with `--ingress-class nginx` runs the
    /// features with the settings of an ingress-nginx takeover.
    #[arg(long, value_name = "NAME", default_value = cluster::CONTROLLER)]
    pub controller_name: String,
    /// Run the backends as containers on a real node (kubelet, containerd, CNI, kube-proxy:
    /// conformance/node/build.sh) instead of the stand-in kubelet's in-process echo servers;
    /// the echo image is built from `duet-echo` beside `--duet`. Pods of one family (duet's
    /// own features that name a pod's families) need the stand-in kubelet.
    #[arg(long, conflicts_with = "kubeconfig")]
    pub real_node: bool,
    /// The echo backend image of the Deployments (with --kubeconfig).
    #[arg(long, value_name = "IMAGE", default_value = cluster::ECHO_IMAGE)]
    pub echo_image: String,
    /// The port of the status addresses for http:// (with --kubeconfig).
    #[arg(long, value_name = "PORT", default_value = "80")]
    pub http_port: u16,
    /// The port of the status addresses for https:// (with --kubeconfig).
    #[arg(long, value_name = "PORT", default_value = "443")]
    pub https_port: u16,
    /// How long a backend Deployment may take to become available.
    #[arg(long, value_name = "SECONDS", default_value = "300")]
    pub ready_timeout: u64,
    /// After scaling a Deployment, how long the controller gets to see the new endpoints (with
    /// --kubeconfig; as upstream, 60 s).
    #[arg(long, value_name = "SECONDS", default_value = "60")]
    pub scale_settle: u64,
    /// Write a JUnit XML report here.
    #[arg(long, value_name = "PATH")]
    pub junit: Option<PathBuf>,
    /// Only scenarios whose name contains this text.
    #[arg(long, value_name = "TEXT")]
    pub name: Option<String>,
}

/// The default feature folder, relative to the repository root.
pub const DEFAULT_FEATURES: &str = "../shared/conformance/upstream-ingress/features";

/// One finished scenario.
#[derive(Clone, Debug)]
struct Outcome {
    profile: &'static str,
    feature: String,
    scenario: String,
    result: Result_,
    seconds: f64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Result_ {
    Passed,
    Failed(String),
    Skipped,
}

/// Runs the CLI; returns the process exit code.
pub async fn main(cli: Cli) -> anyhow::Result<i32> {
    let started = Instant::now();
    let duet = match &cli.duet {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no folder of this program")?
            .join("duet"),
    };
    let features = if cli.features.is_empty() {
        vec![PathBuf::from(DEFAULT_FEATURES)]
    } else {
        cli.features.clone()
    };
    // Scenarios per profile: every known folder must hold its known scenarios.
    let mut expected = 0;
    for f in &features {
        anyhow::ensure!(f.exists(), "no features at {}", f.display());
        expected += expect::check(f)?;
    }
    let cluster = cluster::Cluster::start(&cluster::Options {
        kubeconfig: cli.kubeconfig.clone(),
        duet,
        ingress_class: cli.ingress_class.clone(),
        controller_name: cli.controller_name.clone(),
        echo_image: cli.echo_image.clone(),
        real_node: cli.real_node,
        http_port: cli.http_port,
        https_port: cli.https_port,
        ready_timeout: Duration::from_secs(cli.ready_timeout),
        scale_settle: Duration::from_secs(cli.scale_settle),
    })
    .await?;
    SHARED
        .set(Shared {
            cluster,
            class_wait: Duration::from_secs(cli.ingress_class_wait),
            status_timeout: Duration::from_secs(cli.status_timeout),
        })
        .map_err(|_| anyhow::anyhow!("started twice"))?;
    let profiles: &[Family] = match cli.family {
        Profile::Ipv4 => &[Family::V4],
        Profile::Ipv6 => &[Family::V6],
        Profile::Both => &[Family::V4, Family::V6],
    };
    let outcomes = Arc::new(Mutex::new(Vec::<Outcome>::new()));
    // Scenarios that only wait for a status that must not appear (ingress_class, 30 s each) run
    // alongside the others rather than after them: their Ingress names a class duet does not
    // serve, in a namespace of their own, so nothing else sees it, and they still watch its
    // status for the whole wait.
    let mut waiting_files = Vec::new();
    for path in &features {
        for file in parse::feature_files(path)? {
            if std::fs::read_to_string(&file)?.contains(WAITING_STEP) {
                waiting_files.push(file);
            }
        }
    }
    let quick = async {
        let mut failed = false;
        for &family in profiles {
            println!("==== profile {family} ====");
            for path in &features {
                let writer =
                    run_features(path.clone(), family, Part::Quick, &cli, outcomes.clone()).await;
                failed |= writer.execution_has_failed();
            }
        }
        failed
    };
    let waiting = async {
        let mut runs = Vec::new();
        for &family in profiles {
            for file in &waiting_files {
                println!("==== profile {family}: {} alongside ====", file.display());
                runs.push(run_features(
                    file.clone(),
                    family,
                    Part::Waiting,
                    &cli,
                    outcomes.clone(),
                ));
            }
        }
        let writers = futures_util::future::join_all(runs).await;
        writers.iter().any(|w| w.execution_has_failed())
    };
    let (quick_failed, waiting_failed) = tokio::join!(quick, waiting);
    let any_failed = quick_failed || waiting_failed;
    let outcomes = outcomes.lock().expect("outcomes lock").clone();
    let passed = outcomes
        .iter()
        .filter(|o| o.result == Result_::Passed)
        .count();
    let failed = outcomes
        .iter()
        .filter(|o| matches!(o.result, Result_::Failed(_)))
        .count();
    let skipped = outcomes
        .iter()
        .filter(|o| o.result == Result_::Skipped)
        .count();
    let mut miscounted = false;
    for &family in profiles {
        let profile = family.as_str();
        let mine: Vec<&Outcome> = outcomes.iter().filter(|o| o.profile == profile).collect();
        let ok = mine.iter().filter(|o| o.result == Result_::Passed).count();
        println!("profile {profile}: {ok} of {} scenarios passed", mine.len());
        // With --name only some run; otherwise every scenario of the features must have run.
        if cli.name.is_none() && mine.len() != expected {
            println!(
                "profile {profile}: {} scenarios ran, {expected} expected",
                mine.len()
            );
            miscounted = true;
        }
    }
    if let Some(path) = &cli.junit {
        std::fs::write(path, junit(&outcomes))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!("suite took {:.1} s", started.elapsed().as_secs_f64());
    if skipped > 0 {
        println!("{passed} passed, {failed} failed, {skipped} skipped");
    } else {
        println!("{passed} passed, {failed} failed");
    }
    Ok(
        if failed > 0 || skipped > 0 || miscounted || any_failed || outcomes.is_empty() {
            1
        } else {
            0
        },
    )
}

/// The step of the scenarios that run alongside the others.
const WAITING_STEP: &str = "The Ingress status should not contain the IP address or FQDN";

/// Which scenarios of the features a run takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// All but the waiting ones, one at a time.
    Quick,
    /// Only those with [`WAITING_STEP`].
    Waiting,
}

async fn run_features(
    path: PathBuf,
    family: Family,
    part: Part,
    cli: &Cli,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
) -> impl StatsWriter<ConformanceWorld> {
    let mut cucumber = ConformanceWorld::cucumber::<PathBuf>().with_parser(parse::GodogParser);
    for (re, f) in steps::steps() {
        cucumber = cucumber
            .given(re.clone(), f)
            .when(re.clone(), f)
            .then(re, f);
    }
    let filter = cli.name.clone();
    let profile = family.as_str();
    let starts: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let before_starts = starts.clone();
    cucumber
        // A step no pattern matches (a pattern that drifted from a feature line) skips the rest
        // of its scenario: that is a failure, not a pass.
        .fail_on_skipped()
        .max_concurrent_scenarios(1)
        .with_cli(cucumber::cli::Opts::<_, _, _, cucumber::cli::Empty>::default())
        .before(move |_, _, _, world| {
            world.family = Some(family);
            *before_starts.lock().expect("lock") = Some(Instant::now());
            Box::pin(async {})
        })
        .after(move |feature, _, scenario, finished, world| {
            let seconds = starts
                .lock()
                .expect("lock")
                .map(|s| s.elapsed().as_secs_f64())
                .unwrap_or_default();
            let result = match finished {
                ScenarioFinished::StepFailed(_, _, e) => Result_::Failed(format!("{e:?}")),
                ScenarioFinished::BeforeHookFailed(e) => Result_::Failed(format!("{e:?}")),
                ScenarioFinished::StepPassed => Result_::Passed,
                ScenarioFinished::StepSkipped => Result_::Skipped,
            };
            outcomes.lock().expect("lock").push(Outcome {
                profile,
                feature: feature.name.clone(),
                scenario: scenario.name.clone(),
                result,
                seconds,
            });
            let ns = world.and_then(|w| w.namespace.take());
            Box::pin(async move {
                if let Some(ns) = ns {
                    let cluster = &SHARED.get().expect("cluster").cluster;
                    cluster.delete_namespace(&ns).await;
                }
            })
        })
        .filter_run(path, move |_, _, scenario| {
            let waits = scenario.steps.iter().any(|s| s.value == WAITING_STEP);
            waits == (part == Part::Waiting)
                && filter.as_deref().is_none_or(|f| scenario.name.contains(f))
        })
        .await
}

/// Stops what the runner started (the `duet` process); the API server and the echo pods live in
/// this process and end with it. Safe to call more than once, and from a signal handler's task.
pub fn shutdown() {
    if let Some(shared) = SHARED.get() {
        shared.cluster.kill_children();
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn junit(outcomes: &[Outcome]) -> String {
    let failures = outcomes
        .iter()
        .filter(|o| matches!(o.result, Result_::Failed(_)))
        .count();
    let skipped = outcomes
        .iter()
        .filter(|o| o.result == Result_::Skipped)
        .count();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuite name=\"duet-conformance\" tests=\"{}\" failures=\"{failures}\" skipped=\"{skipped}\">",
        outcomes.len()
    );
    for o in outcomes {
        let _ = write!(
            out,
            "  <testcase classname=\"{}.{}\" name=\"{}\" time=\"{:.3}\"",
            o.profile,
            xml_escape(&o.feature),
            xml_escape(&o.scenario),
            o.seconds
        );
        match &o.result {
            Result_::Passed => out.push_str("/>\n"),
            Result_::Skipped => out.push_str("><skipped/></testcase>\n"),
            Result_::Failed(msg) => {
                let _ = writeln!(
                    out,
                    "><failure message=\"{}\"/></testcase>",
                    xml_escape(msg)
                );
            }
        }
    }
    out.push_str("</testsuite>\n");
    out
}
