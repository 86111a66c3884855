//! The command line (`duet serve ...`), parsed once at start into typed configuration. A bad flag
//! or value is a [`ConfigError::Usage`]: one line, exit code 64.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use dataplane::access_log::AccessLogFormat;
use dataplane::access_policy::AuthDestinations;
use dataplane::forwarded::{Cidr, TrustedProxies};
use dataplane::{FamilyPolicy, LbPolicy, ProxyConfig};

use crate::class::ClassConfig;
use crate::object::{is_dns_label, is_dns_subdomain, NsName};
use crate::source::kube::KubeSettings;
use crate::status::Publish;
use crate::translate;
use crate::translate::nginx::routing::CanaryScope;
use crate::units::{parse_body_size, parse_duration, parse_duration_or_zero, SizeError};

/// Exit code for a bad command line (`EX_USAGE`).
pub const EXIT_USAGE: u8 = 64;

/// The environment variables `duet` reads, with what each does (a test finds every variable the
/// code reads in this table; the command-line reference is rendered from it).
pub const ENVIRONMENT: [(&str, &str); 7] = [
    ("DUET_LOG", "Log filter in `RUST_LOG` syntax (`info`, `duet=debug,kube=warn`); default `info`. An invalid filter exits with code 64."),
    ("TOKIO_WORKER_THREADS", "Worker threads of the async runtime; default one per core. `1` runs a single-threaded runtime (a one-core pod)."),
    ("POD_NAME", "The leader-election identity's base (then a random suffix); default the host name."),
    ("POD_NAMESPACE", "duet's namespace: the leader-election Lease's (unless `--election-namespace`) and the Gateway pods' (`--gateway-pod-selector`); default the kubeconfig's or service account's namespace."),
    ("KUBECONFIG", "The kubeconfig file when `--kubeconfig` is not given; then `~/.kube/config`, then the in-cluster service account."),
    ("HOME", "Where `~/.kube/config` is looked for."),
    ("KUBERNETES_SERVICE_HOST", "Set by Kubernetes in every pod: without a kubeconfig, duet uses the in-cluster service account."),
];

/// duet: a dual-stack (IPv4/IPv6) Kubernetes Ingress controller.
#[derive(Debug, Parser)]
#[command(
    name = "duet",
    version,
    about = "duet: a dual-stack (IPv4/IPv6) Kubernetes Ingress controller",
    propagate_version = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve Ingress routes (from a folder of manifests with --manifests).
    Serve(Box<ServeArgs>),
    /// Prepare a move to duet (offline).
    #[command(subcommand)]
    Migrate(MigrateCommand),
}

/// `duet migrate ...`.
#[derive(Debug, Subcommand)]
pub enum MigrateCommand {
    /// Report, per Ingress and nginx.ingress.kubernetes.io/ annotation, what duet does with it.
    /// Exit 0 when every annotation is honoured, 1 when one is not, 64 on unreadable input.
    Check(MigrateCheck),
}

/// Flags of `duet migrate check`.
#[derive(Clone, Debug, Args, PartialEq, Eq)]
pub struct MigrateCheck {
    /// Only Ingresses of this class (spec.ingressClassName, else the kubernetes.io/ingress.class
    /// annotation, as ingress-nginx decides it); default: every Ingress.
    #[arg(long, value_name = "NAME")]
    pub ingress_class: Option<String>,

    /// Check as `duet serve --enable-ssl-passthrough` would apply the annotations (without it,
    /// ssl-passthrough is reported as not applied, as duet serves it by default).
    #[arg(long)]
    pub enable_ssl_passthrough: bool,

    /// Check canaries as `duet serve --canary-scope SCOPE` attaches them: namespace (the default)
    /// reports a canary whose main Ingress is in another namespace as not served.
    #[arg(long, value_name = "SCOPE", default_value = "namespace", value_parser = parse_canary_scope)]
    pub canary_scope: CanaryScope,

    /// A manifest file, a folder of *.yaml/*.yml files (recursively), or - for standard input:
    /// as `kubectl get ingress -A -o yaml` prints them (Lists, multi-document files, single
    /// objects; kinds other than Ingress are skipped).
    #[arg(value_name = "DIR|FILE|-")]
    pub input: PathBuf,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Invocation {
    /// `duet serve`.
    Serve(Box<Config>),
    /// `duet migrate check`.
    MigrateCheck(MigrateCheck),
}

/// Flags of `duet serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Read Ingresses, IngressClasses, Services, EndpointSlices and Secrets from the *.yaml/*.yml
    /// files in DIR (watched; changes apply live) instead of the Kubernetes API.
    #[arg(long, value_name = "DIR")]
    pub manifests: Option<PathBuf>,

    /// Kubernetes mode (without --manifests).
    #[command(flatten)]
    pub kube: KubeArgs,

    /// Address to serve plain HTTP on; repeatable, one socket each.
    #[arg(long, value_name = "ADDR", default_values = ["0.0.0.0:8080", "[::]:8080"])]
    pub http_listen: Vec<SocketAddr>,

    /// Address to serve HTTPS on; repeatable, one socket each.
    #[arg(long, value_name = "ADDR", default_values = ["0.0.0.0:8443", "[::]:8443"])]
    pub https_listen: Vec<SocketAddr>,

    /// Also serve HTTP/3 (QUIC over UDP) on the HTTPS listen addresses (or --http3-listen), with
    /// the same routes and certificates; HTTPS answers over TCP advertise it (Alt-Svc).
    #[arg(long)]
    pub http3: bool,

    /// UDP address to serve HTTP/3 on instead of the HTTPS listen addresses; repeatable, one
    /// socket each (with --http3).
    #[arg(long, value_name = "ADDR", requires = "http3")]
    pub http3_listen: Vec<SocketAddr>,

