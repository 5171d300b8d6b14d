//! A chat request that names its turn: the turn id its lines are logged
//! under.

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use tower_llm_failover::budget::TurnLimits;

/// A one-message chat request (a stream when `stream`) whose turn budget,
/// in its extensions, carries `turn_id`.
pub(crate) fn chat(stream: bool, turn_id: &str) -> Request<Full<Bytes>> {
    let body = format!(
        r#"{{"model":"m","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let mut request = Request::post("/v1/chat/completions")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    request
        .extensions_mut()
        .insert(TurnLimits::new().start_with_turn_id(turn_id.into()));
    request
}
