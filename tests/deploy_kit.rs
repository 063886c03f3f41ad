//! The deployment kit under `docker/`, checked by the real tools that read it: Debian's
//! `docker-compose` and `promtool`, PyPI's `kubernetes-validate`, `check-jsonschema` and
//! `grafana-foundation-sdk` (installed by `scripts/setup.sh`). There is no Docker daemon or
//! cluster here, so what is checked is what those tools accept, and that the files agree with
//! each other and with the gateway's own config parser (ports, probes, grace periods, names).

mod support;

use infergate::config::{Backend, Config, HumanDuration};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kit(path: &str) -> PathBuf {
    support::repo_root().join("docker").join(path)
}

fn venv_tool(name: &str) -> PathBuf {
    support::venv_dir().join("bin").join(name)
}

/// Runs a command to completion (after `scripts/setup.sh`, which installs the tools).
fn run(command: &mut Command) -> Output {
    support::ensure_setup().expect("scripts/setup.sh");
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e} (scripts/setup.sh installs it)"))
}

fn assert_ok(output: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The YAML documents of `paths` (or of `stdin` text), as JSON values.
fn yaml(paths: &[&Path], stdin: Option<&str>) -> Vec<Value> {
    support::ensure_setup().expect("scripts/setup.sh");
    let script = support::repo_root().join("tests/python/yaml_to_json.py");
    let mut command = Command::new(support::venv_python());
    command.arg(&script);
    let output = match stdin {
        Some(text) => {
            use std::io::Write;
            let mut child = command
                .arg("-")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("python");
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
            child.wait_with_output().unwrap()
        }
        None => run(command.args(paths)),
    };
    let text = assert_ok(&output, "yaml_to_json.py");
    serde_json::from_str::<Vec<Value>>(&text).expect("JSON")
}

fn compose_config(profiles: &str) -> Output {
    run(Command::new("docker-compose")
        .arg("-f")
        .arg(kit("compose.yaml"))
        .arg("--env-file")
        .arg(kit(".env"))
        .arg("config")
        .env("COMPOSE_PROFILES", profiles))
}

fn ports_of(config: &Config) -> BTreeSet<u16> {
    let listen = &config.listen;
    [Some(listen.http), listen.grpc, listen.metrics, listen.admin]
        .into_iter()
        .flatten()
        .map(|addr| addr.port())
        .collect()
}

fn image_config() -> Config {
    Config::load(&kit("gateway.toml")).unwrap_or_else(|e| panic!("docker/gateway.toml: {e}"))
}

/// Every profile set a user may run: each Triton flavour, alone or with the second replica.
const PROFILE_SETS: [&str; 4] = ["cpu", "gpu", "cpu,replicas", "gpu,replicas"];

/// The stack as compose resolves it for `profiles` (`services` only holds every service,
/// whatever its profiles: docker-compose v1 lists them all).
fn resolved_stack(profiles: &str) -> Value {
    let resolved = assert_ok(&compose_config(profiles), "docker-compose config");
    yaml(&[], Some(&resolved)).remove(0)["services"].take()
}

/// The services `up` starts with `profiles`: those in no profile, and those in one of them.
fn running<'a>(stack: &'a Value, profiles: &str) -> Vec<(&'a str, &'a Value)> {
    let active: Vec<&str> = profiles.split(',').collect();
    stack
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, service)| {
            service["profiles"]
                .as_array()
                .is_none_or(|p| p.iter().any(|p| active.contains(&p.as_str().unwrap())))
        })
        .map(|(name, service)| (name.as_str(), service))
        .collect()
}

/// A gateway of the stack: its service, and the config it runs (the file mounted over the
/// image's, or the image's own), parsed by the gateway and as raw TOML (to tell a key left
/// to its default from one set).
struct Gateway<'a> {
    name: &'a str,
    service: &'a Value,
    config: Config,
    toml: toml::Table,
}

impl Gateway<'_> {
    /// What replicas of one pool share: the registry (endpoints and prefix) and the Tritons.
    fn pool(&self) -> (Option<(&Vec<String>, &String)>, &Vec<Backend>) {
        let cluster = self.config.cluster.as_ref();
        (cluster.map(|c| (&c.etcd, &c.prefix)), &self.config.backends)
    }
}

