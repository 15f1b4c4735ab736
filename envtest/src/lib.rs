//! Real Kubernetes control planes for tests, the envtest way: `etcd` and `kube-apiserver` (and
//! `kube-controller-manager` when present) started from the directory named by `KUBEBUILDER_ASSETS`,
//! on free loopback ports, with generated certificates and an admin bearer token.
//!
//! Owns: starting, probing and stopping those processes, their scratch directory, and the visible
//! skip when no binaries are configured. Must not: know anything about the hub, or pass a test whose
//! control plane could not be had (a test either runs on a real server, fails, or says it skipped).
//!
//! Every process runs under a small `sh` watchdog that holds a pipe from the test process: when the
//! test process ends for any reason (a normal exit, a panic, SIGKILL) the pipe closes and the
//! watchdog stops the process, so no `kube-apiserver` outlives its test run. [`ControlPlane`]'s
//! `Drop` closes the pipes in order (controller manager, API server, etcd) and waits for each.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};

/// The envtest convention: a directory holding `kube-apiserver` and `etcd`.
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";
/// Set (to anything but empty or `0`) where a skip would hide a gap, as in CI: a test that cannot
/// have its control plane fails instead of skipping.
pub const REQUIRE_ENV: &str = "KARPENTER_HUB_REQUIRE_ENVTEST";
/// Set to keep the scratch directories (logs, certificates) of stopped control planes.
pub const KEEP_ENV: &str = "KARPENTER_HUB_ENVTEST_KEEP";

const READY_TIMEOUT: Duration = Duration::from_secs(90);
const START_ATTEMPTS: usize = 3;

