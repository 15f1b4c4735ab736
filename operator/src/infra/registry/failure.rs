//! What a failed request to a workload cluster tells whom (hub.md, "What a failed connection
//! tells whom").
//!
//! The server of a kubeconfig is whatever the tenant who wrote the Secret chose, so every request
//! the hub sends there is one the tenant steered: the hub must not become a window onto what
//! answers (server-side request forgery). Two readers, two texts:
//!
//! - the tenant (the NodePool's `ClusterReachable` message, the events on the NodePool and on the
//!   Secret): the hub's own words, the request it sent (`GET /version`) and the HTTP status code
//!   when there was one — never a byte the server chose (body, `Status` message or reason, a
//!   certificate's names). Below HTTP, every failure reads the same: DNS, connection refused,
//!   reset, timed out, TLS handshake or certificate. Telling them apart is what a port scanner
//!   needs (refused = closed, timed out = filtered, TLS failed = open but not this server), and
//!   the tenant can check their own kubeconfig with `kubectl` from where they are;
//! - the hub's operator (the hub's log): the [`Cause`] too, still in the hub's own words, at the
//!   level of the line that reports the failure; the raw error chain only at debug, cut and
//!   escaped ([`crate::infra::apierror::remote`]).
//!
//! Owns: classifying a client error into a [`Cause`], and the phase and message a failed step
//! shows. Pure. Must not: copy anything the server sent into a message.

use std::fmt;

use super::{ClusterStatus, Phase};

/// A request of the connection sequence, as the hub names it in messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// The health probe.
    Version,
    /// Whether NodeGroups are served.
    NodeGroupApi,
    /// The cluster's identity.
    KubeSystem,
    /// A watch cache's list or watch of this kind (one of the hub's own types).
    Watch(String),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Version => f.write_str("GET /version"),
            Step::NodeGroupApi => write!(f, "GET /apis/{}", super::connection::NODEGROUP_API),
            Step::KubeSystem => f.write_str("GET /api/v1/namespaces/kube-system"),
            Step::Watch(kind) => write!(f, "the list and watch of {kind}s"),
        }
    }
}

/// Why a request failed, in the hub's own words: for the hub's log. Conditions and events only
/// say whether it was an HTTP status (and which) or none ([`Cause::is_transport`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Nothing listens at that address (TCP connection refused).
    Refused,
    /// No answer in time: the connection or the request timed out (a firewall dropping packets
    /// looks like this too).
    TimedOut,
    /// The connection was reset or closed before an answer.
    Closed,
    /// TLS: the server's certificate is not signed by the kubeconfig's CA.
    UntrustedCertificate,
    /// TLS: the certificate does not name the server (its host or `tls-server-name`).
    WrongName,
    /// TLS: the certificate has expired or is not valid yet.
    CertificateDates,
    /// TLS: any other handshake failure (no TLS server there, no common protocol, ...).
    Tls,
    /// Any other failure before an HTTP answer (DNS among them: the resolver's error has no kind
    /// of its own).
    Transport,
    /// The server answered with this HTTP status (not 2xx).
    Http(u16),
    /// The server answered 2xx with a body that is not the Kubernetes JSON asked for.
    NotKubernetes,
    /// The hub's own client refused before sending (e.g. fenced in sharded mode).
    Client,
}

impl Cause {
    /// The cause of a client error, found by walking the error chain (kube wraps transport errors
    /// in `Service`, hyper and `io::Error` layers, a TLS failure as a `rustls::Error` in an
    /// `io::Error`).
    pub fn of(e: &kube::Error) -> Cause {
        match e {
            kube::Error::Api(s) if (200..300).contains(&s.code) => Cause::NotKubernetes,
            kube::Error::Api(s) => Cause::Http(s.code),
            kube::Error::SerdeError(_) | kube::Error::FromUtf8(_) | kube::Error::LinesCodecMaxLineLengthExceeded => {
                Cause::NotKubernetes
            }
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
                let mut found = Cause::Transport;
                let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
                while let Some(s) = source {
                    if s.is::<crate::infra::fence::Fenced>() {
                        return Cause::Client;
                    }
                    if let Some(c) = s.downcast_ref::<rustls::Error>().map(tls_cause) {
                        return c;
                    }
                    let mut next = s.source();
                    if let Some(io) = s.downcast_ref::<std::io::Error>() {
                        // `io::Error::source` skips the error it wraps (a TLS failure is a
                        // `rustls::Error` in one): walk into it instead.
                        if let Some(inner) = io.get_ref() {
                            next = Some(inner);
                        }
                        found = match io.kind() {
                            std::io::ErrorKind::ConnectionRefused => Cause::Refused,
                            std::io::ErrorKind::TimedOut => Cause::TimedOut,
                            std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::ConnectionAborted
                            | std::io::ErrorKind::BrokenPipe
                            | std::io::ErrorKind::UnexpectedEof => Cause::Closed,
                            _ => found,
                        };
                    }
                    source = next;
                }
                found
            }
            _ => Cause::Client,
        }
    }

    /// No HTTP answer: the tenant is told no more than that (see the module's comment).
    pub fn is_transport(self) -> bool {
        !matches!(self, Cause::Http(_) | Cause::NotKubernetes | Cause::Client)
    }
}

