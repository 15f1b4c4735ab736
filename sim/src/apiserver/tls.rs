//! The emulator's TLS material: a per-instance CA (rcgen) and a server certificate for
//! `127.0.0.1`/`localhost` signed by it, and the rustls server configuration (ring provider).
//! Must not do: anything with client certificates (clients authenticate with bearer tokens).

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::StartError;

/// The CA certificate (PEM, handed to clients) and the server's rustls configuration.
pub(crate) struct Tls {
    pub ca_pem: String,
    pub server_config: Arc<rustls::ServerConfig>,
}

fn tls_err(e: impl std::fmt::Display) -> StartError {
    StartError::Tls(e.to_string())
}

/// Generates a fresh CA and server certificate for `cluster`.
pub(crate) fn generate(cluster: &str) -> Result<Tls, StartError> {
    let ca_key = KeyPair::generate().map_err(tls_err)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(tls_err)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, format!("{cluster}-ca"));
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(tls_err)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let server_key = KeyPair::generate().map_err(tls_err)?;
    let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).map_err(tls_err)?;
    params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    let server_cert = params.signed_by(&server_key, &issuer).map_err(tls_err)?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = vec![CertificateDer::from(server_cert.der().to_vec()), CertificateDer::from(ca_cert.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
    let mut server_config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(tls_err)?;
    server_config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Tls { ca_pem: ca_cert.pem(), server_config: Arc::new(server_config) })
}
