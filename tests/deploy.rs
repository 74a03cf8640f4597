//! The files that deploy waitroom (Containerfile, deploy/kubernetes/, deploy/systemd/), checked
//! with the tools their ecosystems use and against the configuration they carry: a probe on the
//! wrong port, a grace period shorter than `shutdown.grace` or a PrometheusRule that drifted from
//! dashboards/alerts.yaml fail here rather than in a shop's cluster.
//!
//! hadolint and kubernetes-validate come from the pinned venv of `ensure_api_tools`
//! (docs/requirements-api.txt); kubernetes-validate ships the API schemas, so no cluster and no
//! network is needed. `systemd-analyze` and `promtool` come from the system. The ConfigMap's
//! configuration also runs, against a real Redis, and is updated the way the kubelet updates it.

mod common;

use common::api_tool;
use serde_yaml::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

fn yaml(text: &str, what: &str) -> Value {
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{what} is not YAML: {e}"))
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn run(command: &Path, args: &[&str]) -> Output {
    Command::new(command)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", command.display()))
}

/// The manifests `kubectl apply -f deploy/kubernetes/` applies, and the example Secret.
fn manifests() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(repo("deploy/kubernetes"))
        .expect("deploy/kubernetes")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".yaml.example"))
        .map(|n| format!("deploy/kubernetes/{n}"))
        .collect();
    files.sort();
    assert!(files.len() >= 7, "deploy/kubernetes holds too few manifests: {files:?}");
    files
}

fn manifest(name: &str) -> Value {
    yaml(&read(&format!("deploy/kubernetes/{name}")), name)
}

/// The pod template's container called `name`.
fn container(name: &str) -> Value {
    let deployment = manifest("deployment.yaml");
    deployment["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("deployment.yaml has no container {name}"))
        .clone()
}

/// The proxy.yaml the ConfigMap mounts into the waitroom container.
fn configmap_config() -> (String, Value) {
    let text = manifest("configmap.yaml")["data"]["proxy.yaml"]
        .as_str()
        .expect("configmap.yaml: data.proxy.yaml")
        .to_owned();
    let value = yaml(&text, "the ConfigMap's proxy.yaml");
    (text, value)
}

fn port_of(addr: &Value, what: &str) -> u64 {
    addr.as_str()
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("{what}: {addr:?} is not host:port"))
}

fn seconds(text: &str) -> u64 {
    humantime::parse_duration(text)
        .unwrap_or_else(|e| panic!("{text:?} is not a duration: {e}"))
        .as_secs()
}

/// `waitroom --config FILE --check` passes for `text`, with the secrets it names set; and
/// `--check --no-env` passes with no environment at all, as the ConfigMap's header tells an
/// operator to check a change on a machine that holds none of the Secret's values.
fn assert_config_checks(text: &str, what: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("proxy.yaml");
    std::fs::write(&file, text).expect("write config");
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["--config", file.to_str().unwrap(), "--check"])
        .env("WAITROOM_ADMIN_TOKEN", "a-test-admin-token")
        .env("WAITROOM_JWT_SECRET", "a-test-jwt-secret")
        .output()
        .expect("run waitroom --check");
    assert!(out.status.success(), "{what}: waitroom --check:\n{}", said(&out));
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["--config", file.to_str().unwrap(), "--check", "--no-env"])
        .env_clear()
        .output()
        .expect("run waitroom --check --no-env");
    assert!(out.status.success(), "{what}: waitroom --check --no-env:\n{}", said(&out));
}

// ---- the image ------------------------------------------------------------------------------------

#[test]
fn the_containerfile_passes_hadolint() {
    let out = run(&api_tool("hadolint"), &[repo("Containerfile").to_str().unwrap()]);
    assert!(
        out.status.success() && said(&out).trim().is_empty(),
        "hadolint Containerfile ({}):\n{}",
        out.status,
        said(&out)
    );
}

