//! The budget tests' fake LLM service and helpers, shared by the
//! integration tests (`tests/budget_layer.rs`) and the unit tests of the
//! turn's crate-private bookkeeping (`src/budget/layer_tests.rs`). Each
//! includer imports what these name (`use super::*`).

use super::*;

/// A refused turn's answer: its status and its JSON error body.
pub(super) async fn refusal<B>(response: Response<B>) -> (http::StatusCode, serde_json::Value)
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let status = response.status();
    assert_eq!(response.headers()["content-type"], "application/json");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap())
}

pub(super) fn request() -> Request<Full<Bytes>> {
    Request::new(Full::new(Bytes::from_static(
        br#"{"model":"m","messages":[]}"#,
    )))
}

/// An upstream answering `{}` at once, counting its calls and reporting the
/// turn it saw.
#[derive(Clone, Default)]
pub(super) struct Upstream {
    pub(super) calls: Arc<AtomicU32>,
    pub(super) seen: Arc<std::sync::Mutex<Vec<TurnBudget>>>,
    pub(super) usage: Option<ReportedUsage>,
}

impl Service<Request<Full<Bytes>>> for Upstream {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Full<Bytes>>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let turn = TurnBudget::from_extensions(req.extensions()).expect("turn in extensions");
        self.seen.lock().unwrap().push(turn);
        let mut res = Response::new(Full::new(Bytes::from_static(b"{}")));
        if let Some(usage) = self.usage {
            res.extensions_mut().insert(usage);
        }
        std::future::ready(Ok(res))
    }
}
