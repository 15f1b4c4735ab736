//! The self-managed serving certificate (`--certificate-secret`): the webhook keeps its own CA and
//! serving certificate in a Secret of its namespace, writes the pair to the files the server
//! reloads ([`crate::tls`]), and puts the CA in the `caBundle` of its
//! ValidatingWebhookConfiguration — so that an install needs neither cert-manager nor a Secret made
//! by hand.
//!
//! Replicas agree through the Secret: it is created only if absent (the first replica's material
//! wins, the others read it) and replaced only at the `resourceVersion` read (a replica that lost
//! the race reads the winner's). The serving certificate is renewed [`LEAF_RENEW_BEFORE`] before it
//! expires, or when the service's DNS names change; the CA [`CA_RENEW_BEFORE`] before it expires,
//! the old CA kept in the bundle beside the new one until it expires, so that a replica still
//! serving the old pair is trusted throughout.
//!
//! Owns: the decision ([`plan`], pure, time passed in), the material (rcgen), the Secret round trip,
//! the files, the `caBundle`. Must not: touch a Secret without its label
//! (`app.kubernetes.io/managed-by: karpenter-hub-webhook`), or a webhook of the configuration that
//! does not call its service.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::tls::{CertificateFiles, MAX_PEM_BYTES, not_after};

/// Label marking the Secret as the webhook's own.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "karpenter-hub-webhook";
/// Annotation listing the DNS names the serving certificate was issued for (comma-separated).
pub const DNS_NAMES_ANNOTATION: &str = "karpenter.clever-cloud.com/dns-names";
/// Keys of the Secret: the serving pair as a `kubernetes.io/tls` Secret has it, and the CA.
pub const TLS_CRT: &str = "tls.crt";
/// The serving key.
pub const TLS_KEY: &str = "tls.key";
/// The CA bundle (the current CA first, then a previous one until it expires).
pub const CA_CRT: &str = "ca.crt";
/// The current CA's key.
pub const CA_KEY: &str = "ca.key";

const DAY: i64 = 86_400;
/// Lifetime of the CA.
pub const CA_VALIDITY: i64 = 10 * 365 * DAY;
/// A CA with less left than this is replaced.
pub const CA_RENEW_BEFORE: i64 = 365 * DAY;
/// Lifetime of the serving certificate.
pub const LEAF_VALIDITY: i64 = 90 * DAY;
/// A serving certificate with less left than this is renewed.
pub const LEAF_RENEW_BEFORE: i64 = 30 * DAY;
/// Certificates start this long before they are made (clocks of the API server and the webhook
/// may differ a little).
const BACKDATE: i64 = 300;
/// Common name of the CA (the issuer every serving certificate names).
const CA_NAME: &str = "karpenter-hub-webhook-ca";

/// Where the webhook runs: the names the API server calls it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Namespace of the webhook (and of its Secret and Service).
    pub namespace: String,
    /// Name of its Service.
    pub service: String,
    /// The cluster's DNS domain (`cluster.local`).
    pub cluster_domain: String,
}

impl Identity {
    /// `svc`, `svc.ns`, `svc.ns.svc`, `svc.ns.svc.<domain>`: what the serving certificate covers.
    pub fn dns_names(&self) -> Vec<String> {
        let (s, n) = (&self.service, &self.namespace);
        vec![s.clone(), format!("{s}.{n}"), format!("{s}.{n}.svc"), format!("{s}.{n}.svc.{}", self.cluster_domain)]
    }
}

/// Why the certificate cannot be kept.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// An API call failed.
    #[error("cannot {what}: {source}")]
    Api {
        /// What was tried, naming the object.
        what: String,
        /// The error.
        source: kube::Error,
    },
    /// The Secret exists but is not the webhook's.
    #[error(
        "Secret {namespace}/{name} exists without the label {MANAGED_BY_LABEL}={MANAGED_BY}: the webhook does not \
         overwrite a Secret it did not create; delete it, or choose another name (--certificate-secret)"
    )]
    NotOurs {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// Making a key or a certificate failed.
    #[error("cannot generate the {what}: {source}")]
    Generate {
        /// What.
        what: &'static str,
        /// The error.
        source: rcgen::Error,
    },
    /// Writing the serving pair failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The Secret kept changing under this replica.
    #[error("Secret {0} kept changing while it was being renewed; trying again at the next check")]
    Contended(String),
}

