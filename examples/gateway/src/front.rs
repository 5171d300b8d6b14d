//! The gateway's front service: a model request (`POST` on one of the three
//! model paths) goes straight to its route's stack; everything else goes
//! through axum's router.
//!
//! Why: axum's routing (path lookup, the matched path and URL parameters
//! written into the request's extensions, the method router, the boxed
//! route and its future wrappers) cost about a twentieth of a small
//! completion's instructions in the gateway, for three fixed paths. The
//! router still holds the same stacks on the same paths, so any other
//! method there is answered `405` with `allow: POST`, as before.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::future::RouteFuture;
use bytes::Bytes;
use http::Method;
use pin_project_lite::pin_project;
use tower::util::Oneshot;
use tower::{Service, ServiceExt};
use tower_llm_failover::BoxError;
use tower_llm_failover::dialect::{AnthropicMessages, Dialect, OpenAiChat, OpenAiResponses};
use tower_llm_failover::identity::{Identity, IdentityLayer};
use tower_llm_failover::limit::{InFlightBody, InFlightLimit, InFlightLimitLayer};

use crate::app::Gateway;

/// A model route's stack: the client key check around the in-flight cap
/// around the handler.
pub(crate) type ModelStack<D> = Identity<InFlightLimit<Handler, D>, D>;

/// Builds a model route's stack around `serve`.
pub(crate) fn model_stack<D: Dialect>(
    identity: IdentityLayer<D>,
    cap: InFlightLimitLayer<D>,
    gateway: &Arc<Gateway>,
    serve: ServeFn,
) -> ModelStack<D> {
    use tower::Layer;
    identity.layer(cap.layer(Handler {
        gateway: Arc::clone(gateway),
        serve,
    }))
}

/// The three model routes' stacks.
pub(crate) struct ModelRoutes {
    /// `POST /v1/chat/completions`.
    pub(crate) chat: ModelStack<OpenAiChat>,
    /// `POST /v1/messages`.
    pub(crate) messages: ModelStack<AnthropicMessages>,
    /// `POST /v1/responses`.
    pub(crate) responses: ModelStack<OpenAiResponses>,
}

/// The front service (see the module docs). Cloned per request by hyper's
/// adapter: two reference counts.
#[derive(Clone)]
pub(crate) struct Front {
    routes: Arc<ModelRoutes>,
    router: Router,
}

impl Front {
    /// `routes` served directly, `router` (holding the same stacks on the
    /// same paths) for the rest.
    pub(crate) fn new(routes: ModelRoutes, router: Router) -> Self {
        Self {
            routes: Arc::new(routes),
            router,
        }
    }
}

impl<B> Service<http::Request<B>> for Front
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<FrontBody>;
    type Error = Infallible;
    type Future = FrontFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The model stacks are cloned ready per request (oneshot).
        Service::<http::Request<B>>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, request: http::Request<B>) -> FrontFuture {
        if request.method() == Method::POST {
            let routes = &self.routes;
            match request.uri().path() {
                "/v1/chat/completions" => {
                    return FrontFuture::Chat {
                        future: routes.chat.clone().oneshot(request.map(Body::new)),
                    };
                }
                "/v1/messages" => {
                    return FrontFuture::Messages {
                        future: routes.messages.clone().oneshot(request.map(Body::new)),
                    };
                }
                "/v1/responses" => {
                    return FrontFuture::Responses {
                        future: routes.responses.clone().oneshot(request.map(Body::new)),
                    };
                }
                _ => {}
            }
        }
        FrontFuture::Other {
            future: self.router.call(request),
        }
    }
}