/// The gateways among `services` (those built from docker/Dockerfile).
fn gateways<'a>(services: &[(&'a str, &'a Value)]) -> Vec<Gateway<'a>> {
    services
        .iter()
        .filter(|(_, s)| s["build"]["dockerfile"] == "docker/Dockerfile")
        .map(|&(name, service)| {
            let mounted = service["volumes"].as_array().and_then(|volumes| {
                volumes.iter().find_map(|v| {
                    v.as_str()?
                        .strip_suffix(":/etc/infergate/gateway.toml:ro")
                        .map(PathBuf::from)
                })
            });
            let path = mounted.unwrap_or_else(|| kit("gateway.toml"));
            let text = std::fs::read_to_string(&path).unwrap();
            let config =
                Config::parse(&text).unwrap_or_else(|e| panic!("{name}: {}: {e}", path.display()));
            let toml = text.parse().unwrap();
            Gateway {
                name,
                service,
                config,
                toml,
            }
        })
        .collect()
}

/// Whether the raw config sets `cluster.replica` itself (else the host name is the name).
fn names_its_replica(toml: &toml::Table) -> bool {
    toml.get("cluster").and_then(|c| c.get("replica")).is_some()
}

/// `host` and `port` of an `http://host:port` endpoint.
fn host_port(url: &str) -> (&str, u16) {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, port) = rest
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{url}: no port"));
    (host, port.parse().unwrap())
}

/// The value of `--flag=` in an etcd command line.
fn flag<'a>(command: &'a Value, flag: &str) -> &'a str {
    command
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a.as_str()?.strip_prefix(&format!("--{flag}=")))
        .unwrap_or_else(|| panic!("etcd runs without --{flag}: {command}"))
}

/// etcd listens on `port` on every interface, with history compaction on (the registry
/// rewrites its keys all the time: without it etcd fills its quota and refuses writes).
fn assert_etcd_serves(command: &Value, port: u16, what: &str) {
    let listen = flag(command, "listen-client-urls");
    assert!(
        listen
            .split(',')
            .any(|u| u == format!("http://0.0.0.0:{port}")),
        "{what} does not listen on {port}: {listen}"
    );
    assert!(
        !flag(command, "auto-compaction-retention").is_empty(),
        "{what}: no compaction"
    );
}