/// The Secret's material, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// CA certificates, the current one first, each with its `notAfter` (Unix seconds).
    pub ca_bundle: Vec<(String, i64)>,
    /// The current CA's key (PEM).
    pub ca_key: String,
    /// The serving certificate (PEM).
    pub cert: String,
    /// Its key (PEM).
    pub key: String,
    /// Its `notAfter`.
    pub cert_not_after: i64,
    /// The DNS names it was issued for.
    pub dns_names: Vec<String>,
}

impl Stored {
    /// The CA bundle as the `caBundle` takes it: the PEM certificates concatenated.
    pub fn bundle_pem(&self) -> String {
        self.ca_bundle.iter().map(|(pem, _)| pem.as_str()).collect()
    }
}

/// What to do with the Secret's material.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// It serves as it is.
    Keep,
    /// A new serving certificate from the current CA (expiring, other names, or an expired CA to
    /// drop from the bundle).
    NewCertificate,
    /// A new CA (none yet, or the current one expiring) and a serving certificate from it.
    NewCa,
}

/// The decision over the stored material (none: the Secret is absent or unreadable) at `now`.
pub fn plan(stored: Option<&Stored>, dns_names: &[String], now: i64) -> Plan {
    let Some(s) = stored else { return Plan::NewCa };
    match s.ca_bundle.first() {
        Some((_, ca_not_after)) if ca_not_after - now >= CA_RENEW_BEFORE => {}
        _ => return Plan::NewCa,
    }
    let expired_ca = s.ca_bundle.iter().any(|(_, t)| *t <= now);
    if s.cert_not_after - now < LEAF_RENEW_BEFORE || s.dns_names != dns_names || expired_ca {
        return Plan::NewCertificate;
    }
    Plan::Keep
}

fn ca_params(now: i64) -> Result<CertificateParams, CertificateError> {
    let mut params = CertificateParams::new(Vec::<String>::new())
        .map_err(|source| CertificateError::Generate { what: "CA", source })?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.distinguished_name.push(DnType::CommonName, CA_NAME);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_before = at(now - BACKDATE);
    params.not_after = at(now + CA_VALIDITY);
    Ok(params)
}