/// Why a control plane could not be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{ASSETS_ENV} is not set: point it at a directory holding kube-apiserver and etcd (envtest binaries; \
         `.ci/run` unpacks ../shared/envtest there, see README.md \"Run the tests\")"
    )]
    NotConfigured,
    #[error(
        "{ASSETS_ENV}={dir}: {binary} is missing or not executable there; the directory must hold kube-apiserver and etcd"
    )]
    MissingBinary { dir: PathBuf, binary: &'static str },
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("generating the control plane's certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    #[error("cannot start {component}: {source}")]
    Spawn { component: &'static str, source: std::io::Error },
    #[error("{component} of control plane {name} {why}; last lines of {log}:\n{tail}")]
    NotReady { name: String, component: &'static str, why: String, log: PathBuf, tail: String },
    #[error("the kubeconfig written for control plane {name} does not load: {source}")]
    Kubeconfig { name: String, source: KubeconfigError },
    #[error("an earlier start of the shared control plane {name} failed: {source}")]
    SharedFailed { name: String, source: Arc<Error> },
}

/// Why the admin kubeconfig gives no client.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("{0}")]
    Load(#[from] kube::config::KubeconfigError),
    #[error("{0}")]
    Client(#[from] kube::Error),
    /// The runtime the blocking loader needs could not be built.
    #[error("{0}")]
    Runtime(#[from] std::io::Error),
    #[error("the kubeconfig loader panicked")]
    Panicked,
}

/// What the readiness probe saw.
enum Probe {
    Ready,
    NotYet,
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io { what, path: path.to_path_buf(), source }
}

/// The binaries of one envtest installation.
#[derive(Clone, Debug)]
pub struct Assets {
    dir: PathBuf,
}

impl Assets {
    /// The binaries named by `KUBEBUILDER_ASSETS`.
    pub fn from_env() -> Result<Self, Error> {
        match std::env::var_os(ASSETS_ENV) {
            Some(dir) if !dir.is_empty() => Self::new(PathBuf::from(dir)),
            _ => Err(Error::NotConfigured),
        }
    }

    /// The binaries in `dir` (which must hold at least `kube-apiserver` and `etcd`).
    pub fn new(dir: PathBuf) -> Result<Self, Error> {
        for binary in ["kube-apiserver", "etcd"] {
            if !is_executable(&dir.join(binary)) {
                return Err(Error::MissingBinary { dir, binary });
            }
        }
        Ok(Self { dir })
    }

    fn binary(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Whether `kube-controller-manager` is there too.
    pub fn has_controller_manager(&self) -> bool {
        is_executable(&self.binary("kube-controller-manager"))
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// How to start a control plane.
#[derive(Clone, Debug)]
pub struct Options {
    /// Names the control plane in its directory, logs and errors (`mgmt`, `workload-1`).
    pub name: String,
    /// Run `kube-controller-manager` (garbage collection, namespace deletion, PDB status,
    /// service-account tokens) when the assets have it. Default: true.
    pub controller_manager: bool,
    /// More kube-apiserver flags, after envtest's own (a later flag wins), e.g.
    /// `--etcd-compaction-interval=2s` for a test that needs etcd history compacted. Default: none.
    pub apiserver_args: Vec<String>,
}

impl Options {
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), controller_manager: true, apiserver_args: Vec::new() }
    }
}

/// One running control plane. Stopped, and its directory removed, on drop.
pub struct ControlPlane {
    name: String,
    dir: PathBuf,
    server: String,
    kubeconfig_path: PathBuf,
    controller_manager: bool,
    /// In stop order: controller manager, API server, etcd.
    processes: Vec<Supervised>,
}

impl fmt::Debug for ControlPlane {
    // The token stays out of debug output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlPlane")
            .field("name", &self.name)
            .field("server", &self.server)
            .field("dir", &self.dir)
            .field("controller_manager", &self.controller_manager)
            .finish()
    }
}

/// A process under its watchdog.
struct Supervised {
    component: &'static str,
    log: PathBuf,
    watchdog: Child,
    /// Closing it tells the watchdog to stop the process.
    lifeline: Option<ChildStdin>,
}

impl Supervised {
    fn exited(&mut self) -> bool {
        matches!(self.watchdog.try_wait(), Ok(Some(_)))
    }

    fn stop(&mut self) {
        drop(self.lifeline.take());
        let _ = self.watchdog.wait();
    }
}

/// The watchdog: runs the command, stops it (TERM, then KILL after 10 s) when its standard input
/// closes, and exits when the command exits (so an early death is seen). `$CLEANUP`, when set, is
/// removed once the command is gone.
const WATCHDOG: &str = r#"exec 3<&0
"$@" 3<&- </dev/null &
pid=$!
(
  read -r _ <&3
  kill -TERM "$pid" 2>/dev/null
  i=0
  while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  kill -KILL "$pid" 2>/dev/null
  if [ -n "${CLEANUP:-}" ]; then sleep 0.2; rm -rf "$CLEANUP"; fi
) &
wait "$pid"
"#;

fn supervise(
    component: &'static str,
    program: &Path,
    args: &[String],
    log: &Path,
    cleanup: Option<&Path>,
) -> Result<Supervised, Error> {
    let out = std::fs::File::create(log).map_err(io("creating log", log))?;
    let err = out.try_clone().map_err(io("opening log", log))?;
    let mut command = Command::new("sh");
    command.arg("-c").arg(WATCHDOG).arg(component).arg(program).args(args);
    command.stdin(Stdio::piped()).stdout(out).stderr(err);
    if let Some(dir) = cleanup {
        command.env("CLEANUP", dir);
    }
    let mut watchdog = command.spawn().map_err(|source| Error::Spawn { component, source })?;
    let lifeline = watchdog.stdin.take();
    Ok(Supervised { component, log: log.to_path_buf(), watchdog, lifeline })
}

fn tail(path: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn free_ports<const N: usize>() -> Result<[u16; N], Error> {
    // Held together so that the N ports differ; released just before the processes bind them.
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0u16; N];
    for port in &mut ports {
        let l = TcpListener::bind("127.0.0.1:0").map_err(io("binding a free port on", Path::new("127.0.0.1")))?;
        *port = l.local_addr().map_err(io("reading the port of", Path::new("127.0.0.1")))?.port();
        listeners.push(l);
    }
    Ok(ports)
}

fn random_hex(bytes: usize) -> Result<String, Error> {
    let path = Path::new("/dev/urandom");
    let mut buf = vec![0u8; bytes];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut buf)).map_err(io("reading", path))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// The PKI of one control plane, as files under `pki/`.
struct Pki {
    ca_pem: String,
    token: String,
}

fn write_pki(dir: &Path) -> Result<Pki, Error> {
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(io("writing", &path))
    };
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "envtest-ca");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca.self_signed(&ca_key)?;
    write("ca.crt", &ca_cert.pem())?;
    let issuer = Issuer::new(ca, ca_key);

    let server_key = KeyPair::generate()?;
    let mut server = CertificateParams::new(
        ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"].map(String::from).to_vec(),
    )?;
    server.subject_alt_names.push(SanType::IpAddress([127, 0, 0, 1].into()));
    server.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    let server_cert = server.signed_by(&server_key, &issuer)?;
    write("apiserver.crt", &server_cert.pem())?;
    write("apiserver.key", &server_key.serialize_pem())?;

    // Service-account token signing (ECDSA P-256: kube-apiserver accepts it).
    let sa = KeyPair::generate()?;
    write("sa.key", &sa.serialize_pem())?;
    write("sa.pub", &sa.public_key_pem())?;

    let token = random_hex(24)?;
    write("tokens.csv", &format!("{token},admin,admin-uid,system:masters\n"))?;
    Ok(Pki { ca_pem: ca_cert.pem(), token })
}

fn kubeconfig_yaml(name: &str, server: &str, ca_pem: &str, token: &str) -> String {
    use base64::Engine as _;
    // Quoted scalars throughout: the values are generated, but YAML must not read them as anything else.
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: \"{server}\"\n    certificate-authority-data: \"{ca}\"\nusers:\n- name: admin\n  user:\n    token: \"{token}\"\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: admin\ncurrent-context: {name}\n",
        ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes()),
    )
}

