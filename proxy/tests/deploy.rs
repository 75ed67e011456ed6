//! The deployment files (no container engine or cluster runs here): they
//! parse, they hold what the docs promise (probes, drain budget, non-root,
//! the Unix socket volume, the health check), the systemd unit passes
//! `systemd-analyze verify` when that is installed, and the flags and
//! variables they use are ones the binary accepts. `deploy/check.sh` goes
//! further (builds the image and runs its binary under chroot, validates
//! against schemas, renders the kustomize files); these tests are the part
//! that needs nothing but `cargo test`.
#![allow(clippy::unwrap_used, missing_docs)]

use std::path::PathBuf;
use std::process::Command;

use clap::Parser as _;
use yaml_rust2::{Yaml, YamlLoader};

fn deploy(file: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn yaml(file: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(&deploy(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn s<'a>(y: &'a Yaml, path: &[&str]) -> &'a Yaml {
    path.iter().fold(y, |y, k| &y[*k])
}

/// The flags a container passes, plus the SIDECACHE_* variables it sets,
/// are accepted by the binary's option parser (an unknown variable is
/// ignored by clap, so check names against the flags clap knows).
fn accepted(args: &[String], env: &[(String, String)]) {
    use clap::CommandFactory as _;
    let known: Vec<String> = sidecache::Options::command()
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_owned))
        .collect();
    for (k, _) in env {
        let flag = k
            .strip_prefix("SIDECACHE_")
            .unwrap_or_else(|| panic!("{k}: not a sidecache variable"))
            .to_ascii_lowercase()
            .replace('_', "-");
        assert!(known.contains(&flag), "{k} names no flag (--{flag})");
    }
    let mut argv = vec!["sidecache".to_owned()];
    argv.extend(args.iter().cloned());
    argv.extend(["--upstream".into(), "redis://127.0.0.1:6379".into()]);
    sidecache::Options::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
}