fn at(unix: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(unix).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// New material for `plan` (not [`Plan::Keep`]) from what is stored, at `now`.
pub fn issue(plan: Plan, stored: Option<&Stored>, dns_names: &[String], now: i64) -> Result<Stored, CertificateError> {
    let generate = |what| move |source| CertificateError::Generate { what, source };
    let still_valid =
        |bundle: &[(String, i64)]| -> Vec<(String, i64)> { bundle.iter().filter(|(_, t)| *t > now).cloned().collect() };
    let reuse = match (plan, stored) {
        (Plan::NewCertificate, Some(s)) => KeyPair::from_pem(&s.ca_key).ok().map(|key| (key, s)),
        _ => None,
    };
    let (ca_key, ca_bundle) = match reuse {
        Some((key, s)) => (key, still_valid(&s.ca_bundle)),
        None => {
            let key = KeyPair::generate().map_err(generate("CA key"))?;
            let cert = ca_params(now)?.self_signed(&key).map_err(generate("CA"))?;
            let mut bundle = vec![(cert.pem(), now + CA_VALIDITY)];
            // The previous CA stays trusted until it expires: replicas still serving its pair.
            bundle.extend(stored.map(|s| still_valid(&s.ca_bundle)).unwrap_or_default().into_iter().take(1));
            (key, bundle)
        }
    };
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params(now)?, ca_key);
    let key = KeyPair::generate().map_err(generate("serving key"))?;
    let mut params = CertificateParams::new(dns_names.to_vec()).map_err(generate("serving certificate"))?;
    if let Some(name) = dns_names.get(2).or(dns_names.first()) {
        params.distinguished_name.push(DnType::CommonName, name.as_str());
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.not_before = at(now - BACKDATE);
    params.not_after = at(now + LEAF_VALIDITY);
    let cert = params.signed_by(&key, &issuer).map_err(generate("serving certificate"))?;
    Ok(Stored {
        ca_bundle,
        ca_key: ca_key_pem,
        cert: cert.pem(),
        key: key.serialize_pem(),
        cert_not_after: now + LEAF_VALIDITY,
        dns_names: dns_names.to_vec(),
    })
}

/// The material of a Secret, or `None` when a key is missing, too large or unreadable (it is then
/// made anew).
pub fn read(secret: &Secret) -> Option<Stored> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| -> Option<String> {
        let bytes = &data.get(key)?.0;
        if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > MAX_PEM_BYTES {
            return None;
        }
        String::from_utf8(bytes.clone()).ok()
    };
    let (ca, ca_key, cert, key) = (text(CA_CRT)?, text(CA_KEY)?, text(TLS_CRT)?, text(TLS_KEY)?);
    // The bundle as the webhook writes it: PEM blocks one after the other, each kept as its text.
    let mut ca_bundle = Vec::new();
    for block in ca.split_inclusive("-----END CERTIFICATE-----").filter(|b| !b.trim().is_empty()) {
        let pem = format!("{}\n", block.trim_start());
        let der = CertificateDer::pem_slice_iter(pem.as_bytes()).next()?.ok()?;
        ca_bundle.push((pem, not_after(&der)?));
    }
    if ca_bundle.is_empty() {
        return None;
    }
    let leaf = CertificateDer::pem_slice_iter(cert.as_bytes()).next()?.ok()?;
    let dns_names = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DNS_NAMES_ANNOTATION))
        .map(|v| v.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    Some(Stored { ca_bundle, ca_key, cert, key, cert_not_after: not_after(&leaf)?, dns_names })
}

/// The Secret holding `m`.
fn secret_of(namespace: &str, name: &str, m: &Stored, resource_version: Option<String>) -> Secret {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())])),
            annotations: Some(BTreeMap::from([(DNS_NAMES_ANNOTATION.to_string(), m.dns_names.join(","))])),
            resource_version,
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_string()),
        data: Some(BTreeMap::from([
            (TLS_CRT.to_string(), bytes(&m.cert)),
            (TLS_KEY.to_string(), bytes(&m.key)),
            (CA_CRT.to_string(), bytes(&m.bundle_pem())),
            (CA_KEY.to_string(), bytes(&m.ca_key)),
        ])),
        ..Secret::default()
    }
}

/// Keeps the certificate: the Secret, the files, the `caBundle`.
#[derive(Clone)]
pub struct Manager {
    /// A client of the management cluster.
    pub client: kube::Client,
    /// Where the webhook runs.
    pub identity: Identity,
    /// The Secret's name (in the identity's namespace).
    pub secret: String,
    /// The ValidatingWebhookConfiguration whose webhooks calling the service get the CA.
    pub configuration: Option<String>,
    /// The files the server serves from.
    pub files: CertificateFiles,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("identity", &self.identity)
            .field("secret", &self.secret)
            .field("configuration", &self.configuration)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// What one pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    /// The decision on the Secret this replica read (`Keep` when another replica renewed it first).
    pub plan: Plan,
    /// The files were rewritten.
    pub files_written: bool,
    /// Webhooks whose `caBundle` was set.
    pub bundles_set: usize,
    /// The served certificate's `notAfter`.
    pub not_after: i64,
}