#[test]
fn compose_accepts_the_stack_with_its_env_file_in_every_profile() {
    for profiles in PROFILE_SETS {
        let quiet = run(Command::new("docker-compose")
            .arg("-f")
            .arg(kit("compose.yaml"))
            .arg("--env-file")
            .arg(kit(".env"))
            .args(["config", "-q"])
            .env("COMPOSE_PROFILES", profiles));
        assert_ok(&quiet, &format!("docker-compose config -q ({profiles})"));
    }
    let schema = run(Command::new(venv_tool("check-jsonschema"))
        .args(["--builtin-schema", "vendor.compose-spec"])
        .arg(kit("compose.yaml")));
    assert_ok(&schema, "check-jsonschema (compose spec)");

    let stack = &resolved_stack("cpu,replicas");
    let gateways = gateways(&running(stack, "cpu,replicas"));
    assert_eq!(gateways.len(), 2, "two replicas with `replicas`");
    // Every backend of the gateways' config is a name the stack answers to in both the
    // CPU and the GPU profile (a service name, or a GPU service's alias).
    for backend in gateways.iter().flat_map(|g| &g.config.backends) {
        let http = backend.http.as_deref().expect("compose names each Triton");
        let host = http.trim_start_matches("http://");
        let host = host.split(':').next().unwrap();
        assert!(
            stack[host].is_object(),
            "no service {host} in the cpu profile"
        );
        let gpu = &stack[format!("{host}-gpu")];
        let aliases = &gpu["networks"]["default"]["aliases"];
        assert!(
            aliases
                .as_array()
                .is_some_and(|a| a.contains(&Value::from(host))),
            "the gpu profile's {host}-gpu does not answer to {host}: {gpu}"
        );
        assert!(
            stack[host]["deploy"].is_null(),
            "the cpu Triton must not reserve a GPU"
        );
        let devices = &gpu["deploy"]["resources"]["reservations"]["devices"][0];
        assert_eq!(devices["driver"], "nvidia", "{gpu}");
        for triton in [&stack[host], gpu] {
            let command = triton["command"].to_string();
            assert!(
                command.contains("--model-control-mode=explicit"),
                "{command}"
            );
            let volumes = triton["volumes"].to_string();
            assert!(
                volumes.contains(":/models:ro"),
                "read-only models: {volumes}"
            );
        }
    }
    // Each gateway publishes every port its config listens on.
    for gateway in &gateways {
        let published: BTreeSet<u16> = gateway.service["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["target"].as_u64().unwrap() as u16)
            .collect();
        assert_eq!(published, ports_of(&gateway.config), "{}", gateway.name);
    }
    assert_eq!(stack["infergate-2"]["profiles"][0], "replicas");
}

#[test]
fn compose_replicas_share_one_registry_they_can_reach_in_every_profile() {
    for profiles in PROFILE_SETS {
        let stack = resolved_stack(profiles);
        let services = running(&stack, profiles);
        let gateways = gateways(&services);
        assert!(!gateways.is_empty(), "no gateway runs with {profiles}");
        let mut names = BTreeSet::new();
        for gateway in &gateways {
            let (name, service) = (gateway.name, gateway.service);
            // Two replicas with books of their own would overcommit the Tritons.
            let Some(cluster) = &gateway.config.cluster else {
                assert_eq!(
                    gateways.len(),
                    1,
                    "{profiles}: {name} has no [cluster]: it keeps placement books of its own"
                );
                continue;
            };
            // The same registry (endpoints and prefix) over the same Tritons as the first.
            assert_eq!(
                gateway.pool(),
                gateways[0].pool(),
                "{profiles}: {name} and {} are not one pool",
                gateways[0].name
            );
            for url in &cluster.etcd {
                let (host, port) = host_port(url);
                let (etcd_name, etcd) = services
                    .iter()
                    .find(|(n, _)| *n == host)
                    .unwrap_or_else(|| panic!("{profiles}: {name}'s etcd {host} does not run"));
                assert_etcd_serves(&etcd["command"], port, etcd_name);
                let advertised = flag(&etcd["command"], "advertise-client-urls");
                assert!(
                    advertised.split(',').any(|u| u == url),
                    "{etcd_name} advertises {advertised}, not {url}"
                );
                assert!(
                    service["depends_on"][etcd_name].is_object(),
                    "{profiles}: {name} does not start {etcd_name}: {}",
                    service["depends_on"]
                );
            }
            // The replica's name in the registry: its own key, else its host name (a
            // container without `hostname:` is named by its id, new on every recreate).
            let replica = if names_its_replica(&gateway.toml) {
                cluster.replica.clone()
            } else {
                service["hostname"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{name} has no hostname"))
                    .to_string()
            };
            assert!(
                names.insert(replica.clone()),
                "{profiles}: two replicas named {replica}"
            );
            // docker stop waits for the shutdown delay and the drain, then kills.
            let grace = HumanDuration::parse(service["stop_grace_period"].as_str().unwrap())
                .unwrap()
                .0;
            let server = &gateway.config.server;
            assert!(
                server.shutdown_delay.0 + server.drain_timeout.0 < grace,
                "{name}: shutdown_delay {} + drain_timeout {} >= stop_grace_period {grace:?}",
                server.shutdown_delay,
                server.drain_timeout
            );
        }
    }
}

#[test]
fn the_image_exposes_serves_and_checks_what_its_config_says() {
    let dockerfile = std::fs::read_to_string(kit("Dockerfile")).unwrap();
    let runtime = dockerfile.rsplit("\nFROM ").next().unwrap();
    let exposed: BTreeSet<u16> = runtime
        .lines()
        .filter_map(|l| l.strip_prefix("EXPOSE "))
        .flat_map(|l| l.split_whitespace().map(|p| p.parse::<u16>().unwrap()))
        .collect();
    let config = image_config();
    assert!(
        config.listen.grpc.is_some(),
        "the image's config serves gRPC"
    );
    assert!(config.backends.iter().all(|b| b.grpc.is_some()));
    assert_eq!(
        exposed,
        ports_of(&config),
        "EXPOSE against docker/gateway.toml"
    );
    let health = runtime
        .lines()
        .find(|l| l.contains("INFERGATE_HEALTH_URL=http"))
        .expect("a health URL");
    assert!(
        health.contains(&format!(":{}/v2/health/live", config.listen.http.port())),
        "{health}"
    );
    assert!(runtime.contains("HEALTHCHECK "), "no HEALTHCHECK");
    let user = runtime
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER");
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("numeric uid");
    assert_ne!(uid, 0, "runs as root");
    // The baked config is the one the image runs, and a lone `docker run` needs no etcd.
    assert!(
        runtime.contains("\nCOPY docker/gateway.toml /etc/infergate/gateway.toml\n")
            && runtime.contains("INFERGATE_CONFIG=/etc/infergate/gateway.toml "),
        "the image runs another config than docker/gateway.toml"
    );
    assert!(
        config.cluster.is_none(),
        "docker/gateway.toml has [cluster]: a lone `docker run` would need an etcd"
    );
}

#[test]
fn kubernetes_manifests_validate_and_agree_with_the_gateway_config() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(kit("k8s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let output = run(Command::new(venv_tool("kubernetes-validate"))
        .arg("--strict")
        .args(&files));
    let report = assert_ok(&output, "kubernetes-validate --strict");
    let report = format!("{report}{}", String::from_utf8_lossy(&output.stderr));
    let warnings: Vec<&str> = report.lines().filter(|l| l.starts_with("WARN")).collect();
    // A CRD has no schema in kubernetes-validate: only the ServiceMonitor may go unchecked.
    assert_eq!(warnings.len(), 1, "{report}");
    assert!(warnings[0].contains("kind ServiceMonitor"), "{report}");
    let passed = report.lines().filter(|l| l.contains(" passed ")).count();
    for resource in ["service/etcd", "statefulset/etcd"] {
        assert!(
            report.contains(&format!("etcd.yaml passed for resource {resource} ")),
            "{report}"
        );
    }

    let documents = yaml(&files.iter().map(|p| p.as_path()).collect::<Vec<_>>(), None);
    assert_eq!(passed, documents.len() - 1, "{report}");
    let find = |kind: &str, name: &str| -> &Value {
        documents
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    let text = find("ConfigMap", "infergate-config")["data"]["gateway.toml"]
        .as_str()
        .unwrap();
    let config = Config::parse(text).unwrap_or_else(|e| panic!("ConfigMap gateway.toml: {e}"));

    let deployment = find("Deployment", "infergate");
    assert!(deployment["spec"]["replicas"].as_u64().unwrap() >= 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_shares_the_etcd_statefulset(text, &config, pod, &find);
    let container = &pod["containers"][0];
    let port = |name: &str| -> u16 {
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["containerPort"]
            .as_u64()
            .unwrap() as u16
    };
    let ports: BTreeSet<u16> = ["http", "grpc", "metrics", "admin"]
        .iter()
        .map(|n| port(n))
        .collect();
    assert_eq!(ports, ports_of(&config));
    assert_eq!(port("http"), config.listen.http.port());
    for (probe, path) in [
        ("readinessProbe", "/v2/health/ready"),
        ("livenessProbe", "/v2/health/live"),
    ] {
        assert_eq!(container[probe]["httpGet"]["path"], path);
        assert_eq!(container[probe]["httpGet"]["port"], "http");
    }
    // SIGTERM comes after preStop (if any); the shutdown delay and the drain must end
    // before the grace period does, or the pod is killed with requests in flight.
    let pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        .as_u64()
        .unwrap_or(0);
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    let delay = config.server.shutdown_delay.0.as_secs_f64();
    let drain = config.server.drain_timeout.0.as_secs_f64();
    assert!(
        pre_stop as f64 + delay + drain < grace as f64,
        "preStop {pre_stop}s + shutdown_delay {delay}s + drain {drain}s >= grace {grace}s"
    );
    // The kubelet's readiness probe sees the not-ready replica before its listeners close.
    let ready = &container["readinessProbe"];
    let probe_time =
        ready["periodSeconds"].as_u64().unwrap() * ready["failureThreshold"].as_u64().unwrap();
    assert!(
        delay >= probe_time as f64,
        "shutdown_delay {delay}s < readiness probe {probe_time}s"
    );
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert!(container["resources"]["requests"]["memory"].is_string());

    let service = find("Service", "infergate");
    let names: BTreeSet<&str> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, BTreeSet::from(["http", "grpc", "metrics"]));
    let monitor = find("ServiceMonitor", "infergate");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    assert!(config.telemetry.merge_backend_metrics);
    let budget = find("PodDisruptionBudget", "infergate");
    assert_eq!(
        budget["spec"]["selector"], deployment["spec"]["selector"],
        "the budget covers the gateway pods"
    );

    // The autoscaler scales the StatefulSet whose headless Service the gateway's DNS group
    // names, so every replica it adds is found, at the ports the Service publishes.
    let hpa = find("HorizontalPodAutoscaler", "triton");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "StatefulSet");
    let pool = find("StatefulSet", "triton");
    let headless = find("Service", pool["spec"]["serviceName"].as_str().unwrap());
    assert_eq!(headless["spec"]["clusterIP"], "None", "a headless Service");
    let group = config
        .dns_groups()
        .next()
        .expect("a dns group in the config");
    assert_eq!(group.dns.as_deref(), headless["metadata"]["name"].as_str());
    let port = |name: &str| {
        headless["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["port"].as_u64())
            .map(|p| p as u16)
    };
    assert_eq!(group.http_port, port("http"));
    assert_eq!(group.grpc_port, port("grpc"));
    assert_eq!(group.metrics_port, port("metrics"));
    let rules = std::fs::read_to_string(kit("prometheus/rules.yml")).unwrap();
    let adapter = find("ConfigMap", "prometheus-adapter-infergate")["data"]["config.yaml"]
        .as_str()
        .unwrap();
    for rule in yaml(&[], Some(adapter))[0]["externalRules"]
        .as_array()
        .unwrap()
    {
        let series = rule["seriesQuery"].as_str().unwrap();
        let recorded = series.split('"').nth(1).unwrap();
        assert!(
            rules.contains(&format!("record: {recorded}\n")),
            "{recorded} is not recorded"
        );
    }
}

/// The gateway pods' `[cluster]` reaches the etcd StatefulSet, and each pod registers
/// under a name of its own.
fn assert_shares_the_etcd_statefulset<'a>(
    text: &str,
    config: &Config,
    pod: &Value,
    find: &impl Fn(&str, &str) -> &'a Value,
) {
    let cluster = config
        .cluster
        .as_ref()
        .expect("the ConfigMap has no [cluster]: each replica keeps placement books of its own");
    // The name is the host name, which is the pod's own name unless the pod spec sets one.
    assert!(
        !names_its_replica(&text.parse().unwrap()),
        "every pod would register under the ConfigMap's cluster.replica"
    );
    assert!(
        pod["hostname"].is_null(),
        "every pod has the same host name"
    );
    for url in &cluster.etcd {
        let (host, port) = host_port(url);
        // `pod.service` (a StatefulSet member), or the Service alone.
        let (member, service_name) = host.split_once('.').unwrap_or(("", host));
        let service = find("Service", service_name);
        let set = find("StatefulSet", "etcd");
        assert_eq!(set["spec"]["serviceName"], service_name, "{url}");
        let labels = &set["spec"]["template"]["metadata"]["labels"];
        for (key, value) in service["spec"]["selector"].as_object().unwrap() {
            assert_eq!(&labels[key], value, "{service_name} selects no etcd pod");
        }
        if !member.is_empty() {
            let index: u64 = member
                .strip_prefix("etcd-")
                .and_then(|i| i.parse().ok())
                .unwrap_or_else(|| panic!("{url}: {member} is no member of StatefulSet etcd"));
            assert!(
                index < set["spec"]["replicas"].as_u64().unwrap(),
                "{url}: StatefulSet etcd has no member {member}"
            );
        }
        let service_port = service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["port"] == port)
            .unwrap_or_else(|| panic!("{url}: Service {service_name} has no port {port}"));
        // The Service port leads to the container port (by name or number) etcd listens on.
        let container = &set["spec"]["template"]["spec"]["containers"][0];
        let target = service_port
            .get("targetPort")
            .unwrap_or(&service_port["port"]);
        let container_port = container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == *target || p["containerPort"] == *target)
            .unwrap_or_else(|| panic!("{url}: the etcd container has no port {target}"));
        let container_port = container_port["containerPort"].as_u64().unwrap() as u16;
        assert_etcd_serves(
            &container["command"],
            container_port,
            "the etcd StatefulSet",
        );
        if !member.is_empty() {
            let advertised = flag(&container["command"], "advertise-client-urls");
            assert_eq!(advertised.replace("$(POD_NAME)", member), *url);
        }
    }
}

