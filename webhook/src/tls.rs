//! The serving certificate: read from two PEM files, served through a rustls certificate resolver,
//! and reloaded when the files change, without a restart.
//!
//! Changes are found by polling: every interval both files are read through their paths and
//! compared with the pair last tried. Polling follows every way a file can be replaced — an edit in
//! place, a rename over it, and the symlink swap of a Kubernetes Secret volume (`tls.crt ->
//! ..data/tls.crt`, `..data -> ..2026_11_23_...`, where only `..data` changes) — which inotify
//! watches on the file itself miss. A new pair is served only if it parses and the key matches the
//! certificate. A changed pair that is not usable is read again after a short settle time (a poll
//! caught mid-replacement then sees the finished pair); if it still is not, the previous pair stays,
//! the failure is logged once per distinct pair and counted, and the next change is tried again.
//!
//! Only TLS 1.2 and 1.3 are offered (rustls implements nothing older), with the ring provider.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::metrics::{Metrics, ReloadOutcome};

/// Largest certificate or key file read (a chain is a few KiB).
pub const MAX_PEM_BYTES: u64 = 1024 * 1024;
/// How long a poll waits before reading a changed but unusable pair again.
pub const SETTLE: Duration = Duration::from_millis(100);

/// Why a certificate pair cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A file is larger than [`MAX_PEM_BYTES`].
    #[error("{path} is larger than {MAX_PEM_BYTES} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The certificate file holds no PEM certificate, or a broken one.
    #[error("{path} holds no usable PEM certificate: {reason}")]
    Certificate {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The key file holds no PEM private key, or one rustls cannot use.
    #[error("{path} holds no usable PEM private key: {reason}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The key does not belong to the certificate.
    #[error("the key in {key} does not match the certificate in {cert}: {reason}")]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        reason: String,
    },
}

/// The two files of the serving pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFiles {
    /// PEM certificate chain, leaf first (`tls.crt`).
    pub cert: PathBuf,
    /// PEM private key: PKCS#8, PKCS#1 or SEC1 (`tls.key`).
    pub key: PathBuf,
}

/// Builds the served pair from PEM bytes: the chain, the key, and the check that they match.
pub fn certified_key(
    files: &CertificateFiles,
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, CertificateError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertificateError::Certificate { path: files.cert.clone(), reason: e.to_string() })?;
    if chain.is_empty() {
        return Err(CertificateError::Certificate {
            path: files.cert.clone(),
            reason: "no CERTIFICATE block".to_string(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| CertificateError::Key { path: files.key.clone(), reason: e.to_string() })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            CertificateError::Mismatch { cert: files.cert.clone(), key: files.key.clone(), reason: e.to_string() }
        }
        other => CertificateError::Key { path: files.key.clone(), reason: other.to_string() },
    })
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, CertificateError> {
    let read_error = |source| CertificateError::Read { path: path.to_path_buf(), source };
    let length = std::fs::metadata(path).map_err(read_error)?.len();
    if length > MAX_PEM_BYTES {
        return Err(CertificateError::TooLarge { path: path.to_path_buf() });
    }
    std::fs::read(path).map_err(read_error)
}

/// The `notAfter` of a DER certificate, in Unix seconds: enough X.509 to report when the served
/// certificate expires (a rotation that keeps failing leaves the old pair in place until then).
pub fn not_after(der: &[u8]) -> Option<i64> {
    let (0x30, certificate, _) = tlv(der)? else { return None };
    let (0x30, tbs, _) = tlv(certificate)? else { return None };
    let mut rest = tbs;
    // version [0] EXPLICIT is optional; then serialNumber, signature, issuer.
    let (tag, _, after) = tlv(rest)?;
    if tag == 0xa0 {
        rest = after;
    }
    for _ in 0..3 {
        rest = tlv(rest)?.2;
    }
    let (0x30, validity, _) = tlv(rest)? else { return None };
    let (_, _, after_not_before) = tlv(validity)?;
    let (tag, time, _) = tlv(after_not_before)?;
    der_time(tag, time)
}

/// One DER element at the start of `input`: (tag, content, what follows).
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, rest) = rest.split_at(count);
        (bytes.iter().fold(0usize, |length, b| (length << 8) | usize::from(*b)), rest)
    };
    if rest.len() < length {
        return None;
    }
    let (content, rest) = rest.split_at(length);
    Some((tag, content, rest))
}

