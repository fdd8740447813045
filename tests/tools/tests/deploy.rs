//! The deployment files of `docs/deploy/` against the program they deploy, without root:
//! every metric the Grafana dashboard and the Prometheus rules query is one that the daemon's,
//! the front door's or the agent's `/metrics` serves (their real registries, encoded); the
//! example configs and the ConfigMaps' configs validate; the capability set is the same
//! everywhere; `systemd-analyze verify` passes on the units; the manifests pass the Kubernetes
//! schemas (`kubernetes-validate --strict`) and the Containerfile passes `hadolint`. A check
//! whose tool is missing says "skipped" and why.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use ailb_userspace::datapath::status::Status;
use ailb_userspace::{agent, daemon::metrics, gateway};
use prometheus_client::registry::Registry;
use promql_parser::parser::{self, Expr};
use yaml_rust2::{Yaml, YamlLoader};

/// The indicators the dashboard opens with, in this order.
const INDICATORS: [&str; 7] = [
    "Metadata update delay",
    "Healthy instance share",
    "Resource match success share",
    "Routing decision time",
    "GPU utilisation",
    "P95 latency",
    "Failure rate",
];

/// Metrics the dashboard may query that no ailb process serves: NVIDIA's DCGM exporter's GPU
/// utilisation (the agent publishes its NVML reading only to Nacos). The panel says so.
const EXTERNAL: [&str; 1] = ["DCGM_FI_DEV_GPU_UTIL"];

/// The series Prometheus itself writes for every scrape target.
const PROMETHEUS_OWN: [&str; 1] = ["up"];

/// The alerts the rules must hold.
const ALERTS: [&str; 5] = [
    "AilbDiscoveryStale",
    "AilbModelNoLiveBackend",
    "AilbModelSaturated",
    "AilbAffinityBreaksRising",
    "AilbAgentNotPublishing",
];

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/deploy")
}

fn read(rel: &str) -> String {
    let p = deploy_dir().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn yaml_docs(rel: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: not YAML: {e}"))
}

/// Every sample name the three processes' `/metrics` can serve, from their registries as the
/// binaries build them, encoded: `# TYPE` lines give each family and its type, and the
/// samples of a counter end in `_total`, those of a histogram in `_bucket`, `_sum`, `_count`.
fn served_metrics() -> BTreeSet<String> {
    let mut registry = Registry::default();
    // A family is encoded once it has a child: one each, as a daemon with one model, one
    // backend and a front door that answered one request serves.
    let model = metrics::ModelLabel { model: "m".into() };
    let backend = metrics::BackendLabel { model: "m".into(), backend: "10.0.0.1:8000".into() };
    let daemon = metrics::Metrics::new(&mut registry);
    daemon.table_rebuilds.get_or_create(&model).inc();
    daemon.backend_weight.get_or_create(&backend).set(1);
    daemon.backend_eligible.get_or_create(&backend).set(1);
    daemon.excluded.get_or_create(&metrics::ReasonLabel { reason: "memory".into() }).set(0);
    daemon.model_available.get_or_create(&model).set(1);
    daemon
        .invalid_metadata
        .get_or_create(&metrics::InvalidLabel { key: "gpu_util".into(), effect: "ignored".into() })
        .set(0);
    // The kernel counters are read from the pinned maps at scrape time; an empty status
    // encodes every family they make.
    registry.register_collector(Box::new(metrics::StatusCollector(Status::default(), Default::default())));
    let _agent = agent::metrics::AgentMetrics::new(&mut registry);
    let gw = gateway::metrics::GatewayMetrics::new(&mut registry);
    gw.requests.get_or_create(&gateway::metrics::StatusLabel { model: "m".into(), status: 200 }).inc();
    gw.ttfb_seconds.get_or_create(&model).observe(0.1);
    gw.duration_seconds.get_or_create(&model).observe(0.2);
    gw.in_flight.get_or_create(&model).set(0);
    gw.upstream_connections.get_or_create(&gateway::metrics::ReuseLabel { reused: false }).inc();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoding the registries");

    let mut names = BTreeSet::new();
    for line in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let (name, kind) = line.split_once(' ').unwrap_or_else(|| panic!("bad TYPE line {line:?}"));
        match kind {
            "counter" => names.insert(format!("{name}_total")),
            "gauge" => names.insert(name.to_string()),
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
                true
            }
            other => panic!("{name}: metric type {other} is not handled here"),
        };
    }
    // The families the dashboard and the alerts rest on: a registry that lost them would make
    // the comparison below vacuous.
    for must in [
        "ailb_kernel_picks_total",
        "ailb_backend_inflight",
        "ailb_discovery_stale_seconds",
        "ailb_agent_beats_total",
        "ailb_gateway_duration_seconds_bucket",
        "ailb_backend_eligible",
        "ailb_gateway_requests_total",
    ] {
        assert!(names.contains(must), "{must} is not in the encoded registries:\n{text}");
    }
    names
}