/// The image runs the binary on the configuration it copies in, as a numeric non-root user, and
/// exposes the ports that configuration listens on.
#[test]
fn the_image_exposes_its_configurations_ports_as_a_non_root_user() {
    let recipe = read("Containerfile");
    let line = |word: &str| {
        recipe
            .lines()
            .rev()
            .find(|l| l.starts_with(word))
            .unwrap_or_else(|| panic!("Containerfile has no {word} line"))
            .to_owned()
    };
    let config = yaml(&read("deploy/container/proxy.yaml"), "deploy/container/proxy.yaml");
    let exposed: Vec<u64> = line("EXPOSE ")
        .split_whitespace()
        .skip(1)
        .map(|p| p.parse().expect("EXPOSE port"))
        .collect();
    for key in ["listen", "metrics_listen"] {
        let port = port_of(&config[key], key);
        assert!(exposed.contains(&port), "EXPOSE {exposed:?} lacks {key}'s port {port}");
    }
    assert_eq!(line("USER "), "USER 65532:65532", "a numeric non-root user");
    assert!(
        recipe.contains("COPY deploy/container/proxy.yaml /etc/waitroom/proxy.yaml")
            && line("CMD ").contains("\"/etc/waitroom/proxy.yaml\""),
        "the image runs on the configuration it copies in"
    );
    assert_eq!(
        read(".containerignore"),
        read(".dockerignore"),
        "podman reads .containerignore, docker .dockerignore: keep them one list"
    );
    assert_config_checks(&read("deploy/container/proxy.yaml"), "deploy/container/proxy.yaml");
}

// ---- Kubernetes -----------------------------------------------------------------------------------

/// Every manifest against the schemas of the newest Kubernetes kubernetes-validate knows and of
/// 1.30, the oldest with the preStop `sleep` action. The Prometheus Operator's kinds have no
/// schema there; they are checked by the tests below instead.
#[test]
fn every_manifest_matches_the_kubernetes_schemas() {
    let validate = api_tool("kubernetes-validate");
    for file in manifests() {
        let operator_kind = manifest(file.trim_start_matches("deploy/kubernetes/"))["apiVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("monitoring.coreos.com/"));
        for version in ["1.37.0", "1.30.0"] {
            let out = run(&validate, &["--strict", "-k", version, repo(&file).to_str().unwrap()]);
            let text = said(&out);
            let passed = if operator_kind {
                text.contains("Couldn't find schema for kind")
            } else {
                text.contains(" passed for resource ")
            };
            assert!(
                out.status.success() && passed && !text.contains("ERROR"),
                "kubernetes-validate --strict -k {version} {file} ({}):\n{text}",
                out.status
            );
        }
    }
}

/// The probes, ports and mounts agree with the proxy.yaml they run: liveness on /healthz and
/// readiness on /readyz at `metrics_listen`'s port (8079, as in the shipped proxy.yaml), the
/// Service at `listen`'s port, the order API at `upstream`'s, the config folder mounted whole.
#[test]
fn probes_and_ports_are_the_configurations() {
    let (text, config) = configmap_config();
    let shipped = yaml(&read("proxy.yaml"), "proxy.yaml");
    let metrics = port_of(&config["metrics_listen"], "metrics_listen");
    assert_eq!(metrics, port_of(&shipped["metrics_listen"], "proxy.yaml metrics_listen"));
    assert!(
        config["metrics_listen"].as_str().unwrap().starts_with("0.0.0.0:"),
        "the kubelet probes the pod's address, not its loopback"
    );
    let listen = port_of(&config["listen"], "listen");
    assert_eq!(listen, port_of(&shipped["listen"], "proxy.yaml listen"));

    let waitroom = container("waitroom");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &waitroom[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}'s path");
        assert_eq!(get["port"].as_u64(), Some(metrics), "{probe}'s port is metrics_listen's");
    }
    let port = |c: &Value, name: &str| {
        c["ports"]
            .as_sequence()
            .expect("ports")
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no port {name}"))
    };
    assert_eq!(port(&waitroom, "http"), listen);
    assert_eq!(port(&waitroom, "metrics"), metrics);
    assert_eq!(
        port(&container("order-api"), "order-api"),
        port_of(&config["upstream"], "upstream"),
        "the order API container listens where upstream points"
    );
    assert!(config["upstream"].as_str().unwrap().starts_with("127.0.0.1:"));

    let service = manifest("service.yaml");
    let targets: Vec<u64> = service["spec"]["ports"]
        .as_sequence()
        .expect("service ports")
        .iter()
        .map(|p| p["targetPort"].as_u64().expect("numeric targetPort"))
        .collect();
    assert_eq!(targets, vec![listen], "the Service reaches waitroom's listen port only");

    let monitor = manifest("podmonitor.yaml");
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["port"].as_str(), Some("metrics"));
    assert_eq!(endpoint["path"].as_str(), Some("/metrics"));

    // Every selector picks the pod template's labels.
    let labels = &manifest("deployment.yaml")["spec"]["template"]["metadata"]["labels"];
    for (file, selector) in [
        ("deployment.yaml", &manifest("deployment.yaml")["spec"]["selector"]["matchLabels"]),
        ("service.yaml", &service["spec"]["selector"]),
        ("poddisruptionbudget.yaml", &manifest("poddisruptionbudget.yaml")["spec"]["selector"]["matchLabels"]),
        ("podmonitor.yaml", &monitor["spec"]["selector"]["matchLabels"]),
    ] {
        let selector = selector.as_mapping().unwrap_or_else(|| panic!("{file}: no selector"));
        for (k, v) in selector {
            assert_eq!(&labels[k], v, "{file} selects {k:?} the pod does not carry");
        }
    }

    // The ConfigMap reaches the proxy: the folder mounted whole, watched.
    assert_eq!(config["reload"]["watch"].as_bool(), Some(true), "reload.watch");
    let mounts = waitroom["volumeMounts"].as_sequence().expect("volumeMounts");
    assert!(
        mounts.iter().all(|m| m.get("subPath").is_none()),
        "a subPath mount never sees a ConfigMap update"
    );
    assert!(mounts.iter().any(|m| m["mountPath"] == "/etc/waitroom"));
    assert_eq!(waitroom["args"][1].as_str(), Some("/etc/waitroom/proxy.yaml"));
    assert_config_checks(&text, "the ConfigMap's proxy.yaml");
}

