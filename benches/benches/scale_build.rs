//! The control loop's publish at scale, from a `gen-scale.py` folder (`SCALE_DIR`, default
//! `/tmp/scale`): the folder read, the first full build and apply, then one Ingress change (a
//! path added to the first Ingress), one EndpointSlice change and two Service changes (its port's
//! `appProtocol` set to `kubernetes.io/h2c` and back), each published as `duet serve`
//! does ([`App::publish`]). Prints the wall time of each step and, for the publishes, the CPU
//! time of the thread that ran it (`*_cpu_ms`, from `/proc/thread-self/schedstat`: what the
//! shared machine's load inflates less; it advances by scheduler ticks, about 4 ms); `ROUNDS`
//! repeats the changes; `first_publish_minor_faults` counts the pages the first publish touched
//! first (all threads). Allocates with jemalloc, as `duet` does. Not
//! a criterion bench: one first build is what `scale.sh` measures, and profilers
//! (`perf record`, callgrind) can run it alone:
//!
//!     SCALE_DIR=/tmp/scale cargo bench -p benches --bench scale_build

use std::path::PathBuf;
use std::time::Instant;

use controller::app::{App, AppConfig};
use controller::index::Change;
use controller::source::files::{self, FileSource};
use controller::translate;
use dataplane::{ProxyConfig, Runtime};

/// The `duet` binary's allocator (its `jemalloc` feature): allocation costs and page faults as
/// there.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let dir = PathBuf::from(std::env::var("SCALE_DIR").unwrap_or_else(|_| "/tmp/scale".into()));
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let info: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(".scale.json")).expect("a gen-scale.py folder"),
    )
    .expect(".scale.json is JSON");
    let field = |k: &str| info[k].as_str().expect("a .scale.json field").to_owned();

    let started = Instant::now();
    let changes = FileSource::new(&dir).scan().expect("the folder reads");
    println!("folder_read_ms: {:.1}", ms(started));

    let runtime = Runtime::new(ProxyConfig::default());
    // As `duet serve --manifests` configures it: gen-scale.py's pods are on loopback, which
    // only the folder mode admits (else every endpoint is refused, with a diagnostic each).
    let config = translate::Config {
        allow_loopback_endpoints: true,
        ..translate::Config::default()
    };
    let mut app = App::new(AppConfig::new(config.clone()), runtime);
    let started = Instant::now();
    app.ingest(changes);
    println!("index_ms: {:.1}", ms(started));
    let started = Instant::now();
    let cpu = thread_cpu_ns();
    let faults = minor_faults();
    app.publish().expect("a first snapshot");
    println!("first_publish_ms: {:.1}", ms(started));
    println!("first_publish_cpu_ms: {:.1}", cpu_ms(cpu));
    println!(
        "first_publish_minor_faults: {}",
        minor_faults().saturating_sub(faults)
    );

    route_phase(&app, &config);

    let ingress = std::fs::read_to_string(dir.join(field("ingress_file"))).expect("ingress file");
    let slice = std::fs::read_to_string(dir.join(field("endpointslice_file"))).expect("slice");
    let path = field("ingress_new_path");
    let service = field("ingress_service");
    for round in 0..rounds {
        let added = format!(
            "          - {{path: {path}-{round}, pathType: Exact, backend: {{service: {{name: {service}, port: {{name: http}}}}}}}}\n"
        );
        publish_change(&mut app, "ingress", &format!("{ingress}{added}"));
        let address = field("endpointslice_address");
        let moved = slice.replace(&address, &format!("127.254.254.{}", round + 1));
        publish_change(&mut app, "endpointslice", &moved);
        // The slice's Service (as gen-scale.py writes it) with its port's protocol changed,
        // then back: a change of what the routes of the Ingress reading it read.
        for app_protocol in [", appProtocol: kubernetes.io/h2c", ""] {
            let service = service_of(&slice, app_protocol);
            publish_change(&mut app, "service", &service);
        }
    }
}

/// The Service of the EndpointSlice `slice` (its namespace and `kubernetes.io/service-name`
/// label) as gen-scale.py writes it, with `port_extra` in its port.
fn service_of(slice: &str, port_extra: &str) -> String {
    // The first of each (the file may hold the Service first: gen-scale.py's `service` layout).
    let value = |prefix: &str| {
        let at = slice.find(prefix).expect("the slice names it") + prefix.len();
        let end = |c: char| c == '\n' || c == '}' || c == ',';
        slice[at..]
            .split(end)
            .next()
            .expect("a value")
            .trim()
            .to_owned()
    };
    let namespace = value("namespace: ");
    let name = value("kubernetes.io/service-name: ");
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  ports: [{{name: http, port: 80, targetPort: http{port_extra}}}]\n"
    )
}

/// The route phase alone (`ROUTE_ROUNDS`, 3), on one thread and split over the cores
/// (`translate::plan_routes_in_parts`), interleaved: wall time and the process's CPU time (all
/// threads) of each.
fn route_phase(app: &App, config: &translate::Config) {
    let rounds: usize = std::env::var("ROUTE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let inputs = app.index().inputs();
    for _ in 0..rounds {
        for (name, parts) in [("one_thread", 1), ("split", cores)] {
            let started = Instant::now();
            let cpu = process_cpu_ns();
            let plan = translate::plan_routes_in_parts(&inputs, config, parts, 1024);
            let wall = ms(started);
            let cpu = process_cpu_ns().saturating_sub(cpu) as f64 / 1e6;
            println!("route_phase_{name}_ms: {wall:.1}");
            println!("route_phase_{name}_cpu_ms: {cpu:.1}");
            drop(plan);
        }
    }
}

/// The process's minor page faults so far (`minflt` of `/proc/self/stat`: pages the kernel
/// gave on first touch, all threads); 0 without it.
fn minor_faults() -> u64 {
    let [faults] = stat_fields([7]);
    faults
}

/// The fields `wanted` after the command of one read of `/proc/self/stat` (state is 0), as
/// numbers; 0 for each without it.
fn stat_fields<const N: usize>(wanted: [usize; N]) -> [u64; N] {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    wanted.map(|i| fields.get(i).and_then(|f| f.parse().ok()).unwrap_or(0))
}

/// Nanoseconds every thread of this process has run (utime + stime of `/proc/self/stat`, in
/// clock ticks of 10 ms); 0 without it.
fn process_cpu_ns() -> u64 {
    // After the command's `)`: state is field 0, utime 11, stime 12.
    let [user, system] = stat_fields([11, 12]);
    (user + system) * 10_000_000
}

/// Applies the objects of `yaml` and publishes; prints the publish time.
fn publish_change(app: &mut App, name: &str, yaml: &str) {
    let parsed = files::parse(yaml, &[]);
    assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
    let changes: Vec<Change> = parsed
        .objects
        .into_iter()
        .map(|object| Change::Apply { object, file: None })
        .collect();
    app.ingest(changes);
    let started = Instant::now();
    let cpu = thread_cpu_ns();
    app.publish().expect("the change is published");
    println!("{name}_publish_ms: {:.3}", ms(started));
    println!("{name}_publish_cpu_ms: {:.3}", cpu_ms(cpu));
}

/// Nanoseconds this thread has run on a CPU (the first field of its schedstat); 0 without it.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn cpu_ms(since_ns: u64) -> f64 {
    thread_cpu_ns().saturating_sub(since_ns) as f64 / 1e6
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}