/// The metric names a PromQL expression selects. Grafana's `$__rate_interval` is replaced by
/// a duration first; label values such as `"$model"` are plain strings to the parser.
fn promql_metrics(expr: &str, origin: &str) -> BTreeSet<String> {
    let text = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m");
    let ast = parser::parse(&text).unwrap_or_else(|e| panic!("{origin}: PromQL does not parse: {e}\n{expr}"));
    let mut out = BTreeSet::new();
    collect(&ast, origin, &mut out);
    assert!(!out.is_empty(), "{origin}: the expression selects no metric: {expr}");
    out
}

fn collect(e: &Expr, origin: &str, out: &mut BTreeSet<String>) {
    let mut selector = |vs: &parser::VectorSelector| match &vs.name {
        Some(n) => {
            out.insert(n.clone());
        }
        None => panic!("{origin}: a selector without a metric name ({vs}); name it, so it can be checked"),
    };
    match e {
        Expr::VectorSelector(vs) => selector(vs),
        Expr::MatrixSelector(m) => selector(&m.vs),
        Expr::Aggregate(a) => {
            collect(&a.expr, origin, out);
            if let Some(p) = &a.param {
                collect(p, origin, out);
            }
        }
        Expr::Unary(u) => collect(&u.expr, origin, out),
        Expr::Binary(b) => {
            collect(&b.lhs, origin, out);
            collect(&b.rhs, origin, out);
        }
        Expr::Paren(p) => collect(&p.expr, origin, out),
        Expr::Subquery(s) => collect(&s.expr, origin, out),
        Expr::Call(c) => c.args.args.iter().for_each(|a| collect(a, origin, out)),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => {}
        Expr::Extension(_) => panic!("{origin}: a PromQL extension node"),
    }
}

/// Every panel of the dashboard, rows' nested panels included, in order.
fn dashboard_panels(dash: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = vec![];
    for p in dash["panels"].as_array().expect("the dashboard has panels") {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

#[test]
fn dashboard_opens_with_the_indicators_and_queries_only_served_metrics() {
    let served = served_metrics();
    let dash: serde_json::Value = serde_json::from_str(&read("grafana/ailb.json")).expect("ailb.json is JSON");
    let panels = dashboard_panels(&dash);
    let graphs: Vec<_> = panels.iter().filter(|p| p["type"] != "row").collect();
    let titles: Vec<&str> = graphs.iter().take(INDICATORS.len()).map(|p| p["title"].as_str().unwrap_or("")).collect();
    assert_eq!(titles, INDICATORS, "the dashboard's first panels");

    let mut queried = BTreeSet::new();
    for p in &graphs {
        let title = p["title"].as_str().unwrap_or("?");
        let desc = p["description"].as_str().unwrap_or("");
        assert!(desc.len() > 20, "panel {title:?}: a description says what it shows");
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("panel {title:?} has no targets"));
        assert!(!targets.is_empty(), "panel {title:?} has no targets");
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("panel {title:?}: a target without expr"));
            for m in promql_metrics(expr, &format!("panel {title:?}")) {
                let external = EXTERNAL.contains(&m.as_str());
                assert!(
                    served.contains(&m) || external,
                    "panel {title:?} queries {m}, which no ailb /metrics serves (served: {served:?})"
                );
                if external {
                    assert!(desc.contains(&m), "panel {title:?}: {m} is not ailb's; the description must name it");
                }
                queried.insert(m);
            }
        }
    }
    // The variables' queries: label_values(METRIC, LABEL).
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        let Some(q) = v["query"]["query"].as_str().or(v["query"].as_str()) else { continue };
        if let Some(args) = q.strip_prefix("label_values(") {
            let metric = args.split([',', ')']).next().unwrap_or("").trim();
            assert!(served.contains(metric), "variable {}: {metric} is not served", v["name"]);
            queried.insert(metric.to_string());
        }
    }
    println!(
        "dashboard: {} panels, {} metrics, all served or named external: {queried:?}",
        graphs.len(),
        queried.len()
    );
}