fn tls_cause(e: &rustls::Error) -> Cause {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer | C::BadSignature => Cause::UntrustedCertificate,
            C::NotValidForName | C::NotValidForNameContext { .. } => Cause::WrongName,
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. } => {
                Cause::CertificateDates
            }
            _ => Cause::Tls,
        },
        _ => Cause::Tls,
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Refused => f.write_str("connection refused (nothing listens there)"),
            Cause::TimedOut => f.write_str("timed out (no answer: down, or a firewall drops the packets)"),
            Cause::Closed => f.write_str("connection reset or closed before an answer"),
            Cause::UntrustedCertificate => f.write_str(
                "TLS: the server's certificate is not signed by the kubeconfig's certificate-authority-data",
            ),
            Cause::WrongName => f.write_str("TLS: the server's certificate is not valid for the server's name"),
            Cause::CertificateDates => f.write_str("TLS: the server's certificate has expired or is not valid yet"),
            Cause::Tls => f.write_str("TLS handshake failed (is it a TLS server?)"),
            Cause::Transport => f.write_str("no connection (DNS or network; the debug log has the details)"),
            Cause::Http(code) => write!(f, "HTTP {code}"),
            Cause::NotKubernetes => f.write_str("the answer is not a Kubernetes API response"),
            Cause::Client => f.write_str("the hub's client refused to send the request"),
        }
    }
}

/// The phase and message of a failed `step` against `server` (the kubeconfig's own URL, which
/// the tenant wrote), with the cause kept for the log.
pub(crate) fn status(server: &str, step: &Step, cause: Cause) -> ClusterStatus {
    let (phase, message) = match cause {
        Cause::Http(code @ (401 | 403)) => (
            Phase::Unauthorized,
            format!(
                "{server} refused the kubeconfig's credentials at {step} (HTTP {code}); rotate the token in the Secret"
            ),
        ),
        Cause::Http(code) => (Phase::Unreachable, format!("{server} answered {step} with HTTP {code}")),
        Cause::NotKubernetes => (
            Phase::Unreachable,
            format!("{server} answered {step} with something that is not a Kubernetes API response: is it one?"),
        ),
        Cause::Client => (Phase::Unreachable, format!("the hub's client could not send {step} to {server}")),
        _ => (Phase::Unreachable, no_answer(server, step)),
    };
    ClusterStatus { phase, message, cause: Some(cause) }
}

/// The hub's own timeout of `step` ran out.
pub(crate) fn timed_out(server: &str, step: &Step) -> ClusterStatus {
    ClusterStatus { phase: Phase::Unreachable, message: no_answer(server, step), cause: Some(Cause::TimedOut) }
}