pin_project! {
    /// [`Front`]'s future: a model stack's, or the router's.
    #[project = FrontProj]
    pub(crate) enum FrontFuture {
        Chat { #[pin] future: Oneshot<ModelStack<OpenAiChat>, Request> },
        Messages { #[pin] future: Oneshot<ModelStack<AnthropicMessages>, Request> },
        Responses { #[pin] future: Oneshot<ModelStack<OpenAiResponses>, Request> },
        Other { #[pin] future: RouteFuture<Infallible> },
    }
}

impl Future for FrontFuture {
    type Output = Result<http::Response<FrontBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let response = match self.project() {
            FrontProj::Chat { future } => futures_ready(future.poll(cx)),
            FrontProj::Messages { future } => futures_ready(future.poll(cx)),
            FrontProj::Responses { future } => futures_ready(future.poll(cx)),
            FrontProj::Other { future } => {
                return future
                    .poll(cx)
                    .map_ok(|response| response.map(|body| FrontBody::Other { body }));
            }
        };
        response.map(|response| Ok(response.map(|body| FrontBody::Model { body })))
    }
}

/// A model route's answer body, as its stack gives it: the stack's own
/// refusal, or the handler's body holding its in-flight slot.
type ModelBody = http_body_util::Either<http_body_util::Full<Bytes>, InFlightBody<Body>>;

pin_project! {
    /// The body of the front's answers: a model route's as its stack gives
    /// it, not boxed again (an allocation and an indirect call per frame
    /// per answer), or the router's.
    #[project = FrontBodyProj]
    pub(crate) enum FrontBody {
        Model { #[pin] body: ModelBody },
        Other { #[pin] body: Body },
    }
}

impl HttpBody for FrontBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        match self.project() {
            FrontBodyProj::Model { body } => body.poll_frame(cx),
            FrontBodyProj::Other { body } => body.poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            FrontBody::Model { body } => body.is_end_stream(),
            FrontBody::Other { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            FrontBody::Model { body } => body.size_hint(),
            FrontBody::Other { body } => body.size_hint(),
        }
    }
}

/// A model stack's answer, once ready (its error is `Infallible`).
fn futures_ready<T>(poll: Poll<Result<T, Infallible>>) -> Poll<T> {
    match poll {
        Poll::Ready(Ok(response)) => Poll::Ready(response),
        Poll::Ready(Err(never)) => match never {},
        Poll::Pending => Poll::Pending,
    }
}

/// A model route's handler future, boxed once (as axum boxes an `async fn`
/// handler's).
pub(crate) type HandlerFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// What a model route's handler runs.
pub(crate) type ServeFn = fn(Arc<Gateway>, Request) -> HandlerFuture;

/// A model route's handler as a service: the gateway and what to run.
#[derive(Clone)]
pub(crate) struct Handler {
    gateway: Arc<Gateway>,
    serve: ServeFn,
}

impl Service<Request> for Handler {
    type Response = Response;
    type Error = Infallible;
    type Future = HandlerFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> HandlerFuture {
        (self.serve)(Arc::clone(&self.gateway), request)
    }
}

/// `POST /v1/chat/completions`.
///
/// The box first, then the handler's future written into it (here and
/// below): `Box::pin` builds the future (over 1 KB) on the stack and
/// copies it.
pub(crate) fn chat(gateway: Arc<Gateway>, request: Request) -> HandlerFuture {
    let future = Box::write(Box::new_uninit(), async move {
        Ok(crate::app::chat_completions(State(gateway), request).await)
    });
    Box::into_pin(future)
}

/// `POST /v1/messages`.
pub(crate) fn messages(gateway: Arc<Gateway>, request: Request) -> HandlerFuture {
    let future = Box::write(Box::new_uninit(), async move {
        Ok(crate::messages::handler(State(gateway), request).await)
    });
    Box::into_pin(future)
}

/// `POST /v1/responses`.
pub(crate) fn responses(gateway: Arc<Gateway>, request: Request) -> HandlerFuture {
    let future = Box::write(Box::new_uninit(), async move {
        Ok(crate::messages::responses_handler(State(gateway), request).await)
    });
    Box::into_pin(future)
}