#[test]
fn alert_rules_query_only_served_metrics() {
    let served = served_metrics();
    let docs = yaml_docs("prometheus/alerts.yml");
    assert_eq!(docs.len(), 1, "alerts.yml: one YAML document");
    let groups = docs[0]["groups"].as_vec().expect("alerts.yml: groups");
    let mut recorded = BTreeSet::new();
    let mut rules = vec![];
    for g in groups {
        let name = g["name"].as_str().expect("a group has a name");
        for r in g["rules"].as_vec().unwrap_or_else(|| panic!("group {name}: rules")) {
            let expr = r["expr"].as_str().unwrap_or_else(|| panic!("group {name}: a rule without expr"));
            match (r["record"].as_str(), r["alert"].as_str()) {
                (Some(rec), None) => {
                    recorded.insert(rec.to_string());
                    rules.push((format!("record {rec}"), expr));
                }
                (None, Some(alert)) => {
                    assert!(r["for"].as_str().is_some(), "alert {alert}: a `for`, so one bad scrape does not page");
                    assert!(r["labels"]["severity"].as_str().is_some(), "alert {alert}: labels.severity");
                    assert!(r["annotations"]["summary"].as_str().is_some(), "alert {alert}: annotations.summary");
                    rules.push((format!("alert {alert}"), expr));
                }
                _ => panic!("group {name}: a rule is either `record` or `alert`"),
            }
        }
    }
    for want in ALERTS {
        assert!(rules.iter().any(|(n, _)| *n == format!("alert {want}")), "alerts.yml has no alert {want}");
    }
    let mut queried = BTreeSet::new();
    for (rule, expr) in &rules {
        for m in promql_metrics(expr, rule) {
            assert!(
                served.contains(&m) || recorded.contains(&m) || PROMETHEUS_OWN.contains(&m.as_str()),
                "{rule} queries {m}, which no ailb /metrics serves and no rule records (served: {served:?})"
            );
            queried.insert(m);
        }
    }
    println!("alerts.yml: {} rules, every metric served or recorded: {queried:?}", rules.len());
}

#[test]
fn the_keda_scaler_queries_only_served_metrics() {
    let served = served_metrics();
    let docs = yaml_docs("autoscaling/keda-scaledobject.yaml");
    assert_eq!(docs.len(), 1, "keda-scaledobject.yaml: one YAML document");
    assert_eq!(docs[0]["kind"].as_str(), Some("ScaledObject"));
    assert!(docs[0]["spec"]["scaleTargetRef"]["name"].as_str().is_some(), "spec.scaleTargetRef.name");
    let triggers = docs[0]["spec"]["triggers"].as_vec().expect("spec.triggers");
    let mut queried = BTreeSet::new();
    for (i, t) in triggers.iter().enumerate() {
        assert_eq!(t["type"].as_str(), Some("prometheus"), "trigger {i}");
        let m = &t["metadata"];
        let threshold = m["threshold"].as_str().and_then(|v| v.parse::<f64>().ok());
        assert!(threshold.is_some_and(|v| v > 0.0), "trigger {i}: threshold a positive number as a string");
        let query = m["query"].as_str().unwrap_or_else(|| panic!("trigger {i}: metadata.query"));
        for name in promql_metrics(query, &format!("trigger {i}")) {
            assert!(served.contains(&name), "trigger {i} queries {name}, which no ailb /metrics serves");
            queried.insert(name);
        }
    }
    assert!(queried.contains("ailb_model_inflight") && queried.contains("ailb_model_capacity"), "{queried:?}");
    println!("keda-scaledobject.yaml: {} triggers over {queried:?}", triggers.len());
}