impl Manager {
    /// One pass at `now` (Unix seconds): the Secret made or renewed if due, the pair written if it
    /// changed, the `caBundle` set where it differs.
    pub async fn reconcile(&self, now: i64) -> Result<Pass, CertificateError> {
        let (plan, material) = self.ensure_secret(now).await?;
        let files_written = self.write_files(&material)?;
        let bundles_set = match &self.configuration {
            Some(name) => self.ensure_bundle(name, &material.bundle_pem()).await?,
            None => 0,
        };
        Ok(Pass { plan, files_written, bundles_set, not_after: material.cert_not_after })
    }

    async fn ensure_secret(&self, now: i64) -> Result<(Plan, Stored), CertificateError> {
        let ns = &self.identity.namespace;
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let dns = self.identity.dns_names();
        let full = format!("{ns}/{}", self.secret);
        for _ in 0..5 {
            let current = api
                .get_opt(&self.secret)
                .await
                .map_err(|source| CertificateError::Api { what: format!("read Secret {full}"), source })?;
            let Some(current) = current else {
                let m = issue(Plan::NewCa, None, &dns, now)?;
                match api.create(&PostParams::default(), &secret_of(ns, &self.secret, &m, None)).await {
                    Ok(_) => return Ok((Plan::NewCa, m)),
                    // Another replica made it first: use theirs.
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(source) => return Err(CertificateError::Api { what: format!("create Secret {full}"), source }),
                }
            };
            let ours = current.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY_LABEL)).map(String::as_str)
                == Some(MANAGED_BY);
            if !ours {
                return Err(CertificateError::NotOurs { namespace: ns.clone(), name: self.secret.clone() });
            }
            let stored = read(&current);
            let decided = plan(stored.as_ref(), &dns, now);
            if let (Plan::Keep, Some(s)) = (decided, stored.clone()) {
                return Ok((Plan::Keep, s));
            }
            let m = issue(decided, stored.as_ref(), &dns, now)?;
            let rv = current.metadata.resource_version.clone();
            match api.replace(&self.secret, &PostParams::default(), &secret_of(ns, &self.secret, &m, rv)).await {
                Ok(_) => return Ok((decided, m)),
                // Another replica renewed it first: read theirs.
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(source) => return Err(CertificateError::Api { what: format!("update Secret {full}"), source }),
            }
        }
        Err(CertificateError::Contended(full))
    }

    /// Writes the pair where the server reads it, each file replaced whole (write, then rename), and
    /// only when it changed.
    fn write_files(&self, m: &Stored) -> Result<bool, CertificateError> {
        let same = |path: &Path, text: &str| std::fs::read(path).is_ok_and(|b| b == text.as_bytes());
        if same(&self.files.cert, &m.cert) && same(&self.files.key, &m.key) {
            return Ok(false);
        }
        // The key first: the server takes a pair only once the key matches the certificate.
        for (path, text) in [(&self.files.key, &m.key), (&self.files.cert, &m.cert)] {
            let fail = |source| CertificateError::Write { path: path.display().to_string(), source };
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, text).map_err(fail)?;
            std::fs::rename(&tmp, path).map_err(fail)?;
        }
        Ok(true)
    }

    /// Sets the `caBundle` of the configuration's webhooks that call the service, where it differs;
    /// returns how many it set.
    async fn ensure_bundle(&self, name: &str, bundle: &str) -> Result<usize, CertificateError> {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let what = |verb: &str| format!("{verb} ValidatingWebhookConfiguration {name}");
        let cfg = api.get(name).await.map_err(|source| CertificateError::Api { what: what("read"), source })?;
        let Identity { namespace, service, .. } = &self.identity;
        let stale: Vec<&str> = cfg
            .webhooks
            .iter()
            .flatten()
            .filter(|w| {
                w.client_config.service.as_ref().is_some_and(|s| &s.name == service && &s.namespace == namespace)
            })
            .filter(|w| w.client_config.ca_bundle.as_ref().is_none_or(|b| b.0 != bundle.as_bytes()))
            .map(|w| w.name.as_str())
            .collect();
        if stale.is_empty() {
            return Ok(0);
        }
        // A strategic merge patch: webhooks merge by name, so only these entries' caBundle changes.
        // ByteString serializes as the base64 the field takes.
        let encoded = ByteString(bundle.as_bytes().to_vec());
        let entries: Vec<serde_json::Value> =
            stale.iter().map(|n| serde_json::json!({"name": n, "clientConfig": {"caBundle": encoded}})).collect();
        let patch = serde_json::json!({"webhooks": entries});
        api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .map_err(|source| CertificateError::Api { what: what("patch the caBundle of"), source })?;
        Ok(stale.len())
    }

    /// Passes every `interval` until `stop`; a failed pass is logged and tried again at the next.
    pub async fn run(self, interval: Duration, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(interval) => {}
            }
            match self.reconcile(unix_now()).await {
                Ok(pass) => log_pass(&self, &pass),
                Err(error) => {
                    tracing::warn!(%error, secret = %self.secret, "certificate check failed; the served pair stays")
                }
            }
        }
    }
}

