//! BudgetLayer's turns as the layers inside draw on them: handles of one
//! turn are one turn, and attempts and spend are counted by whoever makes
//! them (the turn's attempt and spend methods are the crate's own).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tokio::time::{Instant, advance};
use tower::{Service, ServiceExt};

use crate::Cost;
use crate::budget::{
    Budget, BudgetExhausted, BudgetLayer, Pricing, ReportedUsage, TurnBudget, TurnLimits,
};

#[path = "../../tests/support/budget_upstream.rs"]
mod budget_upstream;
use budget_upstream::{Upstream, refusal, request};

#[tokio::test(start_paused = true)]
async fn a_fresh_turn_is_made_and_handed_inward_and_outward() {
    let upstream = Upstream::default();
    let svc = BudgetLayer::new()
        .limits(TurnLimits {
            max_attempts: 2,
            ..TurnLimits::new()
        })
        .layer_service(upstream.clone());
    let res = svc.oneshot(request()).await.unwrap();
    let outward = TurnBudget::from_extensions(res.extensions()).unwrap();
    let inward = upstream.seen.lock().unwrap()[0].clone();
    assert!(outward.ptr_eq(&inward));
    // The body carries the same turn, to end it at that turn's deadline.
    assert!(res.body().budget().ptr_eq(&inward));
    assert_eq!(outward.attempts_used(), 1);
    assert_eq!(outward.turn_id().as_str().len(), 16);
    assert_eq!(
        &res.into_body().collect().await.unwrap().to_bytes()[..],
        b"{}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_turn_in_the_extensions_is_reused_and_never_reset_per_hop() {
    let upstream = Upstream::default();
    let mut svc = BudgetLayer::new()
        .deadline(Duration::from_secs(60)) // ignored: the turn already has one
        .layer_service(upstream.clone());
    let turn = TurnLimits {
        deadline: Duration::from_secs(10),
        max_attempts: 2,
        ..TurnLimits::new()
    }
    .start_with_turn_id("turn-1".into());
    let start = Instant::now();

    let mut first = request();
    first.extensions_mut().insert(turn.clone());
    svc.ready().await.unwrap().call(first).await.unwrap();
    advance(Duration::from_secs(4)).await;

    let mut second = request();
    second.extensions_mut().insert(turn.clone());
    let res = svc.ready().await.unwrap().call(second).await.unwrap();
    let after = TurnBudget::from_extensions(res.extensions()).unwrap();
    assert!(after.ptr_eq(&turn));
    assert_eq!(after.turn_id().as_str(), "turn-1");
    assert_eq!(after.attempts_used(), 2);
    assert_eq!(after.deadline(), start + Duration::from_secs(10));
    assert_eq!(after.remaining(), Duration::from_secs(6));

    // The third hop finds the attempts used up; the upstream is not called,
    // and the client gets an error it can read.
    let mut third = request();
    third.extensions_mut().insert(turn.clone());
    let res = svc.ready().await.unwrap().call(third).await.unwrap();
    let (status, json) = refusal(res).await;
    assert_eq!(status, 429);
    assert_eq!(json["error"]["code"], "turn_budget_exhausted");
    assert_eq!(
        json["error"]["message"],
        BudgetExhausted::Attempts { used: 2, max: 2 }.to_string()
    );
    assert_eq!(upstream.calls.load(Ordering::SeqCst), 2);
    assert!(
        upstream
            .seen
            .lock()
            .unwrap()
            .iter()
            .all(|t| t.ptr_eq(&turn))
    );
}

#[tokio::test(start_paused = true)]
async fn spend_is_recorded_from_usage_and_the_ceiling_refuses() {
    let upstream = Upstream {
        usage: Some(ReportedUsage::reported(1_000, 500)),
        ..Upstream::default()
    };
    let mut svc = BudgetLayer::new()
        .limits(TurnLimits {
            spend_ceiling: Some(Cost::from_usd(0.02)),
            ..TurnLimits::new()
        })
        .pricing(Pricing::per_million_usd(5.0, 10.0)) // 0.01 + 0.01 per call
        .layer_service(upstream.clone());
    let turn = TurnLimits {
        spend_ceiling: Some(Cost::from_usd(0.02)),
        ..TurnLimits::new()
    }
    .start();
    for _ in 0..2 {
        let mut req = request();
        req.extensions_mut().insert(turn.clone());
        svc.ready().await.unwrap().call(req).await.unwrap();
    }
    assert_eq!(turn.spent(), (Cost::from_usd(0.02), false));

    let mut req = request();
    req.extensions_mut().insert(turn.clone());
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    let (status, json) = refusal(res).await;
    assert_eq!(status, 402);
    assert_eq!(json["error"]["code"], "spend_ceiling_reached");
    assert_eq!(json["error"]["type"], "insufficient_quota");
    let refused = turn.check_spend(Cost::from_usd(0.0)).unwrap_err();
    assert!(matches!(
        refused,
        BudgetExhausted::Spend { spent, ceiling, .. }
            if spent == Cost::from_usd(0.02) && ceiling == Cost::from_usd(0.02)
    ));
    assert_eq!(upstream.calls.load(Ordering::SeqCst), 2);
    // A refused call does not use an attempt.
    assert_eq!(turn.attempts_used(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_inner_loop_counts_its_own_attempts_and_the_layer_adds_none() {
    let upstream = tower::service_fn(|req: Request<Full<Bytes>>| async move {
        let turn = TurnBudget::from_extensions(req.extensions()).unwrap();
        // The failover loop inside begins its own attempts.
        assert_eq!(turn.try_begin_attempt(), Ok(1));
        assert_eq!(turn.try_begin_attempt(), Ok(2));
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    });
    let svc = BudgetLayer::new().layer_service(upstream);
    let res = svc.oneshot(request()).await.unwrap();
    assert_eq!(
        TurnBudget::from_extensions(res.extensions())
            .unwrap()
            .attempts_used(),
        2
    );
}

/// `Layer::layer` without importing the trait in every test.
trait LayerExt {
    fn layer_service<S>(&self, inner: S) -> Budget<S>;
}
impl LayerExt for BudgetLayer {
    fn layer_service<S>(&self, inner: S) -> Budget<S> {
        tower::Layer::layer(self, inner)
    }
}

/// An inner call that never answers; it says it watches the deadline
/// itself (as the failover layer does once the request is read) when
/// `watch` is set.
fn silent_inner(
    watch: bool,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Full<Bytes>>, Infallible>>,
> + Clone {
    tower::service_fn(move |req: Request<Full<Bytes>>| {
        let budget = TurnBudget::from_extensions(req.extensions()).unwrap();
        if watch {
            budget.watch_inside();
        }
        std::future::pending::<Result<Response<Full<Bytes>>, Infallible>>()
    })
}

#[tokio::test(start_paused = true)]
async fn the_deadline_backstop_is_armed_unless_the_inner_layer_watches_the_deadline() {
    // Not watched: the layer answers 504 at the deadline.
    let svc = BudgetLayer::new()
        .deadline(Duration::from_secs(2))
        .layer_service(silent_inner(false));
    let start = Instant::now();
    let (status, json) = refusal(svc.oneshot(request()).await.unwrap()).await;
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(status, 504);
    assert_eq!(json["error"]["code"], "turn_deadline_exceeded");

    // Watched: the layer leaves the deadline to the inner one and arms no
    // timer (nothing wakes the call; it is still waiting long after).
    let svc = BudgetLayer::new()
        .deadline(Duration::from_secs(2))
        .layer_service(silent_inner(true));
    let mut call = std::pin::pin!(svc.oneshot(request()));
    let pending = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx).is_pending()));
    assert!(pending.await);
    advance(Duration::from_secs(60)).await;
    let pending = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx).is_pending()));
    assert!(pending.await, "the layer answered at its own deadline");
}