/// UTCTime (`YYMMDDHHMMSSZ`, tag 0x17) or GeneralizedTime (`YYYYMMDDHHMMSSZ`, tag 0x18), in Unix seconds.
fn der_time(tag: u8, time: &[u8]) -> Option<i64> {
    let digits = time.strip_suffix(b"Z")?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        digits.get(range)?.iter().try_fold(0i64, |n, d| Some(n * 10 + i64::from(d - b'0')))
    };
    let (year, rest) = match (tag, digits.len()) {
        (0x17, 12) => {
            let yy = number(0..2)?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, 2)
        }
        (0x18, 14) => (number(0..4)?, 4),
        _ => return None,
    };
    let field = |i: usize| number(rest + 2 * i..rest + 2 * i + 2);
    let (month, day, hour, minute, second) = (field(0)?, field(1)?, field(2)?, field(3)?, field(4)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = if year >= 0 { year } else { year - 399 } / 400;
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The bytes of a certificate file and of a key file.
type PemPair = (Vec<u8>, Vec<u8>);

/// What one poll found.
#[derive(Debug)]
pub enum Poll {
    /// The files hold the pair last tried.
    Unchanged,
    /// A new pair is served.
    Reloaded,
    /// The files changed to a pair that cannot be served; the previous pair stays.
    Rejected(CertificateError),
}

/// The served certificate pair, swapped in place when the files change.
pub struct ReloadingCertificate {
    files: CertificateFiles,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    /// The bytes of the pair last tried (served or refused), to try each change once.
    last_tried: Mutex<PemPair>,
}

impl fmt::Debug for ReloadingCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCertificate").field("files", &self.files).finish_non_exhaustive()
    }
}

impl ReloadingCertificate {
    /// Reads the pair; fails when it cannot be served (the server must not start without one).
    pub fn load(files: CertificateFiles, provider: Arc<CryptoProvider>) -> Result<Self, CertificateError> {
        let cert = read_bounded(&files.cert)?;
        let key = read_bounded(&files.key)?;
        let pair = certified_key(&files, &cert, &key, &provider)?;
        Ok(ReloadingCertificate {
            files,
            provider,
            current: RwLock::new(Arc::new(pair)),
            last_tried: Mutex::new((cert, key)),
        })
    }

    /// When the served certificate expires (Unix seconds), if its leaf can be read.
    pub fn expiry(&self) -> Option<i64> {
        self.current().cert.first().and_then(|leaf| not_after(leaf))
    }

    /// The pair served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Reads the files and serves the new pair if they changed and it is good.
    ///
    /// A changed pair that cannot be served is read once more after [`SETTLE`]: a poll that lands
    /// in the middle of a replacement (the certificate written, the key not yet; the old directory
    /// of a Secret volume removed between the two reads) then sees the finished pair instead of
    /// reporting a failure.
    pub fn poll(&self) -> Poll {
        let (read, built) = self.attempt();
        if self.already_tried(read.as_ref()) {
            return Poll::Unchanged;
        }
        let (read, built) = match built {
            Ok(pair) => (read, Ok(pair)),
            Err(_) => {
                std::thread::sleep(SETTLE);
                self.attempt()
            }
        };
        *self.last_tried.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
            read.unwrap_or((Vec::new(), Vec::new()));
        match built {
            Ok(pair) => {
                *self.current.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(pair);
                Poll::Reloaded
            }
            Err(error) => Poll::Rejected(error),
        }
    }

    /// Reads both files and builds the pair: the bytes (when both could be read) and the outcome.
    fn attempt(&self) -> (Option<PemPair>, Result<CertifiedKey, CertificateError>) {
        let read = read_bounded(&self.files.cert).and_then(|cert| Ok((cert, read_bounded(&self.files.key)?)));
        match read {
            Ok((cert, key)) => {
                let built = certified_key(&self.files, &cert, &key, &self.provider);
                (Some((cert, key)), built)
            }
            Err(error) => (None, Err(error)),
        }
    }

    /// Whether these bytes are what the last poll already tried (an unreadable state counts once).
    fn already_tried(&self, read: Option<&PemPair>) -> bool {
        let last = self.last_tried.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match read {
            Some((cert, key)) => last.0 == *cert && last.1 == *key,
            None => last.0.is_empty() && last.1.is_empty(),
        }
    }