fn strings(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .map(|v| {
            v.iter()
                .filter_map(|a| a.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn kubernetes_sidecar_manifest() {
    let docs = yaml("kubernetes/sidecar.yaml");
    let dep = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("Deployment"))
        .expect("a Deployment");
    assert!(docs.iter().any(|d| d["kind"].as_str() == Some("Secret")));
    let spec = s(dep, &["spec", "template", "spec"]);
    let grace = spec["terminationGracePeriodSeconds"].as_i64().unwrap();
    let sc = spec["initContainers"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str() == Some("sidecache"))
        .expect("sidecache as a native sidecar");
    assert_eq!(sc["restartPolicy"].as_str(), Some("Always"));
    assert_eq!(
        s(sc, &["readinessProbe", "httpGet", "path"]).as_str(),
        Some("/readyz")
    );
    assert_eq!(
        s(sc, &["livenessProbe", "httpGet", "path"]).as_str(),
        Some("/healthz")
    );
    assert_eq!(
        s(sc, &["securityContext", "runAsNonRoot"]).as_bool(),
        Some(true)
    );
    assert!(!s(sc, &["resources", "limits", "memory"]).is_badvalue());
    assert!(!s(sc, &["resources", "requests", "memory"]).is_badvalue());
    let env: Vec<(String, String)> = sc["env"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["value"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    // The upstream (with its password) comes from the Secret.
    let up = sc["env"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|e| e["name"].as_str() == Some("SIDECACHE_UPSTREAM"))
        .unwrap();
    assert!(!s(up, &["valueFrom", "secretKeyRef", "name"]).is_badvalue());
    let shutdown: i64 = env
        .iter()
        .find(|e| e.0 == "SIDECACHE_SHUTDOWN_TIMEOUT")
        .unwrap()
        .1
        .parse()
        .unwrap();
    assert!(grace > shutdown, "the drain must fit in the grace period");
    accepted(&strings(&sc["args"]), &env);
    // The socket volume is shared with the app.
    let app = &spec["containers"][0];
    let mounts = |c: &Yaml| -> Vec<String> {
        c["volumeMounts"]
            .as_vec()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(mounts(app).iter().any(|m| mounts(sc).contains(m)));
}

#[test]
fn compose_file_runs_the_app_a_sidecar_and_a_cluster() {
    let doc = &yaml("compose.yaml")[0];
    let services = &doc["services"];
    for n in [
        "redis-1",
        "redis-2",
        "redis-3",
        "cluster-init",
        "app",
        "sidecache",
    ] {
        assert!(!services[n].is_badvalue(), "service {n}");
    }
    let node = strings(&services["redis-1"]["command"]);
    assert!(node
        .windows(2)
        .any(|w| w[0] == "--cluster-enabled" && w[1] == "yes"));
    let sc = &services["sidecache"];
    assert_eq!(sc["network_mode"].as_str(), Some("service:app"));
    let env: Vec<(String, String)> = sc["environment"]
        .as_hash()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().unwrap().to_owned(),
                v.as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    accepted(&strings(&sc["command"]), &env);
    assert!(env
        .iter()
        .any(|e| e.0 == "SIDECACHE_UPSTREAM" && e.1.contains("redis-1")));
    // Longer than the drain.
    assert_eq!(sc["stop_grace_period"].as_str(), Some("45s"));
    assert_eq!(
        s(sc, &["depends_on", "cluster-init", "condition"]).as_str(),
        Some("service_completed_successfully")
    );
}

#[test]
fn dockerfile_builds_the_documented_binary() {
    let d = deploy("Dockerfile");
    assert!(d.contains("cargo build --release -p sidecache --locked"));
    assert!(d.contains("target/release/sidecache"));
    assert!(d.contains("EXPOSE 6380"));
    assert!(d.contains("STOPSIGNAL SIGTERM"));
    assert!(d.contains("USER 10001:10001"), "non-root");
    let hc = d
        .lines()
        .skip_while(|l| !l.starts_with("HEALTHCHECK"))
        .take(2)
        .collect::<String>();
    assert!(hc.contains("/healthz") && hc.contains("9121"), "{hc}");
    // The default metrics address the health check relies on.
    assert_eq!(sidecache::config::DEFAULT_METRICS_LISTEN, "127.0.0.1:9121");
    assert!(d.contains(r#"ENTRYPOINT ["/usr/local/bin/sidecache"]"#));
}

#[test]
fn systemd_unit_verifies() {
    let unit = deploy("sidecache.service");
    for must in [
        "DynamicUser=yes",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "RuntimeDirectory=sidecache",
        "KillSignal=SIGTERM",
    ] {
        assert!(unit.contains(must), "{must}");
    }
    let stop: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(stop > 30, "TimeoutStopSec must exceed the 30 s drain");
    let Ok(out) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze not installed: unit not verified");
        return;
    };
    assert!(out.status.success());
    // Verify a copy whose ExecStart is this build's binary (the unit's path
    // does not exist here).
    let dir = std::env::temp_dir().join(format!("sidecache-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("sidecache.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/sidecache", env!("CARGO_BIN_EXE_sidecache")),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&copy)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Only complaints about this unit count (the host's own units may be
    // broken in a container).
    let ours: Vec<&str> = report
        .lines()
        .filter(|l| l.contains("sidecache.service"))
        .collect();
    assert!(out.status.success() || ours.is_empty(), "{report}");
    assert!(ours.is_empty(), "{report}");
}

/// The lines of a Dockerfile from its first `USER` on: the runtime image's
/// configuration.
fn runtime_config(file: &str) -> Vec<String> {
    deploy(file)
        .lines()
        .skip_while(|l| !l.starts_with("USER "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn both_dockerfiles_make_the_same_runtime_image() {
    let source = deploy("Dockerfile");
    let prebuilt = deploy("Dockerfile.prebuilt");
    let from_lines = |d: &str| -> Vec<String> {
        d.lines()
            .filter(|l| l.starts_with("FROM "))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(from_lines(&source).last().unwrap(), "FROM scratch");
    assert_eq!(from_lines(&prebuilt), ["FROM scratch"], "no base image");
    // The same root filesystem (deploy/rootfs.sh), the socket directory
    // given to the runtime user.
    assert!(source.contains("deploy/rootfs.sh target/release/sidecache /rootfs"));
    assert!(source.contains("COPY --from=builder /rootfs/ /\n"));
    assert!(source.contains("COPY --from=builder --chown=10001:10001 /rootfs/run/ /run/\n"));
    assert!(prebuilt.contains("COPY rootfs/ /\n"));
    assert!(prebuilt.contains("COPY --chown=10001:10001 rootfs/run/ /run/\n"));
    let (a, b) = (
        runtime_config("Dockerfile"),
        runtime_config("Dockerfile.prebuilt"),
    );
    assert!(a.len() > 5, "{a:?}");
    assert_eq!(a, b, "the runtime stages differ");
    // The health check runs a program the scratch image holds.
    assert!(a.iter().any(|l| l.contains(r#"CMD ["/bin/bash", "-c""#)));
    let cmd = a.iter().find_map(|l| l.strip_prefix("CMD ")).unwrap();
    let args: Vec<String> = cmd
        .trim_matches(|c| c == '[' || c == ']')
        .split(", ")
        .map(|s| s.trim_matches('"').to_owned())
        .collect();
    assert_eq!(args, ["--listen", "0.0.0.0:6380", "--protected-mode", "no"]);
    accepted(&args, &[]);
}

#[test]
fn kustomize_component_adds_the_manifests_sidecar() {
    let patch = &yaml("kubernetes/kustomize/sidecar/patch.yaml")[0];
    let manifest = yaml("kubernetes/sidecar.yaml");
    let dep = manifest
        .iter()
        .find(|d| d["kind"].as_str() == Some("Deployment"))
        .unwrap();
    let sidecar = |pod: &Yaml| -> Yaml {
        pod["initContainers"]
            .as_vec()
            .unwrap()
            .iter()
            .find(|c| c["name"].as_str() == Some("sidecache"))
            .cloned()
            .expect("the sidecache init container")
    };
    let (p, m) = (
        s(patch, &["spec", "template", "spec"]),
        s(dep, &["spec", "template", "spec"]),
    );
    assert_eq!(
        sidecar(p),
        sidecar(m),
        "patch.yaml's sidecar drifted from sidecar.yaml's"
    );
    assert_eq!(p["volumes"], m["volumes"]);
    assert_eq!(
        p["terminationGracePeriodSeconds"],
        m["terminationGracePeriodSeconds"]
    );
    assert_eq!(s(p, &["securityContext", "fsGroup"]).as_i64(), Some(10001));
    // It picks the workloads the manifest's Deployment is marked as.
    let k = &yaml("kubernetes/kustomize/sidecar/kustomization.yaml")[0];
    assert_eq!(k["kind"].as_str(), Some("Component"));
    let marked = s(dep, &["metadata", "annotations", "sidecache/inject"]).as_str();
    for t in k["patches"].as_vec().unwrap() {
        assert_eq!(
            t["target"]["annotationSelector"].as_str(),
            marked.map(|v| format!("sidecache/inject={v}")).as_deref()
        );
    }
}