/// The ConfigMap enables the admin API, so it keeps it off 8079, the port the kubelet's probes
/// and Prometheus reach on the pod's address: `admin.listen` is on the pod's loopback, where
/// only `kubectl exec` and `kubectl port-forward` reach it, and no port of the pod or the
/// Service names it.
#[test]
fn the_admin_api_listens_on_the_pods_loopback_only() {
    let (_, config) = configmap_config();
    assert!(
        config["admin"]["token_env"].as_str().is_some(),
        "the ConfigMap enables the admin API (else this test has nothing to hold)"
    );
    let admin = config["admin"]["listen"]
        .as_str()
        .expect("the ConfigMap enables the admin API, so it sets admin.listen");
    let addr: std::net::SocketAddr = admin.parse().unwrap_or_else(|e| panic!("admin.listen {admin:?}: {e}"));
    assert!(addr.ip().is_loopback(), "admin.listen {admin} is not on the pod's loopback");
    let port = u64::from(addr.port());
    assert_ne!(port, port_of(&config["metrics_listen"], "metrics_listen"));
    assert_ne!(port, port_of(&config["listen"], "listen"));

    let declared: Vec<u64> = ["waitroom", "order-api"]
        .into_iter()
        .flat_map(|name| container(name)["ports"].as_sequence().expect("ports").clone())
        .filter_map(|p| p["containerPort"].as_u64())
        .collect();
    assert!(!declared.contains(&port), "the pod declares the admin port {port}: {declared:?}");
    let service = manifest("service.yaml");
    for p in service["spec"]["ports"].as_sequence().expect("service ports") {
        assert_ne!(p["targetPort"].as_u64(), Some(port), "the Service reaches the admin API");
    }
    // The PodMonitor scrapes the port named `metrics`, 8079 (probes_and_ports_are_the_configurations).

    // The image's own configuration has no admin API to expose.
    let baked = yaml(&read("deploy/container/proxy.yaml"), "deploy/container/proxy.yaml");
    assert!(
        baked["admin"]["token_env"].is_null(),
        "deploy/container/proxy.yaml enables the admin API: give it admin.listen on loopback, and test that here"
    );
}

/// A stopping pod gets longer than the proxy's preStop sleep and `shutdown.grace` together, and
/// the order API keeps serving until the proxy is done.
#[test]
fn the_pod_outlives_the_proxys_grace() {
    let (_, config) = configmap_config();
    let grace = seconds(config["shutdown"]["grace"].as_str().expect("shutdown.grace"));
    let pod = &manifest("deployment.yaml")["spec"]["template"]["spec"];
    let termination = pod["terminationGracePeriodSeconds"].as_u64().expect("terminationGracePeriodSeconds");
    let sleep = |c: &Value| c["lifecycle"]["preStop"]["sleep"]["seconds"].as_u64().unwrap_or(0);
    let proxy_done = sleep(&container("waitroom")) + grace;
    assert!(
        termination > proxy_done,
        "terminationGracePeriodSeconds {termination} <= preStop sleep + shutdown.grace ({proxy_done})"
    );
    assert!(
        sleep(&container("order-api")) >= proxy_done,
        "the order API stops before the proxy has finished its orders"
    );

    // The secrets the configuration names come from the Secret, under keys the example has.
    let secret = manifest("secret.yaml.example");
    let env = container("waitroom")["env"].as_sequence().expect("env").clone();
    for name in [
        config["admin"]["token_env"].as_str().expect("admin.token_env"),
        config["identity"]["jwt"]["secret_env"].as_str().expect("identity.jwt.secret_env"),
    ] {
        let var = env
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("the waitroom container does not set {name}"));
        let from = &var["valueFrom"]["secretKeyRef"];
        assert_eq!(from["name"], secret["metadata"]["name"], "{name}'s Secret");
        assert!(
            secret["stringData"].get(from["key"].as_str().unwrap()).is_some(),
            "{name}: key {:?} is not in secret.yaml.example",
            from["key"]
        );
    }
}

