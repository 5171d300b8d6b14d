//! BudgetLayer alone around a fake LLM service.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use tokio::time::{Instant, advance, sleep};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_llm_failover::{
    Cost, DeadlineExceeded, budget::BudgetLayer, budget::Pricing, budget::ReportedUsage,
    budget::TurnBudget, budget::TurnLimits,
};
use tower_llm_failover::{FailureClass, Phase};

#[path = "support/budget_upstream.rs"]
mod budget_upstream;
use budget_upstream::{Upstream, refusal, request};

#[tokio::test(start_paused = true)]
async fn estimated_usage_marks_the_spend() {
    let upstream = Upstream {
        usage: Some(ReportedUsage::estimated(1_000_000, 0)),
        ..Upstream::default()
    };
    let svc = BudgetLayer::new()
        .pricing(Pricing::per_million_usd(1.0, 1.0))
        .layer_service(upstream);
    let res = svc.oneshot(request()).await.unwrap();
    let turn = TurnBudget::from_extensions(res.extensions()).unwrap();
    assert_eq!(turn.spent(), (Cost::from_usd(1.0), true));
}

/// Sets a flag when dropped, to see the inner call abandoned.
struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_head_ends_at_the_deadline() {
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    let upstream = tower::service_fn(move |_req: Request<Full<Bytes>>| {
        let guard = DropFlag(flag.clone());
        async move {
            sleep(Duration::from_secs(30)).await;
            drop(guard);
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    });
    let svc = ServiceBuilder::new()
        .layer(BudgetLayer::new().deadline(Duration::from_secs(2)))
        .service(upstream);

    let start = Instant::now();
    let res = svc.oneshot(request()).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert!(
        dropped.load(Ordering::SeqCst),
        "the inner call was not dropped"
    );
    let (status, json) = refusal(res).await;
    assert_eq!(status, 504);
    assert_eq!(json["error"]["code"], "turn_deadline_exceeded");
    assert_eq!(json["error"]["type"], "server_error");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(message.contains("passed in phase head"), "{message}");
    assert!(message.contains("0 body bytes"), "{message}");
}

#[tokio::test(start_paused = true)]
async fn a_stalled_body_ends_with_a_deadline_error_at_the_deadline() {
    let upstream = tower::service_fn(|_req: Request<Full<Bytes>>| async {
        // Two chunks a second apart, then silence.
        let chunks = stream::unfold(0u32, |n| async move {
            match n {
                0 => Some((
                    Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"data: {\"a\":1}\n\n"))),
                    1,
                )),
                1 => {
                    sleep(Duration::from_secs(1)).await;
                    Some((
                        Ok(Frame::data(Bytes::from_static(b"data: {\"b\":2}\n\n"))),
                        2,
                    ))
                }
                _ => {
                    sleep(Duration::from_secs(3600)).await;
                    None
                }
            }
        });
        Ok::<_, Infallible>(Response::new(StreamBody::new(chunks)))
    });
    let svc = ServiceBuilder::new()
        .layer(BudgetLayer::new().deadline(Duration::from_secs(5)))
        .service(upstream);

    let start = Instant::now();
    // Holds a timer, so it is !Unpin like tower-http's TimeoutBody.
    let mut body = std::pin::pin!(svc.oneshot(request()).await.unwrap().into_body());
    let mut received = Vec::new();
    let err = loop {
        match body.frame().await {
            Some(Ok(frame)) => received.extend_from_slice(&frame.into_data().unwrap()),
            Some(Err(err)) => break err,
            None => panic!("body ended without the deadline error"),
        }
    };
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(&received[..], b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\n");
    let deadline = DeadlineExceeded::find_in(err.as_ref()).expect("a deadline error");
    assert_eq!(deadline.phase, Phase::Committed);
    assert_eq!(deadline.body_bytes, received.len() as u64);
    assert_eq!(deadline.classification().class, FailureClass::Timeout);
    // The body is over: no more frames, and it says so.
    assert!(http_body::Body::is_end_stream(&body));
    assert!(body.frame().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_body_stalled_before_any_byte_reports_preamble() {
    let upstream = tower::service_fn(|_req: Request<Full<Bytes>>| async {
        let silent = stream::pending::<Result<Frame<Bytes>, Infallible>>();
        Ok::<_, Infallible>(Response::new(StreamBody::new(silent)))
    });
    let svc = BudgetLayer::new()
        .deadline(Duration::from_secs(3))
        .layer_service(upstream);
    let body = svc.oneshot(request()).await.unwrap().into_body();
    let err = body.collect().await.unwrap_err();
    assert_eq!(
        DeadlineExceeded::find_in(err.as_ref()).map(|deadline| deadline.phase),
        Some(Phase::Preamble)
    );
}

#[tokio::test(start_paused = true)]
async fn an_expired_turn_is_refused_before_the_call() {
    let upstream = Upstream::default();
    let svc = BudgetLayer::new().layer_service(upstream.clone());
    let turn = TurnLimits {
        deadline: Duration::from_secs(1),
        ..TurnLimits::new()
    }
    .start();
    advance(Duration::from_secs(1)).await;
    let mut req = request();
    req.extensions_mut().insert(turn);
    let res = svc.oneshot(req).await.unwrap();
    let (status, json) = refusal(res).await;
    assert_eq!(status, 504);
    assert_eq!(json["error"]["code"], "turn_deadline_exceeded");
    assert_eq!(upstream.calls.load(Ordering::SeqCst), 0);
}

/// `Layer::layer` without importing the trait in every test.
trait LayerExt {
    fn layer_service<S>(&self, inner: S) -> tower_llm_failover::budget::Budget<S>;
}
impl LayerExt for BudgetLayer {
    fn layer_service<S>(&self, inner: S) -> tower_llm_failover::budget::Budget<S> {
        tower::Layer::layer(self, inner)
    }
}