#[test]
fn promtool_accepts_the_config_and_rules_and_every_alert_passes_its_tests() {
    let prometheus = kit("prometheus");
    for args in [
        vec!["check", "config", "prometheus.yml"],
        vec!["check", "rules", "rules.yml"],
        vec!["test", "rules", "rules_test.yml"],
    ] {
        let output = run(Command::new("promtool")
            .args(&args)
            .current_dir(&prometheus));
        assert_ok(&output, &format!("promtool {}", args.join(" ")));
    }
    let rules = yaml(&[&prometheus.join("rules.yml")], None);
    let alerts: Vec<&Value> = rules[0]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter(|r| r["alert"].is_string())
        .collect();
    assert!(alerts.len() >= 9);
    let tests = yaml(&[&prometheus.join("rules_test.yml")], None);
    let docs = std::fs::read_to_string(support::repo_root().join("docs/deploy.md")).unwrap();
    for alert in alerts {
        let name = alert["alert"].as_str().unwrap();
        assert!(
            alert["annotations"]["runbook"]
                .as_str()
                .is_some_and(|r| r.len() > 40),
            "{name} has no runbook line"
        );
        let cases: Vec<&Value> = tests[0]["tests"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
            .filter(|c| c["alertname"] == name)
            .collect();
        assert!(
            cases
                .iter()
                .any(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty())),
            "no test where {name} fires"
        );
        assert!(
            docs.contains(&format!("`{name}`")),
            "docs/deploy.md does not explain {name}"
        );
    }
}