fn no_answer(server: &str, step: &Step) -> String {
    format!(
        "no answer from {server} to {step}: the connection, DNS or the TLS handshake failed, or it timed out \
         (which one is in the hub's log); check the kubeconfig's server and certificate-authority-data"
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const MARKER: &str = "INTERNAL-ADMIN-PANEL: db_password=hunter2-marker";

    fn service(e: impl std::error::Error + Send + Sync + 'static) -> kube::Error {
        kube::Error::Service(Box::new(e))
    }

    fn io(kind: std::io::ErrorKind) -> kube::Error {
        service(std::io::Error::new(kind, MARKER))
    }

    fn tls(e: rustls::Error) -> kube::Error {
        service(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    #[test]
    fn transport_errors_are_told_apart_for_the_log() {
        use rustls::CertificateError as C;
        use std::io::ErrorKind as K;
        assert_eq!(Cause::of(&io(K::ConnectionRefused)), Cause::Refused);
        assert_eq!(Cause::of(&io(K::TimedOut)), Cause::TimedOut);
        assert_eq!(Cause::of(&io(K::ConnectionReset)), Cause::Closed);
        assert_eq!(Cause::of(&io(K::Other)), Cause::Transport);
        assert_eq!(Cause::of(&tls(rustls::Error::InvalidCertificate(C::UnknownIssuer))), Cause::UntrustedCertificate);
        let wrong_name = C::NotValidForNameContext {
            expected: rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap().to_owned(),
            presented: vec!["hunter2-marker.internal".into()],
        };
        assert_eq!(Cause::of(&tls(rustls::Error::InvalidCertificate(wrong_name))), Cause::WrongName);
        assert_eq!(Cause::of(&tls(rustls::Error::InvalidCertificate(C::Expired))), Cause::CertificateDates);
        assert_eq!(Cause::of(&tls(rustls::Error::HandshakeNotComplete)), Cause::Tls);
        // Wrapped deeper, as hyper-util wraps its connect errors.
        let deep = service(std::io::Error::other(std::io::Error::new(K::ConnectionRefused, "x")));
        assert_eq!(Cause::of(&deep), Cause::Refused);
    }

    #[test]
    fn http_answers_keep_their_code_and_nothing_else() {
        let body = kube::core::Status::failure(MARKER, "Failed to parse error data").with_code(500);
        assert_eq!(Cause::of(&kube::Error::Api(body.boxed())), Cause::Http(500));
        let not_json = serde_json::from_str::<serde_json::Value>(MARKER).unwrap_err();
        assert_eq!(Cause::of(&kube::Error::SerdeError(not_json)), Cause::NotKubernetes);
        let wrong_shape =
            serde_json::from_str::<k8s_openapi::apimachinery::pkg::version::Info>(&format!("{MARKER:?}")).unwrap_err();
        assert!(wrong_shape.to_string().contains("hunter2"), "serde quotes the value: the reason to hide it");
        assert_eq!(Cause::of(&kube::Error::SerdeError(wrong_shape)), Cause::NotKubernetes);
    }

    /// Whatever the server sent, the tenant's message holds the hub's words, the step, the
    /// server the tenant wrote and at most the status code; below HTTP, one message for all.
    #[test]
    fn a_message_never_carries_what_the_server_sent_and_transport_failures_read_alike() {
        use std::io::ErrorKind as K;
        let server = "https://10.0.0.7:8443";
        let errors = [
            kube::Error::Api(kube::core::Status::failure(MARKER, "Failed to parse error data").with_code(500).boxed()),
            kube::Error::Api(kube::core::Status::failure(MARKER, MARKER).with_code(401).boxed()),
            kube::Error::SerdeError(serde_json::from_str::<serde_json::Value>(MARKER).unwrap_err()),
            io(K::ConnectionRefused),
            io(K::TimedOut),
            tls(rustls::Error::General(MARKER.into())),
        ];
        let mut transport = Vec::new();
        for step in [Step::Version, Step::NodeGroupApi, Step::KubeSystem, Step::Watch("Pod".into())] {
            for e in &errors {
                let s = status(server, &step, Cause::of(e));
                assert!(!s.message.contains("hunter2") && !s.message.contains("ADMIN"), "{}", s.message);
                assert!(s.message.contains(server) && s.message.contains(&step.to_string()), "{}", s.message);
                if s.cause.is_some_and(Cause::is_transport) {
                    transport.push(s.message);
                }
            }
            transport.push(timed_out(server, &step).message);
            transport.dedup();
            assert_eq!(transport.len(), 1, "refused, timed out and TLS read alike: {transport:?}");
            transport.clear();
        }
        let s = status(server, &Step::Version, Cause::Http(401));
        assert_eq!(s.phase, Phase::Unauthorized);
        assert!(s.message.contains("HTTP 401"), "{}", s.message);
        assert_eq!(status(server, &Step::Version, Cause::Http(403)).phase, Phase::Unauthorized);
        let s = status(server, &Step::KubeSystem, Cause::Http(500));
        assert_eq!(
            (s.phase, s.message.as_str()),
            (Phase::Unreachable, "https://10.0.0.7:8443 answered GET /api/v1/namespaces/kube-system with HTTP 500")
        );
    }
}
