//! The image, built in CI without a container engine (issue 29 item 6): `image/assemble.sh`
//! assembles an OCI layout from this build's two binaries and Debian 12 packages; the layout's
//! configuration and files are the Dockerfile's (binaries where it copies them, its user,
//! entrypoint, command and labels); unpacked with umoci, its entrypoints run from the root
//! filesystem as uid 65532 (chroot): the hub prints its version, the webhook serves an admission
//! review over TLS; the CA bundle the hub needs for public endpoints is there.
//!
//! Needs root (chroot, and umoci writing owners) and umoci (`.ci/run` installs it); without them the
//! test says it skipped, and under `KARPENTER_HUB_REQUIRE_ENVTEST=1` (CI) it fails instead.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use common::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Why the test cannot run here, if it cannot.
fn missing() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref() != Some("0") {
        return Some("not root: chroot and umoci's layer owners need it".into());
    }
    let found =
        |tool: &str| Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
    if !found("umoci") {
        return Some("umoci is not installed (apt-get install umoci; .ci/run installs it)".into());
    }
    None
}

/// The Dockerfile's runtime stage: what it copies where, its user, entrypoint, command, labels.
struct Runtime {
    binaries: Vec<String>,
    destination: String,
    user: String,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    labels: Vec<(String, String)>,
}

fn dockerfile_runtime(version: &str) -> Runtime {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    // Continuation lines joined; the runtime stage is after the last FROM.
    let joined = text.replace("\\\n", " ");
    let stage = joined.rsplit_once("\nFROM ").unwrap().1;
    let mut runtime = Runtime {
        binaries: vec![],
        destination: String::new(),
        user: String::new(),
        entrypoint: vec![],
        cmd: vec![],
        labels: vec![],
    };
    for line in stage.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("COPY --from=build ") {
            let mut words: Vec<&str> = rest.split_whitespace().collect();
            runtime.destination = words.pop().unwrap().to_string();
            runtime.binaries = words.iter().map(|w| w.rsplit('/').next().unwrap().to_string()).collect();
        } else if let Some(rest) = line.strip_prefix("USER ") {
            runtime.user = rest.to_string();
        } else if let Some(rest) = line.strip_prefix("ENTRYPOINT ") {
            runtime.entrypoint = serde_json::from_str(rest).unwrap();
        } else if let Some(rest) = line.strip_prefix("CMD ") {
            runtime.cmd = serde_json::from_str(rest).unwrap();
        } else if let Some(rest) = line.strip_prefix("LABEL ") {
            // key="value" pairs.
            let mut rest = rest.trim();
            while let Some((key, after)) = rest.split_once("=\"") {
                let (value, next) = after.split_once('"').unwrap();
                runtime.labels.push((key.trim().to_string(), value.replace("${VERSION}", version)));
                rest = next.trim();
            }
        }
    }
    runtime
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    layout.join("blobs/sha256").join(digest.strip_prefix("sha256:").unwrap())
}