/// Logs a pass that changed something (one line per decision).
pub fn log_pass(m: &Manager, pass: &Pass) {
    if pass.plan != Plan::Keep || pass.files_written || pass.bundles_set > 0 {
        tracing::info!(
            secret = %m.secret,
            plan = ?pass.plan,
            files_written = pass.files_written,
            ca_bundles_set = pass.bundles_set,
            not_after = pass.not_after,
            "self-managed certificate updated"
        );
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn identity() -> Identity {
        Identity {
            namespace: "karpenter-hub".into(),
            service: "karpenter-hub-webhook".into(),
            cluster_domain: "cluster.local".into(),
        }
    }

    fn fresh() -> Stored {
        issue(Plan::NewCa, None, &identity().dns_names(), NOW).unwrap()
    }

    /// Whether a TLS client trusting `bundle` accepts `cert` for the Service's name at `now`.
    fn trusted(bundle: &str, cert: &str, now: i64) -> bool {
        use rustls::client::danger::ServerCertVerifier;
        let mut roots = rustls::RootCertStore::empty();
        for der in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
            roots.add(der.unwrap()).unwrap();
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider).build().unwrap();
        let leaf = CertificateDer::pem_slice_iter(cert.as_bytes()).next().unwrap().unwrap();
        let name = rustls::pki_types::ServerName::try_from("karpenter-hub-webhook.karpenter-hub.svc").unwrap();
        let at = rustls::pki_types::UnixTime::since_unix_epoch(Duration::from_secs(u64::try_from(now).unwrap()));
        verifier.verify_server_cert(&leaf, &[], &name, &[], at).is_ok()
    }

    #[test]
    fn the_names_the_api_server_calls() {
        assert_eq!(
            identity().dns_names(),
            [
                "karpenter-hub-webhook",
                "karpenter-hub-webhook.karpenter-hub",
                "karpenter-hub-webhook.karpenter-hub.svc",
                "karpenter-hub-webhook.karpenter-hub.svc.cluster.local"
            ]
        );
    }

    #[test]
    fn renewals_come_before_expiry() {
        let dns = identity().dns_names();
        assert_eq!(plan(None, &dns, NOW), Plan::NewCa);
        let s = fresh();
        assert_eq!(plan(Some(&s), &dns, NOW), Plan::Keep);
        // The serving certificate: renewed with 30 days left, not before.
        let leaf_due = s.cert_not_after - LEAF_RENEW_BEFORE;
        assert_eq!(plan(Some(&s), &dns, leaf_due - 1), Plan::Keep);
        assert_eq!(plan(Some(&s), &dns, leaf_due + 1), Plan::NewCertificate);
        // Other names (a renamed Service): a new certificate.
        assert_eq!(plan(Some(&s), &dns[..2], NOW), Plan::NewCertificate);
        // The CA: replaced with a year left.
        let ca_due = s.ca_bundle[0].1 - CA_RENEW_BEFORE;
        let mut later = s.clone();
        later.cert_not_after = ca_due + LEAF_VALIDITY;
        assert_eq!(plan(Some(&later), &dns, ca_due + 1), Plan::NewCa);
    }

    #[test]
    fn material_round_trips_through_the_secret_and_serves() {
        let s = fresh();
        let secret = secret_of("karpenter-hub", "karpenter-hub-webhook-tls", &s, None);
        let back = read(&secret).unwrap();
        assert_eq!(back.dns_names, s.dns_names);
        assert_eq!(back.ca_bundle.len(), 1);
        // notAfter read from the certificates agrees with the one recorded (to the second).
        assert_eq!(back.cert_not_after, s.cert_not_after);
        assert_eq!(back.ca_bundle[0].1, s.ca_bundle[0].1);
        assert_eq!(plan(Some(&back), &identity().dns_names(), NOW), Plan::Keep);
        // The pair is one rustls serves.
        let files = CertificateFiles { cert: "tls.crt".into(), key: "tls.key".into() };
        let provider = rustls::crypto::ring::default_provider();
        crate::tls::certified_key(&files, s.cert.as_bytes(), s.key.as_bytes(), &provider).unwrap();
        // A broken or oversized key is unreadable: made anew.
        let mut broken = secret.clone();
        broken.data.as_mut().unwrap().insert(CA_CRT.into(), ByteString(b"not a certificate".to_vec()));
        assert!(read(&broken).is_none());
        let mut big = secret;
        big.data.as_mut().unwrap().insert(TLS_CRT.into(), ByteString(vec![b'a'; 2 * 1024 * 1024]));
        assert!(read(&big).is_none());
    }

    #[test]
    fn a_new_certificate_keeps_the_ca_and_a_new_ca_keeps_the_old_one_trusted() {
        let dns = identity().dns_names();
        let s = fresh();
        let renewed = issue(Plan::NewCertificate, Some(&s), &dns, NOW + 70 * DAY).unwrap();
        assert_eq!(renewed.ca_bundle, s.ca_bundle, "same CA");
        assert!(trusted(&s.bundle_pem(), &s.cert, NOW) && trusted(&s.bundle_pem(), &renewed.cert, NOW + 70 * DAY));
        assert!(!trusted(&s.bundle_pem(), &s.cert, s.cert_not_after + 1), "expired");
        assert_eq!(renewed.ca_key, s.ca_key);
        assert_ne!(renewed.cert, s.cert);
        let rotated = issue(Plan::NewCa, Some(&s), &dns, NOW + 9 * 365 * DAY + DAY).unwrap();
        assert_eq!(rotated.ca_bundle.len(), 2, "the new CA, then the old until it expires");
        assert_eq!(rotated.ca_bundle[1], s.ca_bundle[0]);
        assert_ne!(rotated.ca_key, s.ca_key);
        // Both the new pair and a replica's old one are trusted by the new bundle.
        let when = NOW + 9 * 365 * DAY + DAY;
        let old_leaf = issue(Plan::NewCertificate, Some(&s), &dns, when).unwrap();
        assert!(trusted(&rotated.bundle_pem(), &rotated.cert, when));
        assert!(trusted(&rotated.bundle_pem(), &old_leaf.cert, when));
        assert!(!trusted(&s.bundle_pem(), &rotated.cert, when), "the old bundle alone does not trust the new CA");
        // Once the old CA expired, the next renewal drops it.
        let after = s.ca_bundle[0].1 + 1;
        let mut aged = rotated.clone();
        aged.cert_not_after = after + LEAF_VALIDITY;
        assert_eq!(plan(Some(&aged), &dns, after), Plan::NewCertificate);
        let pruned = issue(Plan::NewCertificate, Some(&aged), &dns, after).unwrap();
        assert_eq!(pruned.ca_bundle, rotated.ca_bundle[..1]);
    }
}