/// The PrometheusRule is dashboards/alerts.yaml as scripts/prometheusrule.sh writes it, and its
/// rules pass `promtool check rules`.
#[test]
fn the_prometheusrule_is_the_alerts_file() {
    let out = Command::new("bash")
        .args([repo("scripts/prometheusrule.sh").to_str().unwrap(), "--stdout"])
        .output()
        .expect("run scripts/prometheusrule.sh");
    assert!(out.status.success(), "scripts/prometheusrule.sh:\n{}", said(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout) == read("deploy/kubernetes/prometheusrule.yaml"),
        "deploy/kubernetes/prometheusrule.yaml is not what scripts/prometheusrule.sh writes from \
         dashboards/alerts.yaml: run the script"
    );
    let rule = manifest("prometheusrule.yaml");
    assert_eq!(
        rule["spec"],
        yaml(&read("dashboards/alerts.yaml"), "dashboards/alerts.yaml"),
        "the PrometheusRule's spec means what dashboards/alerts.yaml means"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, serde_yaml::to_string(&rule["spec"]).unwrap()).unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules", rules.to_str().unwrap()])
        .output()
        .unwrap_or_else(|e| panic!("cannot run promtool ({e}): apt-get install -y prometheus"));
    assert!(out.status.success(), "promtool check rules on the PrometheusRule's spec:\n{}", said(&out));

    // The thresholds are set in one place, and the alerts the issue asks for are there.
    let text = read("dashboards/alerts.yaml");
    for wanted in ["alert: WaitroomProxyDown", "alert: WaitroomOrderApiFailing", "record: waitroom:alert_threshold:"] {
        assert!(text.contains(wanted), "dashboards/alerts.yaml lacks {wanted:?}");
    }
}

// ---- systemd --------------------------------------------------------------------------------------

/// `systemd-analyze verify` finds nothing to say about the unit (it exits 0 even for an unknown
/// key, so any line about the file fails), with the binary path pointed at the built binary.
#[test]
fn the_systemd_unit_verifies() {
    let unit = read("deploy/systemd/waitroom.service");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("waitroom.service");
    std::fs::write(&file, unit.replace("/usr/local/bin/waitroom", env!("CARGO_BIN_EXE_waitroom"))).unwrap();
    let out = run(Path::new("systemd-analyze"), &["verify", file.to_str().unwrap()]);
    let text = said(&out);
    let about_it: Vec<&str> = text.lines().filter(|l| l.contains("waitroom")).collect();
    assert!(
        out.status.success() && about_it.is_empty(),
        "systemd-analyze verify deploy/systemd/waitroom.service ({}):\n{text}",
        out.status
    );

    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("the unit has no {key}="))
            .to_owned()
    };
    assert!(value("ExecReload").contains("-HUP $MAINPID"), "reload is SIGHUP");
    assert_eq!(value("KillSignal"), "SIGTERM", "SIGTERM is the graceful stop");
    let grace = seconds(yaml(&read("proxy.yaml"), "proxy.yaml")["shutdown"]["grace"].as_str().unwrap());
    let stop = seconds(&value("TimeoutStopSec"));
    assert!(stop > grace, "TimeoutStopSec {stop}s is not above shutdown.grace {grace}s");
}

// ---- the version ----------------------------------------------------------------------------------

