//! Kubernetes API errors as a person reads them. kube's own `Display` of an API refusal appends the
//! whole `Status { … }` in Rust debug form; logs and error messages use [`plain`] instead. And text
//! a remote peer chose, bounded for a debug log line ([`remote`], [`chain`]).
//! Must not: hide the API's own message, which says what to fix, where the API is the management
//! cluster's; show the credentials of a URL in it (kube's errors can name a URL:
//! [`crate::infra::kubeconfig::redact_urls`]); nor let a workload cluster's text reach a condition
//! or an event (nothing here does: [`plain`] is for the management API and logs, [`remote`] for
//! debug logs only, [`in_own_words`] for conditions an answer of either cluster may cause).

use std::fmt;

/// `e` without Rust debug formatting: for an API refusal, the server's message and its HTTP code
/// and reason (`namespaces "x" not found (404 NotFound)`); anything else as kube prints it.
pub fn plain(e: &kube::Error) -> Plain<'_> {
    Plain(e)
}

/// `e` in the hub's own words, for a condition or an event that a workload cluster's answer may
/// have caused: the HTTP status and nothing the server wrote (its message, reason or body could be
/// any text a hostile server chose, docs/security.md); the rest goes to the log through [`plain`].
pub fn in_own_words(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code != 0 => {
            format!("the API answered HTTP {} (the hub's log has its message)", s.code)
        }
        _ => {
            "the request got no answer: the connection, DNS, the TLS handshake or a timeout (the hub's log says which)"
                .to_string()
        }
    }
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

/// At most this many bytes of a remote peer's text reach a log line.
pub const REMOTE_TEXT_MAX: usize = 256;

/// Text a remote peer chose (a response body, a `Status` message, a certificate's names), fit for a
/// debug log line: cut to [`REMOTE_TEXT_MAX`] bytes on a character boundary (the length it had is
/// said) and control characters escaped, so it can neither flood the log nor forge a line of it.
/// Only for debug logs: a condition or an event never carries remote text at all.
pub fn remote(text: &str) -> Remote<'_> {
    Remote(text)
}

/// See [`remote`].
#[derive(Debug, Clone, Copy)]
pub struct Remote<'a>(pub &'a str);

impl fmt::Display for Remote<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        let mut written = 0;
        for c in self.0.chars() {
            if written + c.len_utf8() > REMOTE_TEXT_MAX {
                return write!(f, "… ({} bytes in all)", self.0.len());
            }
            written += c.len_utf8();
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

/// `e` and every error it wraps, `: `-separated: the whole story of a transport failure (kube's own
/// `Display` of a connection error stops at "client error (Connect)"). Its parts may be remote text
/// (a certificate's names), so print it through [`remote`].
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        // Some errors repeat their source's text in their own.
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_its_own_words_the_hub_repeats_only_the_status_code() {
        let status = kube::core::Status::failure("INTERNAL-ADMIN-PANEL: db_password=x", "ADMIN-PANEL").with_code(500);
        let shown = in_own_words(&kube::Error::Api(status.boxed()));
        assert_eq!(shown, "the API answered HTTP 500 (the hub's log has its message)");
        let no_answer = kube::Error::Service("INTERNAL-ADMIN-PANEL".into());
        assert!(!in_own_words(&no_answer).contains("ADMIN"), "{}", in_own_words(&no_answer));
    }

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

    #[test]
    fn remote_text_is_cut_and_cannot_forge_a_log_line() {
        let forged = "boom\n2026-01-01T00:00:00Z  INFO forged line\u{1b}[31m";
        let shown = remote(forged).to_string();
        assert!(!shown.contains('\n') && !shown.contains('\u{1b}'), "{shown}");
        assert!(shown.starts_with("boom\\n2026") && shown.contains("\\u{1b}"), "{shown}");
        let long = "é".repeat(1000);
        let shown = remote(&long).to_string();
        assert!(shown.starts_with(&"é".repeat(REMOTE_TEXT_MAX / 2)), "cut on a character boundary");
        assert!(shown.ends_with("… (2000 bytes in all)"), "{shown}");
        assert!(shown.len() < REMOTE_TEXT_MAX + 30);
        assert_eq!(remote("short").to_string(), "short");
    }

    #[test]
    fn a_chain_says_what_each_wrapped_error_says_once() {
        let inner = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let e = kube::Error::Service(Box::new(inner));
        assert_eq!(chain(&e), "ServiceError: connection refused");
    }
}