    /// The max-age (ma) of the Alt-Svc header advertising HTTP/3 on HTTPS answers over TCP.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration, requires = "http3")]
    pub http3_alt_svc_max_age: Duration,

    /// HTTP/3 requests in flight at once per connection (QUIC bidirectional streams).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000), requires = "http3")]
    pub http3_max_streams: u32,

    /// QUIC handshakes in progress past which a new client must first prove its address with a
    /// Retry (a round trip more; 0: always).
    #[arg(long, value_name = "N", default_value_t = 64, requires = "http3")]
    pub http3_retry_above: usize,

    /// Address of the admin endpoints the kubelet and Prometheus reach (/healthz, /readyz,
    /// /metrics); repeatable.
    #[arg(long, value_name = "ADDR", default_values = ["127.0.0.1:10254", "[::1]:10254"])]
    pub admin_listen: Vec<SocketAddr>,

    /// Address of /debug/routes (pod addresses, Secret names), comma-separated or repeated;
    /// loopback only by default.
    #[arg(long, value_name = "ADDR,...", value_delimiter = ',', default_values = ["127.0.0.1:10253", "[::1]:10253"])]
    pub debug_listen: Vec<SocketAddr>,

    /// The ingress class duet serves.
    #[arg(long, value_name = "NAME", default_value = "duet")]
    pub ingress_class: String,

    /// The spec.controller value of duet's IngressClasses.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "duet.dev/ingress-controller"
    )]
    pub controller_name: String,

    /// Also serve Ingresses that name no class.
    #[arg(long)]
    pub watch_ingress_without_class: bool,

    /// How a pod's address family is chosen: PreferSameFamily, RequireSameFamily, PreferIPv4 or
    /// PreferIPv6 (per Ingress: annotation duet.dev/upstream-family).
    #[arg(long, value_name = "POLICY", default_value = "PreferSameFamily", value_parser = parse_family)]
    pub upstream_family: FamilyPolicy,

    /// Load-balancing algorithm over pods: p2c or round-robin.
    #[arg(long, value_name = "ALGORITHM", default_value = "p2c", value_parser = parse_lb)]
    pub lb: LbPolicy,

    /// Upstream connect timeout per attempt (seconds, or 500ms, 5s, 1m).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub connect_timeout: Duration,

    /// Time to wait for an upstream's response head before answering 504.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub upstream_timeout: Duration,

    /// Time a client connection may stay idle between requests before it is closed.
    #[arg(long, value_name = "DURATION", default_value = "75s", value_parser = parse_duration)]
    pub keepalive_timeout: Duration,

    /// Time a client has to send a request head (the first from connecting, later ones from
    /// their first byte) and to finish a TLS handshake; the connection is closed after it.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// The kubernetes.io/tls Secret served to TLS clients whose SNI matches no host (or who send
    /// none); without it, a self-signed certificate generated at start.
    #[arg(long, value_name = "NAMESPACE/NAME", value_parser = parse_ns_name)]
    pub default_tls_secret: Option<NsName>,

    /// Peers (CIDRs of either family, comma-separated or repeated) whose X-Forwarded-For and
    /// Forwarded headers are appended to; everyone else's are replaced. Default: nobody.
    #[arg(long, value_name = "CIDR,...", value_delimiter = ',', value_parser = parse_cidr)]
    pub trusted_proxies: Vec<Cidr>,

    /// Expect a PROXY protocol v1 or v2 header first on every connection of these listeners:
    /// all (when given without a value), http or https.
    #[arg(
        long,
        value_name = "LISTENERS",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "all",
        value_parser = ["all", "http", "https"]
    )]
    pub proxy_protocol: Option<String>,

    /// Peers (CIDRs of either family, comma-separated or repeated) allowed to send a PROXY
    /// protocol header; a connection from anyone else to a PROXY protocol listener is closed.
    /// Default: any peer (with a warning at start).
    #[arg(long, value_name = "CIDR,...", value_delimiter = ',', value_parser = parse_cidr)]
    pub proxy_protocol_from: Vec<Cidr>,

    /// The only networks (CIDRs of either family, comma-separated or repeated) auth requests
    /// (auth-url) may connect to, checked on every resolved address. Default: every address but
    /// loopback, link-local and unspecified ones (IPv4-mapped forms included).
    #[arg(long, value_name = "CIDR,...", value_delimiter = ',', value_parser = parse_cidr)]
    pub auth_allowed_destinations: Vec<Cidr>,

    /// Client connections open at once over all proxy listeners; past it new connections are
    /// closed at once and counted (duet_connections_refused_total).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS, value_parser = parse_max_connections)]
    pub max_connections: usize,

    /// ssl-passthrough relays open at once; each also holds a --max-connections place, and past
    /// this a passthrough connection is closed at once and counted as refused. Default: a
    /// quarter of --max-connections (at least 1), so that relays never take every place.
    #[arg(long, value_name = "N", value_parser = parse_max_connections)]
    pub max_passthrough_connections: Option<usize>,

    /// Time an ssl-passthrough relay may go without a byte either way before both of its
    /// connections are closed (once one side has closed: at most 5s).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub passthrough_idle_timeout: Duration,

    /// Time between /readyz turning 503 on SIGTERM and the proxy listeners closing; requests
    /// are still served meanwhile.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration_or_zero)]
    pub shutdown_delay: Duration,

    /// Time in-flight requests and tunnels get to finish once the listeners closed; what is
    /// still open after it is closed.
    #[arg(long, value_name = "DURATION", default_value = "25s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// Access log on stdout: json (one JSON object per request) or off.
    #[arg(long, value_name = "FORMAT", default_value = "json", value_parser = parse_access_log)]
    pub access_log: AccessLogFormat,

    /// Largest request body (512, 8k, 10m; 0 = unlimited); larger declared bodies get 413 (per
    /// Ingress: annotation duet.dev/proxy-body-size).
    #[arg(long, value_name = "SIZE", default_value = "1m", value_parser = parse_size)]
    pub max_body_size: u64,

    /// Refuse whole the Ingresses that carry an ingress-nginx snippet annotation
    /// (configuration-snippet, server-snippet, ...) instead of serving them without it.
    #[arg(long)]
    pub strict_annotations: bool,

    /// Relay the HTTPS connections whose TLS server name is a host of an Ingress with
    /// nginx.ingress.kubernetes.io/ssl-passthrough: "true" to its `/` backend unterminated
    /// (ingress-nginx's flag of the same name); without it the annotation is not applied.
    #[arg(long)]
    pub enable_ssl_passthrough: bool,

    /// Which main Ingresses an ingress-nginx canary Ingress (canary: "true") may attach to:
    /// namespace (its own namespace's only) or cluster (any namespace's, as ingress-nginx).
    #[arg(long, value_name = "SCOPE", default_value = "namespace", value_parser = parse_canary_scope)]
    pub canary_scope: CanaryScope,
    /// The resolv.conf whose name servers, search list and ndots resolve ExternalName Services'
    /// names (A and AAAA, re-resolved when their TTL runs out).
    #[arg(long, value_name = "PATH", default_value = "/etc/resolv.conf")]
    pub resolv_conf: PathBuf,
    /// Proxy to EndpointSlice addresses on loopback (127.0.0.0/8, ::1) in Kubernetes mode.
    /// For tests whose pods run on the test machine only; --manifests mode always allows them.
    #[arg(long)]
    pub allow_loopback_endpoints: bool,
}

