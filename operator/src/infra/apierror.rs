//! Kubernetes API errors as a person reads them. kube's own `Display` of an API refusal appends the
//! whole `Status { … }` in Rust debug form; logs and error messages use [`plain`] instead.
//! Must not: hide the API's own message, which says what to fix, nor show the credentials of a
//! URL in it (kube's errors can name a URL: [`crate::infra::kubeconfig::redact_urls`]).

use std::fmt;

/// `e` without Rust debug formatting: for an API refusal, the server's message and its HTTP code
/// and reason (`namespaces "x" not found (404 NotFound)`); anything else as kube prints it.
pub fn plain(e: &kube::Error) -> Plain<'_> {
    Plain(e)
}

/// `e` of a watch, plainly (see [`plain`]).
pub fn plain_watch(e: &kube::runtime::watcher::Error) -> PlainWatch<'_> {
    PlainWatch(e)
}

/// See [`plain_watch`].
#[derive(Debug, Clone, Copy)]
pub struct PlainWatch<'a>(pub &'a kube::runtime::watcher::Error);

impl fmt::Display for PlainWatch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use kube::runtime::watcher::Error;
        match self.0 {
            Error::InitialListFailed(e) => write!(f, "listing failed: {}", plain(e)),
            Error::WatchStartFailed(e) => write!(f, "starting the watch failed: {}", plain(e)),
            Error::WatchFailed(e) => write!(f, "the watch failed: {}", plain(e)),
            other => write!(f, "{other}"),
        }
    }
}

/// See [`plain`].
#[derive(Debug, Clone, Copy)]
pub struct Plain<'a>(pub &'a kube::Error);

impl fmt::Display for Plain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            kube::Error::Api(s) => {
                let message = if s.message.is_empty() { "refused" } else { s.message.as_str() };
                let message = crate::infra::kubeconfig::redact_urls(message);
                // kube's placeholder when the body was not a Status (e.g. "404 page not found").
                let reason = if s.reason == "Failed to parse error data" { "" } else { s.reason.as_str() };
                match (s.code, reason.is_empty()) {
                    (0, true) => write!(f, "{message}"),
                    (0, false) => write!(f, "{message} ({reason})"),
                    (code, true) => write!(f, "{message} (HTTP {code})"),
                    (code, false) => write!(f, "{message} ({code} {reason})"),
                }
            }
            other => write!(f, "{}", crate::infra::kubeconfig::redact_urls(&other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_refusal_reads_as_its_message_code_and_reason_without_debug_formatting() {
        let status = kube::core::Status::failure("namespaces \"karpenter-hub\" not found", "NotFound").with_code(404);
        let e = kube::Error::Api(status.boxed());
        assert!(e.to_string().contains("Status {"), "kube's own Display dumps the Status: {e}");
        let shown = plain(&e).to_string();
        assert_eq!(shown, "namespaces \"karpenter-hub\" not found (404 NotFound)");
        // A body that was no Status (an unserved group): kube's placeholder reason is left out.
        let status = kube::core::Status::failure("404 page not found", "Failed to parse error data").with_code(404);
        assert_eq!(plain(&kube::Error::Api(status.boxed())).to_string(), "404 page not found (HTTP 404)");
    }
}