fn check_gateway_config(text: &str, origin: &str) -> ailb_userspace::config::ValidConfig {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("ailb.toml");
    std::fs::write(&p, text).expect("writing the config");
    let (cfg, _) = gateway::load(Some(&p)).unwrap_or_else(|e| panic!("{origin}: `ailb check` would fail: {e}"));
    cfg
}

fn check_agent_config(text: &str, origin: &str) {
    agent::config::AgentConfig::parse(text, origin)
        .and_then(|c| c.validate())
        .unwrap_or_else(|e| panic!("{origin}: the agent would not start: {e}"));
}

/// `Key=` values of a unit file (every line that sets it, in order).
fn unit_values(unit: &str, key: &str) -> Vec<String> {
    let prefix = format!("{key}=");
    read(&format!("systemd/{unit}")).lines().filter_map(|l| l.strip_prefix(&prefix)).map(str::to_owned).collect()
}

#[test]
fn configs_validate_and_agree_with_the_units() {
    let cfg = check_gateway_config(&read("etc/ailb.toml"), "docs/deploy/etc/ailb.toml");
    check_agent_config(&read("etc/agent.toml"), "docs/deploy/etc/agent.toml");
    let one = check_gateway_config(&read("etc/onebox.toml"), "docs/deploy/etc/onebox.toml");
    assert!(
        one.backends.iter().all(|b| b.telemetry.as_ref().is_some_and(|t| t.nvml)),
        "etc/onebox.toml: every backend sampled, with its GPUs"
    );

    // The front door runs in the cgroup the daemon attaches to, and the daemon may write its pins.
    assert_eq!(unit_values("ailb-gateway.service", "Slice"), ["ailb.slice"]);
    assert_eq!(cfg.cgroup, "ailb.slice", "etc/ailb.toml daemon.cgroup: the front door's slice");
    assert_eq!(unit_values("ailb-run.service", "ReadWritePaths"), [cfg.bpffs.display().to_string()]);

    for doc in yaml_docs("k8s/gateway-configmap.yaml") {
        let text = doc["data"]["ailb.toml"].as_str().expect("the gateway ConfigMap holds ailb.toml");
        let cfg = check_gateway_config(text, "k8s/gateway-configmap.yaml ailb.toml");
        assert_eq!(cfg.cgroup, "/", "k8s: the host's cgroup2 root, an ancestor of the front door container");
    }
    let mut agents = 0;
    for doc in yaml_docs("k8s/agent-configmap.yaml") {
        for (key, value) in doc["data"].as_hash().expect("the agent ConfigMap has data") {
            let (Some(key), Some(text)) = (key.as_str(), value.as_str()) else {
                panic!("agent ConfigMap: string data")
            };
            check_agent_config(text, &format!("k8s/agent-configmap.yaml {key}"));
            agents += 1;
        }
    }
    assert!(agents > 0, "the agent ConfigMap holds no config");
}

#[test]
fn the_capability_set_is_the_same_everywhere() {
    let caps: Vec<String> = read("capabilities.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    assert!(!caps.is_empty(), "capabilities.txt lists no capability");
    let words = |v: Vec<String>| -> Vec<String> { v.join(" ").split_whitespace().map(str::to_owned).collect() };
    for key in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        assert_eq!(words(unit_values("ailb-run.service", key)), caps, "ailb-run.service {key}");
    }
    for unit in ["ailb-gateway.service", "ailb-agent.service"] {
        for key in ["CapabilityBoundingSet", "AmbientCapabilities"] {
            assert_eq!(unit_values(unit, key), [""], "{unit} {key}: none");
        }
    }
    let ds = &yaml_docs("k8s/gateway-daemonset.yaml")[0];
    let containers = ds["spec"]["template"]["spec"]["containers"].as_vec().expect("containers");
    let run = containers.iter().find(|c| c["name"].as_str() == Some("run")).expect("the `run` container");
    let added: Vec<String> = run["securityContext"]["capabilities"]["add"]
        .as_vec()
        .expect("run: capabilities.add")
        .iter()
        .map(|c| format!("CAP_{}", c.as_str().expect("a capability name")))
        .collect();
    assert_eq!(added, caps, "k8s/gateway-daemonset.yaml, container run");
    for c in containers.iter().filter(|c| c["name"].as_str() != Some("run")) {
        assert!(c["securityContext"]["capabilities"]["add"].is_badvalue(), "{:?} adds no capability", c["name"]);
    }
}