#[test]
fn the_dashboard_matches_grafanas_schema_and_its_provisioning() {
    let dashboard = kit("grafana/dashboards/infergate.json");
    let output = run(Command::new(support::venv_python())
        .arg(support::repo_root().join("tests/python/check_dashboard.py"))
        .arg(&dashboard));
    assert_ok(&output, "check_dashboard.py (grafana-foundation-sdk)");

    let json: Value = serde_json::from_slice(&std::fs::read(&dashboard).unwrap()).unwrap();
    let sources = yaml(
        &[&kit("grafana/provisioning/datasources/prometheus.yml")],
        None,
    );
    let uid = &sources[0]["datasources"][0]["uid"];
    for panel in json["panels"].as_array().unwrap() {
        if panel["type"] != "row" {
            assert_eq!(&panel["datasource"]["uid"], uid, "{}", panel["title"]);
        }
    }
    let variables: Vec<&str> = json["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variables, ["backend", "model"]);
    let providers = yaml(
        &[&kit("grafana/provisioning/dashboards/infergate.yml")],
        None,
    );
    let path = providers[0]["providers"][0]["options"]["path"]
        .as_str()
        .unwrap();
    let compose = std::fs::read_to_string(kit("compose.yaml")).unwrap();
    assert!(
        compose.contains(&format!("./grafana/dashboards:{path}:ro")),
        "the provider reads {path}, which compose does not mount"
    );
}

/// The scale-to-zero example: KEDA's ScaledObject drives the Triton StatefulSet that
/// triton.yaml defines, may take it to zero, and wakes it on metrics the gateway exports
/// (docs/metrics.md), the held requests first among them.
#[test]
fn the_keda_scale_to_zero_example_targets_the_pool_and_reads_the_gateways_metrics() {
    let file = kit("k8s/scale-to-zero/triton-scaledobject.yaml");
    let output = run(Command::new(venv_tool("kubernetes-validate"))
        .arg("--strict")
        .arg(&file));
    let report = assert_ok(&output, "kubernetes-validate --strict");
    let report = format!("{report}{}", String::from_utf8_lossy(&output.stderr));
    // A CRD has no schema in kubernetes-validate: it can only say it did not check it.
    assert!(report.contains("kind ScaledObject"), "{report}");

    let scaled = &yaml(&[&file], None)[0];
    assert_eq!(scaled["apiVersion"], "keda.sh/v1alpha1");
    let target = &scaled["spec"]["scaleTargetRef"];
    let pool = yaml(&[&kit("k8s/triton.yaml")], None);
    assert!(
        pool.iter()
            .any(|d| d["kind"] == target["kind"] && d["metadata"]["name"] == target["name"]),
        "{target} is not in triton.yaml"
    );
    assert_eq!(scaled["spec"]["minReplicaCount"], 0);
    let metrics = std::fs::read_to_string(support::repo_root().join("docs/metrics.md")).unwrap();
    let triggers = scaled["spec"]["triggers"].as_array().unwrap();
    assert!(
        triggers[0]["metadata"]["query"]
            .as_str()
            .unwrap()
            .contains("infergate_requests_waiting")
    );
    for trigger in triggers {
        let query = trigger["metadata"]["query"].as_str().unwrap();
        let metric = query
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .find(|word| word.starts_with("infergate_"))
            .unwrap_or_else(|| panic!("{query} names no gateway metric"));
        assert!(
            metrics.contains(&format!("| `{metric}` |")),
            "{metric} is not in docs/metrics.md"
        );
    }
}
