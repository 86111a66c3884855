//! One cluster per stack shared by every test of a test binary: started once, on a thread of its
//! own that lives as long as the process (a cluster's processes die with the thread that started
//! them, and a test's thread ends with the test), so tests that each start a duet of their own
//! pay the control plane's start-up once. Tests join its network namespace with
//! [`SharedCluster::enter`] and keep to namespaces of their own; restarts of the API server go
//! through the owning thread.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;

use super::{netns, Cluster, Options, Stack};
use crate::runner::kube_api::KubeApi;

enum Command {
    RestartApiserver(Duration, mpsc::Sender<anyhow::Result<()>>),
    CheckRunning(mpsc::Sender<anyhow::Result<()>>),
}

/// A cluster owned by a thread of its own.
#[derive(Debug)]
pub struct SharedCluster {
    kubeconfig: PathBuf,
    netns: PathBuf,
    stack: Stack,
    control_plane: String,
    commands: Mutex<mpsc::Sender<CommandBox>>,
}

/// `Command` is not `Debug`; the box keeps the handle's derive simple.
struct CommandBox(Command);

impl std::fmt::Debug for CommandBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Command")
    }
}

static CLUSTERS: Mutex<Vec<(Stack, &'static SharedCluster)>> = Mutex::new(Vec::new());

/// The shared cluster of `stack`, started by the first caller (one start at a time: two control
/// planes starting together on two cores only slow each other down). Does not move the caller
/// into its namespace: see [`SharedCluster::enter`].
pub fn shared(stack: Stack) -> anyhow::Result<&'static SharedCluster> {
    let mut clusters = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, cluster)) = clusters.iter().find(|(s, _)| *s == stack) {
        return Ok(cluster);
    }
    let cluster: &'static SharedCluster = Box::leak(Box::new(start(stack)?));
    clusters.push((stack, cluster));
    Ok(cluster)
}

fn start(stack: Stack) -> anyhow::Result<SharedCluster> {
    let (started, is_started) = mpsc::channel();
    let (commands, requests) = mpsc::channel::<CommandBox>();
    std::thread::Builder::new()
        .name(format!("cluster-{stack:?}"))
        .spawn(move || own(stack, started, requests))?;
    let (kubeconfig, netns, control_plane) = is_started
        .recv()
        .context("the cluster's thread ended while starting it")??;
    Ok(SharedCluster {
        kubeconfig,
        netns,
        stack,
        control_plane,
        commands: Mutex::new(commands),
    })
}

type Started = anyhow::Result<(PathBuf, PathBuf, String)>;

/// The owning thread: starts the cluster, then serves commands for as long as the process runs.
fn own(stack: Stack, started: mpsc::Sender<Started>, requests: mpsc::Receiver<CommandBox>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = started.send(Err(e.into()));
            return;
        }
    };
    let mut cluster = match runtime.block_on(Cluster::start(Options {
        stack,
        ..Options::default()
    })) {
        Ok(cluster) => cluster,
        Err(e) => {
            let _ = started.send(Err(e));
            return;
        }
    };
    let _ = started.send(Ok((
        cluster.kubeconfig().to_owned(),
        cluster.netns_path().to_owned(),
        cluster.control_plane().to_owned(),
    )));
    // The thread keeps the cluster until the process ends (the senders live in a static).
    while let Ok(CommandBox(command)) = requests.recv() {
        match command {
            Command::RestartApiserver(down_for, reply) => {
                let _ = reply.send(runtime.block_on(cluster.restart_apiserver(down_for)));
            }
            Command::CheckRunning(reply) => {
                let _ = reply.send(cluster.check_running());
            }
        }
    }
}

impl SharedCluster {
    /// Moves the calling thread into the cluster's network namespace (for good).
    pub fn enter(&self) -> anyhow::Result<()> {
        netns::enter_path(&self.netns)
    }

    /// The admin kubeconfig (the API server of the cluster's primary family).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The network families.
    pub fn stack(&self) -> Stack {
        self.stack
    }

    /// `kube-apiserver v1.37.2, kube-controller-manager v1.37.2`.
    pub fn control_plane(&self) -> &str {
        &self.control_plane
    }

    /// An admin client (from a thread inside the namespace).
    pub async fn api(&self) -> anyhow::Result<KubeApi> {
        KubeApi::from_kubeconfig(&self.kubeconfig).await
    }

    fn ask(
        &self,
        command: impl FnOnce(mpsc::Sender<anyhow::Result<()>>) -> Command,
    ) -> anyhow::Result<()> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(CommandBox(command(reply)))
            .context("the cluster's thread is gone")?;
        answer.recv().context("the cluster's thread is gone")?
    }

    /// [`Cluster::restart_apiserver`], run by the owning thread (this one blocks meanwhile).
    pub fn restart_apiserver(&self, down_for: Duration) -> anyhow::Result<()> {
        self.ask(|reply| Command::RestartApiserver(down_for, reply))
    }

    /// [`Cluster::check_running`].
    pub fn check_running(&self) -> anyhow::Result<()> {
        self.ask(Command::CheckRunning)
    }
}