    /// Polls every `interval` until `stop` resolves, logging and counting each change.
    pub async fn watch(self: Arc<Self>, interval: Duration, metrics: Arc<Metrics>, stop: impl Future<Output = ()>) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => return,
                _ = ticks.tick() => {}
            }
            let this = self.clone();
            // File reads are blocking; keep them off the request workers.
            let poll = match tokio::task::spawn_blocking(move || this.poll()).await {
                Ok(poll) => poll,
                Err(error) => {
                    tracing::error!(%error, "certificate poll failed");
                    continue;
                }
            };
            match poll {
                Poll::Unchanged => {}
                Poll::Reloaded => {
                    metrics.reload(ReloadOutcome::Success);
                    let expiry = self.expiry();
                    metrics.certificate_expiry(expiry);
                    tracing::info!(cert = %self.files.cert.display(), not_after_unix = expiry.unwrap_or_default(), "serving certificate reloaded");
                }
                Poll::Rejected(error) => {
                    metrics.reload(ReloadOutcome::Failure);
                    tracing::warn!(%error, "new serving certificate refused; the previous one is still served");
                }
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A rustls server configuration serving `certificate`: TLS 1.3 and 1.2, HTTP/2 and HTTP/1.1.
pub fn server_config(
    certificate: Arc<ReloadingCertificate>,
    provider: Arc<CryptoProvider>,
) -> Result<rustls::ServerConfig, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(certificate);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn pair(name: &str) -> (String, String) {
        let cert = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        (cert.cert.pem(), cert.signing_key.serialize_pem())
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("karpenter-hub-webhook-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn leaf(c: &ReloadingCertificate) -> Vec<u8> {
        c.current().cert[0].to_vec()
    }

    #[test]
    fn a_mismatched_or_broken_pair_is_refused_and_the_old_one_kept() {
        let dir = temp_dir("refuse");
        let files = CertificateFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key") };
        let (cert_a, key_a) = pair("a");
        let (cert_b, key_b) = pair("b");
        std::fs::write(&files.cert, &cert_a).unwrap();
        std::fs::write(&files.key, &key_a).unwrap();
        let c = ReloadingCertificate::load(files.clone(), provider()).unwrap();
        let served = leaf(&c);
        assert!(matches!(c.poll(), Poll::Unchanged));

        // New cert, old key: refused until the key arrives.
        std::fs::write(&files.cert, &cert_b).unwrap();
        assert!(matches!(c.poll(), Poll::Rejected(CertificateError::Mismatch { .. })));
        assert!(matches!(c.poll(), Poll::Unchanged), "a refused pair is reported once");
        assert_eq!(leaf(&c), served);
        std::fs::write(&files.key, &key_b).unwrap();
        assert!(matches!(c.poll(), Poll::Reloaded));
        assert_ne!(leaf(&c), served);

        // Garbage and missing files are refused too.
        let served = leaf(&c);
        std::fs::write(&files.cert, "not a certificate").unwrap();
        assert!(matches!(c.poll(), Poll::Rejected(CertificateError::Certificate { .. })));
        std::fs::remove_file(&files.cert).unwrap();
        assert!(matches!(c.poll(), Poll::Rejected(CertificateError::Read { .. })));
        assert!(matches!(c.poll(), Poll::Unchanged));
        std::fs::write(&files.cert, &cert_b).unwrap();
        std::fs::write(&files.key, "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").unwrap();
        assert!(matches!(c.poll(), Poll::Rejected(CertificateError::Key { .. })));
        assert_eq!(leaf(&c), served);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn not_after_reads_utc_and_generalized_times() {
        for ((y, m, d), expected) in
            [((2031, 5, 17), 1_936_742_400), ((2060, 1, 1), 2_840_140_800), ((1999, 12, 31), 946_598_400)]
        {
            let mut params = rcgen::CertificateParams::new(vec!["a".to_string()]).unwrap();
            params.not_after = rcgen::date_time_ymd(y, m, d);
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = params.self_signed(&key).unwrap();
            assert_eq!(not_after(cert.der()), Some(expected), "{y}-{m}-{d}");
        }
        assert_eq!(not_after(b""), None);
        assert_eq!(not_after(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(der_time(0x17, b"991231235960Z"), Some(946_598_400 + 86_399 + 1));
        assert_eq!(der_time(0x17, b"9912312359Z"), None);
        assert_eq!(der_time(0x18, b"20311301000000Z"), None);
    }

    proptest::proptest! {
        #[test]
        fn not_after_never_panics(der in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = not_after(&der);
        }
    }

    #[test]
    fn load_fails_without_a_good_pair() {
        let dir = temp_dir("load");
        let files = CertificateFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key") };
        assert!(matches!(ReloadingCertificate::load(files.clone(), provider()), Err(CertificateError::Read { .. })));
        std::fs::write(&files.cert, "").unwrap();
        std::fs::write(&files.key, "").unwrap();
        let error = ReloadingCertificate::load(files, provider()).unwrap_err();
        assert!(error.to_string().contains("no CERTIFICATE block"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn the_kubernetes_symlink_swap_is_followed() {
        use std::os::unix::fs::symlink;
        // The layout of a Secret volume: files link through ..data, which links to a timestamped dir.
        let dir = temp_dir("swap");
        let write_version = |name: &str, (cert, key): &(String, String)| {
            let version = dir.join(name);
            std::fs::create_dir_all(&version).unwrap();
            std::fs::write(version.join("tls.crt"), cert).unwrap();
            std::fs::write(version.join("tls.key"), key).unwrap();
        };
        let first = pair("first");
        write_version("..2026_11_23_09_00_00.1", &first);
        symlink("..2026_11_23_09_00_00.1", dir.join("..data")).unwrap();
        symlink("..data/tls.crt", dir.join("tls.crt")).unwrap();
        symlink("..data/tls.key", dir.join("tls.key")).unwrap();
        let files = CertificateFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key") };
        let c = ReloadingCertificate::load(files, provider()).unwrap();
        let before = leaf(&c);

        // The kubelet writes the new version, then renames a fresh ..data link over the old one.
        write_version("..2026_11_23_10_00_00.2", &pair("second"));
        symlink("..2026_11_23_10_00_00.2", dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        std::fs::remove_dir_all(dir.join("..2026_11_23_09_00_00.1")).unwrap();
        assert!(matches!(c.poll(), Poll::Reloaded));
        assert_ne!(leaf(&c), before);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