/// Default of `--max-connections`: sized for the chart's 512 MiB memory limit (see the README,
/// Limits and timeouts).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Largest `--max-connections`.
pub const MAX_MAX_CONNECTIONS: usize = 1_000_000;

fn parse_max_connections(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_MAX_CONNECTIONS).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a number of connections from 1 to {MAX_MAX_CONNECTIONS}"
        )),
    }
}

fn parse_canary_scope(s: &str) -> Result<CanaryScope, String> {
    s.parse()
}

fn parse_access_log(s: &str) -> Result<AccessLogFormat, String> {
    s.parse()
        .map_err(|e: dataplane::table::UnknownName| e.to_string())
}

/// `--max-body-size`: a size in nginx syntax of at most [`MAX_BODY_SIZE`](crate::units::MAX_BODY_SIZE).
fn parse_size(s: &str) -> Result<u64, String> {
    parse_body_size(s).map_err(|error| match error {
        SizeError::NotASize => {
            format!("{s:?} is not a size (examples: 512, 8k, 10m, 0 for unlimited)")
        }
        SizeError::TooLarge => format!("{s:?} is more than the maximum, 64g"),
    })
}

fn parse_cidr(s: &str) -> Result<Cidr, String> {
    s.parse()
        .map_err(|e: dataplane::forwarded::BadCidr| e.to_string())
}

fn parse_ns_name(s: &str) -> Result<NsName, String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(NsName::new(ns, name))
        }
        _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
    }
}

fn parse_family(s: &str) -> Result<FamilyPolicy, String> {
    s.parse()
        .map_err(|e: dataplane::table::UnknownName| e.to_string())
}

fn parse_lb(s: &str) -> Result<LbPolicy, String> {
    s.parse()
        .map_err(|e: dataplane::table::UnknownName| e.to_string())
}

/// The addresses of one kind of listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listen {
    /// The addresses, one socket each.
    pub addrs: Vec<SocketAddr>,
    /// Whether these are the defaults (not given on the command line): IPv6 defaults are skipped
    /// with a warning when the host has IPv6 disabled.
    pub defaulted: bool,
}

/// Everything `duet serve` was told, validated.
#[derive(Clone, Debug)]
pub struct Config {
    /// The manifest folder; `None` means Kubernetes mode.
    pub manifests: Option<PathBuf>,
    /// Plain HTTP listeners.
    pub http_listen: Listen,
    /// HTTPS listeners.
    pub https_listen: Listen,
    /// Admin listeners (probes and metrics).
    pub admin_listen: Listen,
    /// `/debug/routes` listeners.
    pub debug_listen: Listen,
    /// Translation settings (class, family policy, balancing).
    pub translate: translate::Config,
    /// Proxy timeouts.
    pub proxy: ProxyConfig,
    /// Kubernetes mode settings (unused with `--manifests`).
    pub kube: KubeConfig,
    /// The access log's format.
    pub access_log: AccessLogFormat,
    /// Edge settings of the proxy listeners: trusted proxies and PROXY protocol.
    pub edge: Edge,
    /// `--max-connections`.
    pub max_connections: usize,
    /// `--max-passthrough-connections`, or its default.
    pub max_passthrough_connections: usize,
    /// `--shutdown-delay`.
    pub shutdown_delay: Duration,
    /// `--resolv-conf`.
    pub resolv_conf: PathBuf,
    /// HTTP/3 (`--http3`), when on.
    pub http3: Option<Http3Config>,
}

/// The HTTP/3 flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Http3Config {
    /// The UDP addresses: `--http3-listen`, or the HTTPS listen addresses.
    pub listen: Listen,
    /// `--http3-alt-svc-max-age`.
    pub alt_svc_max_age: Duration,
    /// `--http3-max-streams`.
    pub max_streams: u32,
    /// `--http3-retry-above`.
    pub retry_above: usize,
}