fn tool(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}

/// A program of the venv `cargo xtask setup` makes in `target/deploy-venv`.
fn venv_tool(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/deploy-venv/bin").join(name);
    p.is_file().then_some(p)
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

const UNITS: [&str; 4] = ["ailb.slice", "ailb-run.service", "ailb-gateway.service", "ailb-agent.service"];

#[test]
fn systemd_units_verify_and_stay_hardened() {
    let Some(analyze) = tool("systemd-analyze") else {
        println!(
            "skipped: systemd-analyze is not on PATH (Debian: apt-get install systemd); the units were not verified"
        );
        return;
    };
    // verify checks that every ExecStart program exists: /usr/bin/ailb is not installed here,
    // so the copies point at an empty executable instead. Nothing else is changed.
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = dir.path().join("ailb");
    std::fs::write(&stub, "#!/bin/sh\n").expect("stub");
    std::fs::set_permissions(&stub, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let mut paths = vec![];
    for u in UNITS {
        let text = read(&format!("systemd/{u}")).replace("/usr/bin/ailb ", &format!("{} ", stub.display()));
        let p = dir.path().join(u);
        std::fs::write(&p, text).expect("unit copy");
        paths.push(p);
    }
    let (ok, out) = run(Command::new(&analyze).arg("verify").args(&paths));
    assert!(ok && out.trim().is_empty(), "systemd-analyze verify:\n{out}");
    println!("systemd-analyze verify: {} units clean", UNITS.len());

    // The exposure score systemd computes from the sandboxing (0 = locked down, 10 = none).
    for (unit, most) in [("ailb-run.service", 3.0), ("ailb-gateway.service", 2.0), ("ailb-agent.service", 2.0)] {
        let p = dir.path().join(unit);
        let (_, out) = run(Command::new(&analyze).args(["security", "--offline=yes"]).arg(&p));
        let score: f64 = out
            .lines()
            .find_map(|l| {
                l.split_once("Overall exposure level for ")?.1.split_once(": ")?.1.split(' ').next()?.parse().ok()
            })
            .unwrap_or_else(|| panic!("systemd-analyze security {unit}: no overall exposure level:\n{out}"));
        assert!(score <= most, "{unit}: exposure {score} above {most}:\n{out}");
        println!("systemd-analyze security {unit}: exposure {score} (at most {most})");
    }
}

#[test]
fn kubernetes_manifests_match_the_schemas() {
    let Some(validate) = venv_tool("kubernetes-validate") else {
        println!("skipped: no target/deploy-venv/bin/kubernetes-validate (cargo xtask setup installs it); manifests not validated");
        return;
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_dir().join("k8s"))
        .expect("docs/deploy/k8s")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "k8s/: {files:?}");
    let (ok, out) = run(Command::new(&validate).arg("--strict").args(&files));
    assert!(ok, "kubernetes-validate --strict:\n{out}");
    assert_eq!(out.matches(" passed for resource ").count(), files.len(), "one resource per file:\n{out}");
    println!("{out}");
}

#[test]
fn containerfile_passes_hadolint() {
    let Some(hadolint) = venv_tool("hadolint") else {
        println!(
            "skipped: no target/deploy-venv/bin/hadolint (cargo xtask setup installs it); Containerfile not linted"
        );
        return;
    };
    let (ok, out) = run(Command::new(&hadolint).arg(deploy_dir().join("Containerfile")));
    assert!(ok && out.trim().is_empty(), "hadolint docs/deploy/Containerfile:\n{out}");
    println!("hadolint docs/deploy/Containerfile: clean");
}