#[cfg(unix)]
#[tokio::test]
async fn the_image_assembled_from_debian_packages_is_the_dockerfiles_and_runs_as_65532() {
    let test = envtest::current_test();
    if let Some(why) = missing() {
        assert!(!envtest::required(), "{test}: {why}");
        let _ = writeln!(std::io::stderr().lock(), "test {test} ... skipped: {why}");
        return;
    }
    let webhook_binary = PathBuf::from(env!("CARGO_BIN_EXE_karpenter-hub-webhook"));
    let hub_binary = webhook_binary.with_file_name("karpenter-hub");
    assert!(
        hub_binary.exists(),
        "{}: build it first (cargo build -p operator, or cargo test --workspace)",
        hub_binary.display()
    );
    let version = env!("CARGO_PKG_VERSION");
    let dir = TempDir::new("image");
    let out = dir.path().join("image");
    let assembled = Command::new(repo().join("image/assemble.sh"))
        .args([hub_binary.as_os_str(), webhook_binary.as_os_str(), out.as_os_str()])
        .arg(format!("v{version}"))
        .output()
        .unwrap();
    assert!(
        assembled.status.success(),
        "image/assemble.sh failed:\n{}{}",
        String::from_utf8_lossy(&assembled.stdout),
        String::from_utf8_lossy(&assembled.stderr)
    );

    // The layout's configuration is the Dockerfile's.
    let layout = out.join("oci");
    let index = read_json(&layout.join("index.json"));
    let manifest = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == format!("v{version}"))
        .unwrap();
    let manifest = read_json(&blob(&layout, manifest["digest"].as_str().unwrap()));
    let config = read_json(&blob(&layout, manifest["config"]["digest"].as_str().unwrap()));
    let docker = dockerfile_runtime(version);
    assert_eq!(config["config"]["User"], docker.user.as_str());
    assert_eq!(config["config"]["Entrypoint"], json!(docker.entrypoint));
    assert_eq!(config["config"]["Cmd"], json!(docker.cmd));
    assert_eq!((config["os"].as_str(), config["architecture"].as_str()), (Some("linux"), Some("amd64")));
    assert_eq!(docker.labels.len(), 6, "the Dockerfile's labels: {:?}", docker.labels);
    for (key, value) in &docker.labels {
        assert_eq!(config["config"]["Labels"][key], value.as_str(), "label {key}");
    }
    let layers: u64 = manifest["layers"].as_array().unwrap().iter().map(|l| l["size"].as_u64().unwrap()).sum();
    println!("image v{version}: {} layer(s), {layers} bytes compressed", manifest["layers"].as_array().unwrap().len());

    // Unpacked: the binaries where the Dockerfile copies them, the CA bundle, the user.
    let bundle = dir.path().join("bundle");
    let unpacked = Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:v{version}", layout.display()))
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(unpacked.status.success(), "umoci unpack: {}", String::from_utf8_lossy(&unpacked.stderr));
    let rootfs = bundle.join("rootfs");
    assert_eq!(docker.binaries, ["karpenter-hub", "karpenter-hub-webhook"]);
    for b in &docker.binaries {
        let path = rootfs.join(docker.destination.trim_start_matches('/')).join(b);
        assert!(path.is_file(), "{} missing", path.display());
    }
    let bundle_pem = std::fs::read(rootfs.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
    let cas = {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        CertificateDer::pem_slice_iter(&bundle_pem).filter(Result::is_ok).count()
    };
    assert!(cas > 100, "the CA bundle holds {cas} certificates");
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(passwd.lines().any(|l| l.starts_with("nonroot:x:65532:65532:")), "{passwd}");
    assert!(!rootfs.join("bin/sh").exists() && !rootfs.join("usr/bin/sh").exists(), "a shell in the image");

    // The entrypoints, from the root filesystem, as 65532.
    // By its path: the child's environment is cleared, PATH included.
    let chroot = ["/usr/sbin/chroot", "/usr/bin/chroot"].into_iter().find(|p| Path::new(p).exists()).unwrap();
    let as_nonroot = |program: &str| {
        let mut c = Command::new(chroot);
        c.arg("--userspec=65532:65532").arg(&rootfs).arg(program).env_clear();
        c
    };
    let hub = as_nonroot("/usr/local/bin/karpenter-hub").arg("--version").output().unwrap();
    assert!(hub.status.success(), "{}", String::from_utf8_lossy(&hub.stderr));
    assert_eq!(String::from_utf8_lossy(&hub.stdout).trim(), format!("karpenter-hub {version}"));

    let ca = Ca::new();
    let (cert, key, _) = ca.issue(&["localhost"]);
    let tls = rootfs.join("tmp/tls");
    std::fs::create_dir_all(&tls).unwrap();
    std::fs::write(tls.join("tls.crt"), cert).unwrap();
    std::fs::write(tls.join("tls.key"), key).unwrap();
    Command::new("chown").args(["-R", "65532:65532"]).arg(&tls).status().unwrap();
    let (port, probe_port) = (free_port(), free_port());
    let log = dir.path().join("webhook.log");
    let mut child = KillOnDrop(
        as_nonroot("/usr/local/bin/karpenter-hub-webhook")
            .args([
                format!("--address=127.0.0.1:{port}"),
                format!("--probe-address=127.0.0.1:{probe_port}"),
                "--tls-cert-file=/tmp/tls/tls.crt".into(),
                "--tls-key-file=/tmp/tls/tls.key".into(),
                "--lookups=off".into(),
            ])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.path().join("webhook.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    ready_or_panic(&mut child.0, probe_port, Duration::from_secs(30), &log).await;
    let client = client(&ca.pem(), false);
    // It runs as 65532 (chroot switched user before exec: the child is the webhook).
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.0.id())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap().to_string();
    assert!(uid.split_whitespace().skip(1).all(|u| u == "65532"), "{uid}");
    let body = review("FlavorCatalog", "CREATE", flavor_catalog("c", json!([{"name": "M", "priceHourly": 0.1}])), None);
    let (code, answer) = post(&client, &format!("https://localhost:{port}/validate/flavorcatalogs"), &body).await;
    drop(child);
    assert_eq!((code, answer["response"]["allowed"].as_bool()), (200, Some(true)), "{answer}");
}