/// The HTTP/3 flags, when `--http3` is on; without `--http3-listen` the HTTPS addresses.
fn http3_config(args: &ServeArgs, matches: &ArgMatches) -> Option<Http3Config> {
    if !args.http3 {
        return None;
    }
    let listen = if args.http3_listen.is_empty() {
        Listen {
            addrs: args.https_listen.clone(),
            defaulted: defaulted(matches, "https_listen"),
        }
    } else {
        Listen {
            addrs: args.http3_listen.clone(),
            defaulted: false,
        }
    };
    Some(Http3Config {
        listen,
        alt_svc_max_age: args.http3_alt_svc_max_age,
        max_streams: args.http3_max_streams,
        retry_above: args.http3_retry_above,
    })
}

/// How the proxy listeners treat what is in front of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Edge {
    /// `--trusted-proxies`.
    pub trusted_proxies: TrustedProxies,
    /// PROXY protocol on the HTTP listeners.
    pub proxy_protocol_http: bool,
    /// PROXY protocol on the HTTPS listeners.
    pub proxy_protocol_https: bool,
    /// `--proxy-protocol-from`; empty: any peer.
    pub proxy_protocol_from: TrustedProxies,
}

/// Why `duet` does not start.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--help` or `--version` was asked for: print it (as clap renders it) and exit 0.
    #[error("{0}")]
    Info(clap::Error),
    /// A bad flag or value: print the one line and exit 64.
    #[error("{0}")]
    Usage(String),
}

impl ConfigError {
    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            ConfigError::Info(_) => 0,
            ConfigError::Usage(_) => EXIT_USAGE,
        }
    }
}

/// The first line of a clap error, without clap's `error: ` prefix and value placeholders.
fn one_line(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let line = rendered
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("invalid command line");
    let line = line.strip_prefix("error: ").unwrap_or(line);
    // "'--upstream-family <POLICY>'" -> "'--upstream-family'"
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find(" <") {
        let Some(len) = rest[start..].find(">'") else {
            break;
        };
        out.push_str(&rest[..start]);
        rest = &rest[start + len + 1..];
    }
    out.push_str(rest);
    out
}

/// Parses the command line (including the program name).
pub fn parse_invocation<I, T>(args: I) -> Result<Invocation, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let classify = |e: clap::Error| match e.kind() {
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
            ConfigError::Info(e)
        }
        clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        | clap::error::ErrorKind::MissingSubcommand => ConfigError::Usage(
            "missing subcommand: run 'duet serve --manifests DIR' (see 'duet --help')".to_owned(),
        ),
        _ => ConfigError::Usage(one_line(&e)),
    };
    let matches = Cli::command()
        .try_get_matches_from(args)
        .map_err(classify)?;
    let cli = Cli::from_arg_matches(&matches).map_err(classify)?;
    match cli.command {
        Command::Serve(args) => {
            let sub = matches
                .subcommand_matches("serve")
                .ok_or_else(|| ConfigError::Usage("missing subcommand 'serve'".to_owned()))?;
            Ok(Invocation::Serve(Box::new(from_args(*args, sub)?)))
        }
        Command::Migrate(MigrateCommand::Check(check)) => Ok(Invocation::MigrateCheck(check)),
    }
}

/// Parses the command line of `duet serve` (including the program name).
pub fn parse<I, T>(args: I) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    match parse_invocation(args)? {
        Invocation::Serve(config) => Ok(*config),
        Invocation::MigrateCheck(_) => Err(ConfigError::Usage("expected 'duet serve'".to_owned())),
    }
}

/// `--max-passthrough-connections`: at most `--max-connections`; by default a quarter of it.
fn passthrough_places(args: &ServeArgs) -> Result<usize, ConfigError> {
    match args.max_passthrough_connections {
        None => Ok((args.max_connections / 4).max(1)),
        Some(n) if n <= args.max_connections => Ok(n),
        Some(n) => Err(ConfigError::Usage(format!(
            "invalid value '{n}' for '--max-passthrough-connections': more than --max-connections ({})",
            args.max_connections
        ))),
    }
}

fn defaulted(matches: &ArgMatches, id: &str) -> bool {
    matches.value_source(id) == Some(ValueSource::DefaultValue)
}

/// The paths given on the command line exist and are of the right type.
fn check_paths(args: &ServeArgs, matches: &ArgMatches) -> Result<(), ConfigError> {
    if let Some(dir) = &args.manifests {
        if !dir.is_dir() {
            return Err(ConfigError::Usage(format!(
                "invalid value '{}' for '--manifests': not a directory",
                dir.display()
            )));
        }
    }
    if !defaulted(matches, "resolv_conf") && !args.resolv_conf.is_file() {
        return Err(ConfigError::Usage(format!(
            "invalid value '{}' for '--resolv-conf': not a file",
            args.resolv_conf.display()
        )));
    }
    Ok(())
}

