//! Any bytes posted to any validation route: the request path answers with a 400 or a well-formed
//! AdmissionReview response echoing the uid, and never panics.
//!
//! The first byte picks the route; the rest is the body.

#![no_main]

use libfuzzer_sys::fuzz_target;
use webhook::review::{Kind, review_offline};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else { return };
    let kind = Kind::ALL[usize::from(selector) % Kind::ALL.len()];
    if let Ok(answer) = review_offline(kind, body) {
        assert!(!answer.uid.is_empty(), "answered a review without uid");
        assert_eq!(answer.allowed, answer.message.is_none(), "a denial needs a message, an allowance none");
        let response: serde_json::Value = match serde_json::from_slice(&answer.to_json()) {
            Ok(v) => v,
            Err(e) => panic!("the response is not JSON: {e}"),
        };
        assert_eq!(response["response"]["uid"].as_str(), Some(answer.uid.as_str()));
    }
});