/// `waitroom --version` prints Cargo.toml's version, which CHANGELOG.md has a section for.
#[test]
fn the_version_is_printed_and_in_the_changelog() {
    let out = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .arg("--version")
        .output()
        .expect("run waitroom --version");
    let version = env!("CARGO_PKG_VERSION");
    assert!(out.status.success(), "waitroom --version:\n{}", said(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("waitroom {version}"));
    assert!(
        read("CHANGELOG.md").contains(&format!("## [{version}]")),
        "CHANGELOG.md has no section for {version}"
    );
}

// ---- the ConfigMap, live -----------------------------------------------------------------------

/// Lays `config` out in `dir` as the kubelet lays out a mounted ConfigMap: the file in a hidden
/// timestamped folder, `..data` a symlink to that folder, `proxy.yaml` a symlink through `..data`.
/// A later call swaps `..data` in one rename, as the kubelet's update does.
fn write_like_the_kubelet(dir: &Path, generation: u32, config: &str) {
    let folder = format!("..2026_12_06_00_00_0{generation}");
    std::fs::create_dir(dir.join(&folder)).expect("timestamped folder");
    std::fs::write(dir.join(&folder).join("proxy.yaml"), config).expect("write config");
    std::os::unix::fs::symlink(&folder, dir.join("..data_tmp")).expect("..data_tmp");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
    if !dir.join("proxy.yaml").exists() {
        std::os::unix::fs::symlink("..data/proxy.yaml", dir.join("proxy.yaml")).expect("proxy.yaml");
    }
}

/// The ConfigMap's proxy.yaml runs (its addresses made local), its probes answer where the pod
/// says, and a new version swapped in the kubelet's way is reloaded without a signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configmap_runs_and_reloads_on_the_kubelets_swap() {
    let redis = common::RedisServer::start();
    let [listen, metrics, admin] = common::free_ports::<3>();
    let (text, config) = configmap_config();
    let admin_listen = config["admin"]["listen"].as_str().expect("admin.listen").to_owned();
    let local = text
        .replace("0.0.0.0:8080", &format!("127.0.0.1:{listen}"))
        .replace("0.0.0.0:8079", &format!("127.0.0.1:{metrics}"))
        .replace(&admin_listen, &format!("127.0.0.1:{admin}"))
        .replace("redis://redis.shop.svc.cluster.local:6379", &redis.url());
    assert!(local.contains(&redis.url()), "the ConfigMap's Redis address is the one this test replaces");
    assert!(
        local.contains(&format!("127.0.0.1:{admin}")),
        "the ConfigMap's admin.listen is the one this test replaces"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    write_like_the_kubelet(dir.path(), 1, &local);

    let log = std::fs::File::create(dir.path().join("waitroom.log")).expect("log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_waitroom"))
        .args(["--config", dir.path().join("proxy.yaml").to_str().unwrap()])
        .env("WAITROOM_ADMIN_TOKEN", "a-test-admin-token")
        .env("WAITROOM_JWT_SECRET", "a-test-jwt-secret")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start waitroom");
    let logs = || std::fs::read_to_string(dir.path().join("waitroom.log")).unwrap_or_default();
    let client = common::http_client();
    let get = |path: &str| {
        let req = client.get(format!("http://127.0.0.1:{metrics}{path}"));
        async move { common::try_send(req).await.ok() }
    };
    let ready = common::wait_until(Duration::from_secs(20), Duration::from_millis(50), || async {
        get("/readyz").await.is_some_and(|r| r.status == 200)
    })
    .await;
    let healthy = get("/healthz").await.is_some_and(|r| r.status == 200);
    // The admin API answers on admin.listen only; on the probes' port, /admin is not there.
    let admin_status = |port: u16| {
        let req = client
            .get(format!("http://127.0.0.1:{port}/admin/room"))
            .header("authorization", "Bearer a-test-admin-token");
        async move { common::try_send(req).await.ok().map(|r| r.status) }
    };
    let on_metrics = admin_status(metrics).await;
    let on_admin = admin_status(admin).await;
    let reloads_ok = |body: &str| body.lines().any(|l| l.starts_with("waitroom_config_reloads_total{result=\"ok\"} 1"));

    let mut reloaded = false;
    if ready && healthy {
        write_like_the_kubelet(dir.path(), 2, &local.replace("batch_size: 10", "batch_size: 20"));
        reloaded = common::wait_until(Duration::from_secs(10), Duration::from_millis(100), || async {
            get("/metrics").await.is_some_and(|r| reloads_ok(&r.body))
        })
        .await;
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(ready && healthy, "/readyz {ready}, /healthz {healthy}:\n{}", logs());
    assert_eq!(on_metrics, Some(404), "/admin/room on metrics_listen:\n{}", logs());
    assert_eq!(on_admin, Some(200), "/admin/room on admin.listen:\n{}", logs());
    assert!(reloaded, "no reload after the ..data swap:\n{}", logs());
}