fn from_args(args: ServeArgs, matches: &ArgMatches) -> Result<Config, ConfigError> {
    check_paths(&args, matches)?;
    let from_files = args.manifests.is_some();
    let max_passthrough_connections = passthrough_places(&args)?;
    let http3 = http3_config(&args, matches);
    let proxy = ProxyConfig {
        connect_timeout: args.connect_timeout,
        response_timeout: args.upstream_timeout,
        keepalive_timeout: args.keepalive_timeout,
        header_read_timeout: args.header_read_timeout,
        drain_timeout: args.drain_timeout,
        passthrough_idle_timeout: args.passthrough_idle_timeout,
        auth_destinations: AuthDestinations::from_list(args.auth_allowed_destinations),
        ..ProxyConfig::default()
    };
    let mut kube = kube_config(args.kube)?;
    kube.gateway.http3 = args.http3;
    let gateway = translate::GatewaySettings {
        controller_name: kube.gateway.controller_name.clone(),
        ports_from_services: !from_files,
    };
    Ok(Config {
        manifests: args.manifests,
        http_listen: Listen {
            addrs: args.http_listen,
            defaulted: defaulted(matches, "http_listen"),
        },
        https_listen: Listen {
            addrs: args.https_listen,
            defaulted: defaulted(matches, "https_listen"),
        },
        admin_listen: Listen {
            addrs: args.admin_listen,
            defaulted: defaulted(matches, "admin_listen"),
        },
        debug_listen: Listen {
            addrs: args.debug_listen,
            defaulted: defaulted(matches, "debug_listen"),
        },
        translate: translate::Config {
            class: ClassConfig {
                ingress_class: args.ingress_class,
                controller_name: args.controller_name,
                watch_without_class: args.watch_ingress_without_class,
                class_by_flag_name: from_files,
            },
            family_policy: args.upstream_family,
            lb: args.lb,
            default_tls_secret: args.default_tls_secret,
            max_body_bytes: args.max_body_size,
            allow_loopback_endpoints: from_files || args.allow_loopback_endpoints,
            strict_annotations: args.strict_annotations,
            ssl_passthrough: args.enable_ssl_passthrough,
            canary_scope: args.canary_scope,
            auth_destinations: proxy.auth_destinations.clone(),
            gateway,
        },
        proxy,
        kube,
        edge: Edge {
            trusted_proxies: TrustedProxies(args.trusted_proxies),
            proxy_protocol_http: matches!(args.proxy_protocol.as_deref(), Some("all" | "http")),
            proxy_protocol_https: matches!(args.proxy_protocol.as_deref(), Some("all" | "https")),
            proxy_protocol_from: TrustedProxies(args.proxy_protocol_from),
        },
        access_log: args.access_log,
        max_connections: args.max_connections,
        max_passthrough_connections,
        shutdown_delay: args.shutdown_delay,
        resolv_conf: args.resolv_conf,
        http3,
    })
}

/// Flags of Kubernetes mode.
#[derive(Debug, Args)]
pub struct KubeArgs {
    /// Kubeconfig file (default: KUBECONFIG, ~/.kube/config, then the in-cluster service account).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Watch only this namespace; repeatable (default: every namespace).
    #[arg(long, value_name = "NS")]
    pub watch_namespace: Vec<String>,

    /// Write every address of this Service (LoadBalancer ingress entries, else its clusterIPs)
    /// into status.loadBalancer.ingress of served Ingresses.
    #[arg(
        long,
        value_name = "NS/NAME",
        conflicts_with = "publish_status_address"
    )]
    pub publish_service: Option<String>,

    /// Write these IPs or host names into status.loadBalancer.ingress of served Ingresses.
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub publish_status_address: Vec<String>,

    /// Namespace of the leader-election Lease (default: POD_NAMESPACE, then the
    /// kubeconfig's or pod's namespace).
    #[arg(long, value_name = "NS")]
    pub election_namespace: Option<String>,

    /// How long a leader's Lease lasts without renewal; renewed every third of it.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    pub election_lease_duration: Duration,

    /// Name of the leader-election Lease; controllers sharing a namespace need distinct names.
    #[arg(long, value_name = "NAME", default_value = crate::leader::LEASE_NAME)]
    pub election_id: String,

    /// Gateway API flags.
    #[command(flatten)]
    pub gateway: crate::gateway::GatewayArgs,
}

/// Kubernetes mode settings, validated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeConfig {
    /// Where the API is and what to watch.
    pub settings: KubeSettings,
    /// What goes into Ingress status.
    pub publish: Publish,
    /// `--election-namespace`, when given.
    pub election_namespace: Option<String>,
    /// How long a leader's Lease lasts without renewal.
    pub lease_duration: Duration,
    /// The Lease's name (`--election-id`).
    pub election_id: String,
    /// Gateway API settings.
    pub gateway: crate::gateway::GatewayConfig,
}

fn kube_config(args: KubeArgs) -> Result<KubeConfig, ConfigError> {
    if let Some(ns) = args.watch_namespace.iter().find(|ns| !is_dns_label(ns)) {
        return Err(ConfigError::Usage(format!(
            "invalid value '{ns}' for '--watch-namespace': not a namespace name"
        )));
    }
    let publish = match (args.publish_service, args.publish_status_address) {
        (Some(service), _) => {
            let parsed = service
                .split_once('/')
                .filter(|(ns, name)| is_dns_label(ns) && is_dns_label(name));
            let Some((ns, name)) = parsed else {
                return Err(ConfigError::Usage(format!(
                    "invalid value '{service}' for '--publish-service': expected NAMESPACE/NAME"
                )));
            };
            Publish::Service(NsName::new(ns, name))
        }
        (None, addresses) if !addresses.is_empty() => {
            if let Some(bad) = addresses.iter().find(|a| !is_address(a)) {
                return Err(ConfigError::Usage(format!(
                    "invalid value '{bad}' for '--publish-status-address': not an IP address or host name"
                )));
            }
            Publish::Addresses(addresses)
        }
        _ => Publish::Nothing,
    };
    if let Some(ns) = args
        .election_namespace
        .as_ref()
        .filter(|ns| !is_dns_label(ns))
    {
        return Err(ConfigError::Usage(format!(
            "invalid value '{ns}' for '--election-namespace': not a namespace name"
        )));
    }
    if !is_dns_subdomain(&args.election_id) {
        return Err(ConfigError::Usage(format!(
            "invalid value '{}' for '--election-id': not a Lease name (lowercase letters, digits, '-' and '.', at most 253)",
            args.election_id
        )));
    }
    let gateway = crate::gateway::GatewayConfig {
        namespaces: args.watch_namespace.clone(),
        ..crate::gateway::config::from_args(args.gateway).map_err(ConfigError::Usage)?
    };
    Ok(KubeConfig {
        settings: KubeSettings {
            kubeconfig: args.kubeconfig,
            namespaces: args.watch_namespace,
        },
        publish,
        election_namespace: args.election_namespace,
        lease_duration: args.election_lease_duration,
        election_id: args.election_id,
        gateway,
    })
}