fn scratch_root() -> PathBuf {
    std::env::var_os("CARGO_TARGET_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir).join("envtest")
}

impl ControlPlane {
    /// Starts a control plane from `KUBEBUILDER_ASSETS` and waits until `/readyz` answers.
    pub fn start(options: &Options) -> Result<Self, Error> {
        Self::start_with(&Assets::from_env()?, options)
    }

    /// Starts a control plane from the given binaries. Blocks until it is ready (a few seconds).
    pub fn start_with(assets: &Assets, options: &Options) -> Result<Self, Error> {
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            match Self::try_start(assets, options) {
                Ok(cp) => return Ok(cp),
                // A port taken between choosing and binding it: choose again.
                Err(e @ Error::NotReady { .. }) if e.to_string().contains("address already in use") => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(Error::NotConfigured))
    }

    fn try_start(assets: &Assets, options: &Options) -> Result<Self, Error> {
        let root = scratch_root();
        std::fs::create_dir_all(&root).map_err(io("creating", &root))?;
        let dir = root.join(format!("{}-{}-{}", options.name, std::process::id(), random_hex(4)?));
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki).map_err(io("creating", &pki))?;
        let Pki { ca_pem, token } = write_pki(&pki)?;
        let [api_port, etcd_client, etcd_peer] = free_ports::<3>()?;
        let server = format!("https://127.0.0.1:{api_port}");
        let kubeconfig_path = dir.join("kubeconfig");
        std::fs::write(&kubeconfig_path, kubeconfig_yaml(&options.name, &server, &ca_pem, &token))
            .map_err(io("writing", &kubeconfig_path))?;
        let controller_manager = options.controller_manager && assets.has_controller_manager();
        let mut cp = ControlPlane {
            name: options.name.clone(),
            dir: dir.clone(),
            server,
            kubeconfig_path,
            controller_manager,
            processes: Vec::new(),
        };
        let p = |name: &str| pki.join(name).display().to_string();
        let keep = std::env::var_os(KEEP_ENV).is_some_and(|v| !v.is_empty() && v != "0");

        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let etcd_args = [
            "--name=envtest".to_string(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=envtest={peer_url}"),
            "--unsafe-no-fsync=true".to_string(),
            "--log-level=warn".to_string(),
        ];
        let etcd = supervise(
            "etcd",
            &assets.binary("etcd"),
            &etcd_args,
            &dir.join("etcd.log"),
            (!keep).then_some(dir.as_path()),
        )?;
        let mut apiserver_args = vec![
            "--bind-address=127.0.0.1".to_string(),
            "--advertise-address=127.0.0.1".to_string(),
            format!("--secure-port={api_port}"),
            format!("--etcd-servers={etcd_url}"),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--token-auth-file={}", p("tokens.csv")),
            "--authorization-mode=RBAC".to_string(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-cluster-ip-range=10.0.0.0/24".to_string(),
            "--allow-privileged=true".to_string(),
            // Pods in a namespace created a moment ago would otherwise race the controller manager
            // creating its `default` ServiceAccount (envtest disables it for the same reason).
            "--disable-admission-plugins=ServiceAccount".to_string(),
        ];
        apiserver_args.extend(options.apiserver_args.iter().cloned());
        let apiserver = supervise(
            "kube-apiserver",
            &assets.binary("kube-apiserver"),
            &apiserver_args,
            &dir.join("kube-apiserver.log"),
            None,
        )?;
        // Stop order: API server first, then etcd (it must answer while the API server shuts down).
        cp.processes.push(apiserver);
        cp.processes.push(etcd);

        cp.wait_ready()?;

        if controller_manager {
            let kc = cp.kubeconfig_path.display().to_string();
            let args = [
                format!("--kubeconfig={kc}"),
                // No serving endpoint: nothing in a test reads the controller manager's own API.
                "--secure-port=0".to_string(),
                "--leader-elect=false".to_string(),
                format!("--service-account-private-key-file={}", p("sa.key")),
                format!("--root-ca-file={}", p("ca.crt")),
                "--use-service-account-credentials=true".to_string(),
                "--controllers=*".to_string(),
                "--service-cluster-ip-range=10.0.0.0/24".to_string(),
                "--allocate-node-cidrs=false".to_string(),
            ];
            let kcm = supervise(
                "kube-controller-manager",
                &assets.binary("kube-controller-manager"),
                &args,
                &dir.join("kube-controller-manager.log"),
                None,
            )?;
            cp.processes.insert(0, kcm);
        }
        Ok(cp)
    }

    fn wait_ready(&mut self) -> Result<(), Error> {
        let config = self.config_blocking()?;
        let deadline = Instant::now() + READY_TIMEOUT;
        let (tx, rx) = std::sync::mpsc::channel::<Probe>();
        // The probe runs on a runtime of its own: callers may be inside any async runtime, or none.
        // A probe that cannot run ends, and the wait below reports no answer.
        let probe = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                let _ = tx.send(Probe::NotYet);
                return;
            };
            runtime.block_on(async move {
                let Ok(client) = kube::Client::try_from(config) else {
                    let _ = tx.send(Probe::NotYet);
                    return;
                };
                while Instant::now() < deadline {
                    let request = http::Request::get("/readyz").body(Vec::new());
                    // Bounded: a starting API server may accept a connection and answer late.
                    if let Ok(request) = request
                        && let Ok(Ok(body)) =
                            tokio::time::timeout(Duration::from_secs(2), client.request_text(request)).await
                        && body.trim() == "ok"
                    {
                        let _ = tx.send(Probe::Ready);
                        return;
                    }
                    if tx.send(Probe::NotYet).is_err() {
                        return; // the caller gave up
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        });
        // Err holds the index of the process to blame (the first seen dead, else the API server).
        let result = loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(Probe::Ready) => break Ok(()),
                Ok(Probe::NotYet) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    break Err((0, format!("did not answer /readyz within {}s", READY_TIMEOUT.as_secs())));
                }
            }
            if let Some(dead) = self.processes.iter_mut().position(Supervised::exited) {
                break Err((dead, "exited during start-up".to_string()));
            }
        };
        drop(rx);
        if result.is_ok() {
            let _ = probe.join();
        }
        // On failure the probe is not waited for: it ends at its next answer (the processes are
        // stopped when the caller drops the half-started control plane) or at the deadline.
        result.map_err(|(index, why)| {
            let p = &self.processes[index];
            Error::NotReady {
                name: self.name.clone(),
                component: p.component,
                why,
                log: p.log.clone(),
                tail: tail(&p.log, 20),
            }
        })
    }

    fn config_blocking(&self) -> Result<kube::Config, Error> {
        let kubeconfig = self.kubeconfig()?;
        let name = self.name.clone();
        // `from_custom_kubeconfig` is async but does no I/O for an inline CA and a static token.
        let config = std::thread::spawn(move || -> Result<kube::Config, KubeconfigError> {
            Ok(tokio::runtime::Builder::new_current_thread()
                .build()?
                .block_on(kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()))?)
        })
        .join()
        .unwrap_or(Err(KubeconfigError::Panicked));
        config.map_err(|source| Error::Kubeconfig { name, source })
    }

    /// Its name (from [`Options::name`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The API server's URL, `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// A kubeconfig file for the admin (`system:masters`, bearer token, inline CA).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The scratch directory: certificates, logs (`kube-apiserver.log`, `etcd.log`, ...).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the controller manager runs (garbage collection, namespace deletion, PDB status).
    pub fn has_controller_manager(&self) -> bool {
        self.controller_manager
    }

    /// The admin kubeconfig, parsed.
    pub fn kubeconfig(&self) -> Result<kube::config::Kubeconfig, Error> {
        kube::config::Kubeconfig::read_from(&self.kubeconfig_path)
            .map_err(|e| Error::Kubeconfig { name: self.name.clone(), source: e.into() })
    }

    /// A client configuration for the admin, with kube's default retries off (tests want to see
    /// 429 and 503 answers, not minutes of silent retrying).
    pub async fn config(&self) -> Result<kube::Config, Error> {
        let mut config = kube::Config::from_custom_kubeconfig(self.kubeconfig()?, &Default::default())
            .await
            .map_err(|e| Error::Kubeconfig { name: self.name.clone(), source: e.into() })?;
        config.default_retry = false;
        Ok(config)
    }

    /// An admin client, bound to the caller's async runtime.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        kube::Client::try_from(self.config().await?)
            .map_err(|e| Error::Kubeconfig { name: self.name.clone(), source: e.into() })
    }

    /// The process-wide control plane called `name`, started on first use and shared by every
    /// test of this test binary (tests isolate themselves by namespace and unique names). Stopped
    /// when the test process exits.
    pub fn shared(name: &str) -> Result<&'static ControlPlane, Error> {
        Self::shared_with(&Options::new(name))
    }

    /// [`ControlPlane::shared`] with options of its own (e.g. more kube-apiserver flags), shared by
    /// name: the first caller's options start it, later callers get that plane whatever they pass.
    pub fn shared_with(options: &Options) -> Result<&'static ControlPlane, Error> {
        let name = options.name.as_str();
        type Slot = &'static OnceLock<Result<&'static ControlPlane, Arc<Error>>>;
        static SHARED: OnceLock<Mutex<BTreeMap<String, Slot>>> = OnceLock::new();
        let slot: Slot = {
            let mut map = SHARED.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
            map.entry(name.to_string()).or_insert_with(|| Box::leak(Box::new(OnceLock::new())))
        };
        // Missing binaries are a configuration fact, not a failed start: say so every time.
        let assets = Assets::from_env()?;
        let started = slot.get_or_init(|| {
            ControlPlane::start_with(&assets, options).map(|cp| &*Box::leak(Box::new(cp))).map_err(Arc::new)
        });
        match started {
            Ok(cp) => Ok(cp),
            Err(first) => Err(Error::SharedFailed { name: name.to_string(), source: Arc::clone(first) }),
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for p in &mut self.processes {
            p.stop();
        }
        if std::env::var_os(KEEP_ENV).is_none_or(|v| v.is_empty() || v == "0") {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Whether a missing control plane fails the test (`KARPENTER_HUB_REQUIRE_ENVTEST`, set in CI).
pub fn required() -> bool {
    std::env::var_os(REQUIRE_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Reports that `test` did not run on a real server, and why, where the person running the tests
/// sees it: straight to the process's standard error, which the test harness does not capture.
/// Panics instead when [`required`] (CI must never skip the real tier) or when the error is a
/// broken installation or a failed start rather than a missing configuration.
pub fn skip(test: &str, error: &Error) {
    if required() || !matches!(error, Error::NotConfigured) {
        panic!("{test}: no real control plane: {error}");
    }
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "test {test} ... skipped on a real API server: {error}");
}

/// The shared control plane `name` for the test this expands in, or a visible skip (return).
///
/// ```ignore
/// let cp = envtest::shared_or_skip!("mgmt");
/// let client = cp.client().await.unwrap();
/// ```
#[macro_export]
macro_rules! shared_or_skip {
    ($name:expr) => {
        match $crate::ControlPlane::shared($name) {
            Ok(cp) => cp,
            Err(e) => {
                $crate::skip(&$crate::current_test(), &e);
                return;
            }
        }
    };
}

/// The running test's name (libtest names each test's thread after it).
pub fn current_test() -> String {
    std::thread::current().name().unwrap_or("a test").to_string()
}
