//! `StreamStateLayer`: the commit point, flushed bytes, and a clean end after
//! failures.
//!
//! The layer wraps every `text/event-stream` response body (other responses
//! pass through untouched) and tracks the stream's [`StreamStatus`]: preamble
//! (no model output yet), committed (model output has been yielded),
//! finished, failed or cancelled, with the bytes flushed to the client, the
//! output events, the time of the first output and the last chunk identity.
//! A [`StreamState`] handle in the response extensions reads it live.
//!
//! When a stream fails — the upstream body errors, an in-band error event
//! arrives, the stream ends without a finish reason or `[DONE]`, too many
//! malformed chunks arrive, or no frame comes within the idle timeout — the
//! upstream's bytes stop and the client gets one terminal chunk in the
//! stream's own identity (`finish_reason: "error"` and an `error` object with
//! the phase and the bytes and output events sent before the failure), then
//! `data: [DONE]`. Nothing from another source is ever appended. An event cut
//! in the middle is never half-forwarded: incomplete events are held back
//! until their blank line arrives.
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, StreamBody};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_llm_failover::stream::{StreamStatus, StreamState, StreamStateLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // An upstream that sends one token, then fails.
//! let upstream = tower::service_fn(|_req: Request<()>| async {
//!     let frames: Vec<Result<http_body::Frame<Bytes>, std::io::Error>> = vec![
//!         Ok(http_body::Frame::data(Bytes::from_static(
//!             b"data: {\"id\":\"c1\",\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
//!         ))),
//!         Err(std::io::Error::other("connection reset")),
//!     ];
//!     let body = StreamBody::new(futures_util::stream::iter(frames));
//!     Ok::<_, std::convert::Infallible>(
//!         Response::builder()
//!             .header("content-type", "text/event-stream")
//!             .body(body)
//!             .unwrap(),
//!     )
//! });
//! let service = ServiceBuilder::new()
//!     .layer(StreamStateLayer::new())
//!     .service(upstream);
//!
//! let response = service.oneshot(Request::new(())).await.unwrap();
//! let state = response.extensions().get::<StreamState>().unwrap().clone();
//! let bytes = response.into_body().collect().await.unwrap().to_bytes();
//! let text = String::from_utf8(bytes.to_vec()).unwrap();
//!
//! assert!(text.starts_with("data: {\"id\":\"c1\""));
//! assert!(text.contains("\"finish_reason\":\"error\""));
//! assert!(text.ends_with("data: [DONE]\n\n"));
//! assert_eq!(state.status(), StreamStatus::Failed);
//! assert_eq!(state.snapshot().output_events, 1);
//! # }
//! ```

pub(crate) mod commit;
mod future;
mod layer;
mod policy;
mod service;

pub use commit::{
    CommitWindow, StreamFailure, StreamIdentity, StreamSnapshot, StreamState, StreamStateBody,
    StreamStatus,
};
pub use future::ResponseFuture;
pub use layer::StreamStateLayer;
pub use policy::StreamPolicy;
pub use service::StreamStateService;