/// Whether `s` is an IP address or a DNS host name.
fn is_address(s: &str) -> bool {
    s.parse::<std::net::IpAddr>().is_ok()
        || (s.len() <= 253
            && s.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variable_read_is_in_the_environment_table() {
        let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
        let mut read = Vec::new();
        while let Some(path) = dirs.pop() {
            if path.is_dir() {
                dirs.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for call in ["env::var(\"", "env::var_os(\""] {
                for (i, _) in text.match_indices(call) {
                    let rest = &text[i + call.len()..];
                    let name = &rest[..rest.find('"').unwrap()];
                    read.push((name.to_owned(), path.display().to_string()));
                }
            }
        }
        assert!(read.iter().any(|(n, _)| n == "DUET_LOG"), "{read:?}");
        for (name, file) in read {
            assert!(
                ENVIRONMENT.iter().any(|(n, _)| *n == name),
                "{file} reads {name}: add it to config::ENVIRONMENT and run docs/generate-reference.sh"
            );
        }
    }

    fn serve(extra: &[&str]) -> Result<Config, ConfigError> {
        let dir = std::env::temp_dir();
        let dir = dir.to_str().unwrap();
        let mut args = vec!["duet", "serve", "--manifests", dir];
        args.extend_from_slice(extra);
        parse(args)
    }

    fn usage(extra: &[&str]) -> String {
        match serve(extra) {
            Err(ConfigError::Usage(line)) => line,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let c = serve(&[]).unwrap();
        let addrs = |v: &[&str]| {
            v.iter()
                .map(|a| a.parse().unwrap())
                .collect::<Vec<SocketAddr>>()
        };
        assert_eq!(c.http_listen.addrs, addrs(&["0.0.0.0:8080", "[::]:8080"]));
        assert!(c.http_listen.defaulted);
        assert_eq!(c.https_listen.addrs, addrs(&["0.0.0.0:8443", "[::]:8443"]));
        assert_eq!(
            c.admin_listen.addrs,
            addrs(&["127.0.0.1:10254", "[::1]:10254"])
        );
        assert_eq!(c.translate.class, ClassConfig::default());
        assert_eq!(c.translate.family_policy, FamilyPolicy::PreferSameFamily);
        assert_eq!(c.translate.lb, LbPolicy::P2c);
        assert_eq!(c.proxy.connect_timeout, Duration::from_secs(5));
        assert_eq!(c.proxy.response_timeout, Duration::from_secs(60));
        assert_eq!(c.proxy.keepalive_timeout, Duration::from_secs(75));
        assert_eq!(c.proxy.header_read_timeout, Duration::from_secs(60));
        assert_eq!(c.access_log, AccessLogFormat::Json);
        assert_eq!(
            c.debug_listen.addrs,
            addrs(&["127.0.0.1:10253", "[::1]:10253"])
        );
        assert!(c.debug_listen.addrs.iter().all(|a| a.ip().is_loopback()));
        assert_eq!(c.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(c.max_passthrough_connections, DEFAULT_MAX_CONNECTIONS / 4);
        assert_eq!(c.proxy.passthrough_idle_timeout, Duration::from_secs(600));
        assert_eq!(c.shutdown_delay, Duration::from_secs(5));
        assert_eq!(c.proxy.drain_timeout, Duration::from_secs(25));
        assert!(c.edge.proxy_protocol_from.0.is_empty());
    }

    #[test]
    fn shutdown_limits_and_debug_flags() {
        let c = serve(&[
            "--shutdown-delay",
            "0",
            "--drain-timeout",
            "1h",
            "--max-connections",
            "10",
            "--debug-listen",
            "127.0.0.1:1,[::1]:2",
            "--proxy-protocol-from",
            "10.0.0.0/8,fd00::/8",
        ])
        .unwrap();
        assert_eq!(c.shutdown_delay, Duration::ZERO);
        assert_eq!(c.proxy.drain_timeout, Duration::from_secs(3600));
        assert_eq!(c.max_connections, 10);
        assert_eq!(c.debug_listen.addrs.len(), 2);
        assert!(!c.debug_listen.defaulted);
        assert!(c
            .edge
            .proxy_protocol_from
            .trusts("fd00::1".parse().unwrap()));
        assert!(!c
            .edge
            .proxy_protocol_from
            .trusts("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn access_log_flag() {
        assert_eq!(
            serve(&["--access-log", "off"]).unwrap().access_log,
            AccessLogFormat::Off
        );
        let line = usage(&["--access-log", "text"]);
        assert!(
            line.contains("'--access-log'") && line.contains("json, off"),
            "{line}"
        );
    }

    #[test]
    fn flags() {
        let c = serve(&[
            "--http-listen",
            "127.0.0.1:0",
            "--http-listen",
            "[::1]:0",
            "--ingress-class",
            "edge",
            "--controller-name",
            "example.com/duet",
            "--watch-ingress-without-class",
            "--upstream-family",
            "RequireSameFamily",
            "--lb",
            "round-robin",
            "--connect-timeout",
            "500ms",
            "--upstream-timeout",
            "2",
            "--keepalive-timeout",
            "1m",
            "--header-read-timeout",
            "10s",
        ])
        .unwrap();
        assert_eq!(c.http_listen.addrs.len(), 2);
        assert!(!c.http_listen.defaulted);
        assert!(c.admin_listen.defaulted);
        assert_eq!(c.translate.class.ingress_class, "edge");
        assert_eq!(c.translate.class.controller_name, "example.com/duet");
        assert!(c.translate.class.watch_without_class);
        assert_eq!(c.translate.family_policy, FamilyPolicy::RequireSameFamily);
        assert_eq!(c.translate.lb, LbPolicy::RoundRobin);
        assert_eq!(c.proxy.connect_timeout, Duration::from_millis(500));
        assert_eq!(c.proxy.response_timeout, Duration::from_secs(2));
        assert_eq!(c.proxy.keepalive_timeout, Duration::from_secs(60));
        assert_eq!(c.proxy.header_read_timeout, Duration::from_secs(10));
    }

    #[test]
    fn auth_destinations_flag() {
        let c = serve(&[]).unwrap();
        assert_eq!(c.proxy.auth_destinations, AuthDestinations::Default);
        let c = serve(&[
            "--auth-allowed-destinations",
            "127.0.0.0/8,::1",
            "--auth-allowed-destinations=10.0.0.0/8",
        ])
        .unwrap();
        let AuthDestinations::Only(networks) = &c.proxy.auth_destinations else {
            panic!("{:?}", c.proxy.auth_destinations)
        };
        assert_eq!(networks.len(), 3);
        assert_eq!(c.translate.auth_destinations, c.proxy.auth_destinations);
        assert!(c.proxy.auth_destinations.allows("::1".parse().unwrap()));
        let line = usage(&["--auth-allowed-destinations", "fe80::/129"]);
        assert!(line.contains("'--auth-allowed-destinations'"), "{line}");
    }

    #[test]
    fn edge_flags() {
        let c = serve(&[]).unwrap();
        assert_eq!(c.edge, Edge::default());
        let c = serve(&[
            "--trusted-proxies",
            "10.0.0.0/8,2001:db8::/32",
            "--trusted-proxies",
            "192.0.2.1",
            "--proxy-protocol",
        ])
        .unwrap();
        assert_eq!(c.edge.trusted_proxies.0.len(), 3);
        assert!(c
            .edge
            .trusted_proxies
            .trusts("2001:db8::7".parse().unwrap()));
        assert!(c.edge.proxy_protocol_http && c.edge.proxy_protocol_https);
        let c = serve(&["--proxy-protocol=https"]).unwrap();
        assert!(!c.edge.proxy_protocol_http && c.edge.proxy_protocol_https);
        let line = usage(&["--trusted-proxies", "10.0.0.0/33"]);
        assert!(line.contains("'--trusted-proxies'"), "{line}");
        assert_eq!(c.translate.max_body_bytes, 1 << 20);
        let c = serve(&["--max-body-size", "0"]).unwrap();
        assert_eq!(c.translate.max_body_bytes, 0);
        let line = usage(&["--max-body-size", "big"]);
        assert!(line.contains("'--max-body-size'"), "{line}");
        let line = usage(&["--proxy-protocol=tcp"]);
        assert!(
            line.contains("'--proxy-protocol") && line.contains("'tcp'"),
            "{line}"
        );
    }

    #[test]
    fn default_tls_secret() {
        assert_eq!(serve(&[]).unwrap().translate.default_tls_secret, None);
        let c = serve(&["--default-tls-secret", "edge/wild"]).unwrap();
        assert_eq!(
            c.translate.default_tls_secret,
            Some(NsName::new("edge", "wild"))
        );
        for bad in ["wild", "/x", "x/", "a/b/c"] {
            let line = usage(&["--default-tls-secret", bad]);
            assert!(line.contains("'--default-tls-secret'"), "{line}");
        }
    }

    #[test]
    fn bad_values_are_one_line() {
        let line = usage(&["--upstream-family", "x"]);
        assert!(
            line.starts_with("invalid value 'x' for '--upstream-family': "),
            "{line}"
        );
        assert!(line.contains("PreferSameFamily, RequireSameFamily, PreferIPv4, PreferIPv6"));
        let line = usage(&["--lb", "random"]);
        assert!(
            line.contains("'--lb'") && line.contains("p2c, round-robin"),
            "{line}"
        );
        let line = usage(&["--http-listen", "localhost:80"]);
        assert!(line.contains("'--http-listen'"), "{line}");
        let line = usage(&["--bogus"]);
        assert!(line.contains("--bogus"), "{line}");
        let line = usage(&["--connect-timeout", "0s"]);
        assert!(line.contains("more than zero"), "{line}");
        for l in [usage(&["--lb", "x"]), usage(&["--bogus"])] {
            assert!(!l.contains('\n'));
        }
    }

    #[test]
    fn http3_listens_on_the_https_addresses_unless_told_and_bad_values_are_usage_errors() {
        assert_eq!(serve(&[]).unwrap().http3, None);
        let c = serve(&["--http3", "--https-listen", "127.0.0.1:9443"]).unwrap();
        let h3 = c.http3.unwrap();
        assert_eq!(h3.listen.addrs, vec!["127.0.0.1:9443".parse().unwrap()]);
        assert_eq!(h3.alt_svc_max_age, Duration::from_secs(3600));
        assert_eq!((h3.max_streams, h3.retry_above), (100, 64));
        let c = serve(&[
            "--http3",
            "--http3-listen",
            "[::1]:443",
            "--http3-max-streams",
            "7",
        ]);
        let h3 = c.unwrap().http3.unwrap();
        assert_eq!(h3.listen.addrs, vec!["[::1]:443".parse().unwrap()]);
        assert_eq!(h3.max_streams, 7);
        for bad in [
            &["--http3-listen", "[::1]:443"][..],
            &["--http3", "--http3-listen", "localhost:443"],
            &["--http3", "--http3-max-streams", "0"],
            &["--http3", "--http3-alt-svc-max-age", "2h"],
            &["--http3", "--http3-retry-above", "-1"],
        ] {
            let err = serve(bad).unwrap_err();
            assert_eq!(err.exit_code(), EXIT_USAGE, "{bad:?}");
            assert!(!err.to_string().contains('\n'), "{bad:?}: {err}");
        }
    }

    #[test]
    fn resolv_conf_defaults_to_the_pods_and_a_missing_one_is_a_usage_error() {
        let dir = std::env::temp_dir();
        let dir = dir.to_str().unwrap();
        let config = parse(["duet", "serve", "--manifests", dir]).unwrap();
        assert_eq!(config.resolv_conf, PathBuf::from("/etc/resolv.conf"));
        let args = [
            "duet",
            "serve",
            "--manifests",
            dir,
            "--resolv-conf",
            "/nonexistent/resolv",
        ];
        let err = parse(args).unwrap_err();
        assert_eq!(err.exit_code(), EXIT_USAGE);
        assert!(err.to_string().contains("--resolv-conf"), "{err}");
    }

    #[test]
    fn loopback_endpoints_are_allowed_with_manifests_or_the_test_only_flag() {
        assert!(serve(&[]).unwrap().translate.allow_loopback_endpoints);
        let kube = |extra: &[&str]| {
            let mut args = vec!["duet", "serve", "--kubeconfig", "/tmp/kc"];
            args.extend_from_slice(extra);
            parse(args).unwrap().translate.allow_loopback_endpoints
        };
        assert!(!kube(&[]), "Kubernetes mode refuses loopback endpoints");
        assert!(kube(&["--allow-loopback-endpoints"]));
    }

    #[test]
    fn missing_manifest_folder_is_a_usage_error() {
        let err = parse(["duet", "serve", "--manifests", "/nonexistent/duet-test"]).unwrap_err();
        assert_eq!(err.exit_code(), EXIT_USAGE);
        assert!(err.to_string().contains("/nonexistent/duet-test"));
    }

    #[test]
    fn missing_subcommand_is_a_usage_error() {
        let err = parse(["duet"]).unwrap_err();
        assert_eq!(err.exit_code(), EXIT_USAGE);
        assert!(err.to_string().contains("duet serve"), "{err}");
    }

    #[test]
    fn help_and_version_are_not_errors() {
        for flag in ["--help", "--version"] {
            let err = parse(["duet", flag]).unwrap_err();
            assert_eq!(err.exit_code(), 0, "{flag}");
        }
        assert_eq!(
            parse(["duet", "serve", "--help"]).unwrap_err().exit_code(),
            0
        );
    }

    #[test]
    fn kubernetes_flags() {
        let c = parse([
            "duet",
            "serve",
            "--kubeconfig",
            "/tmp/kc",
            "--watch-namespace",
            "shop",
            "--watch-namespace",
            "blog",
            "--publish-service",
            "duet/edge",
            "--election-namespace",
            "duet",
            "--election-lease-duration",
            "3s",
        ])
        .unwrap();
        assert_eq!(c.kube.settings.namespaces, ["shop", "blog"]);
        assert!(c.kube.gateway.watches("blog") && !c.kube.gateway.watches("other"));
        assert_eq!(
            c.kube.settings.kubeconfig.as_deref(),
            Some(std::path::Path::new("/tmp/kc"))
        );
        assert_eq!(
            c.kube.publish,
            Publish::Service(NsName::new("duet", "edge"))
        );
        assert_eq!(c.kube.election_namespace.as_deref(), Some("duet"));
        assert_eq!(c.kube.lease_duration, Duration::from_secs(3));
        assert!(!c.translate.class.class_by_flag_name);

        let c = parse([
            "duet",
            "serve",
            "--publish-status-address",
            "192.0.2.1,2001:db8::1",
            "--publish-status-address",
            "lb.example.com",
        ])
        .unwrap();
        assert_eq!(
            c.kube.publish,
            Publish::Addresses(vec![
                "192.0.2.1".to_owned(),
                "2001:db8::1".to_owned(),
                "lb.example.com".to_owned()
            ])
        );
        assert_eq!(c.kube.lease_duration, Duration::from_secs(15));
        assert_eq!(c.kube.election_id, "duet-leader");
        assert!(serve(&[]).unwrap().translate.class.class_by_flag_name);
        let c = serve(&["--election-id", "edge-duet.leader"]).unwrap();
        assert_eq!(c.kube.election_id, "edge-duet.leader");

        for (args, flag) in [
            (&["--publish-service", "edge"][..], "--publish-service"),
            (&["--publish-service", "duet/Edge"][..], "--publish-service"),
            (
                &["--publish-status-address", "not an address"][..],
                "--publish-status-address",
            ),
            (&["--election-namespace", "A"][..], "--election-namespace"),
            (&["--election-id", "Duet"][..], "--election-id"),
            (&["--election-id", ""][..], "--election-id"),
            (&["--election-id", "a..b"][..], "--election-id"),
            (&["--watch-namespace", ""][..], "--watch-namespace"),
            (
                &[
                    "--publish-service",
                    "a/b",
                    "--publish-status-address",
                    "192.0.2.1",
                ][..],
                "--publish",
            ),
        ] {
            let line = usage(args);
            assert!(line.contains(flag), "{args:?}: {line}");
        }
    }
}
