//! The answers a turn ends with when no attempt committed: request errors,
//! the provider's own request error, and one error naming the first
//! failure when every option is spent — each shaped by the dialect.

use std::sync::Arc;
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{HeaderValue, Response, StatusCode};

use super::body::FailoverBody;
use crate::budget::{BudgetExhausted, TurnBudget};
use crate::dialect::{Dialect, ErrorReply};
use crate::observe::TurnRecord;
use crate::{FailureClass, classify::Classification};

/// Headers and extensions every answer of a turn carries.
pub(super) fn finish<B, D: Dialect>(
    mut response: Response<FailoverBody<B, D>>,
    run: &TurnRecord,
    budget: &TurnBudget,
) -> Response<FailoverBody<B, D>> {
    run.write_summary_headers(response.headers_mut());
    // A stream's turn is concluded when the stream ends.
    if !response.body().is_stream() {
        run.conclude();
    }
    response.extensions_mut().insert(run.clone());
    response.extensions_mut().insert(budget.clone());
    response
}

/// An error answer in the dialect's shape.
pub(super) fn error<B, D: Dialect>(
    dialect: &D,
    status: StatusCode,
    reply: &ErrorReply<'_>,
) -> Response<FailoverBody<B, D>> {
    dialect
        .error_response(status, reply)
        .map(FailoverBody::full)
}

/// The client's request cannot be served (the gateway's own check).
pub(super) fn client_error<B, D: Dialect>(
    dialect: &D,
    status: StatusCode,
    message: &str,
    code: &str,
) -> Response<FailoverBody<B, D>> {
    let class = if status == StatusCode::PAYLOAD_TOO_LARGE {
        FailureClass::PayloadTooLarge
    } else {
        FailureClass::InvalidRequest
    };
    error(dialect, status, &ErrorReply::coded(class, code, message))
}

/// A client's request the dialect could not read: a 400 naming the field
/// at fault (`param`) when there is one.
pub(super) fn request_error<B, D: Dialect>(
    dialect: &D,
    message: &str,
    code: &str,
    param: Option<&str>,
) -> Response<FailoverBody<B, D>> {
    let reply = ErrorReply {
        param,
        ..ErrorReply::coded(FailureClass::InvalidRequest, code, message)
    };
    error(dialect, StatusCode::BAD_REQUEST, &reply)
}

/// A provider's request error, returned as its own message and status.
pub(super) fn classified<B, D: Dialect>(
    dialect: &D,
    failure: &Classification,
) -> Response<FailoverBody<B, D>> {
    with_retry_after(
        error(dialect, failure.client_status(), &failure.error_reply()),
        failure.retry.after,
    )
}

fn with_retry_after<B, D: Dialect>(
    mut response: Response<FailoverBody<B, D>>,
    after: Option<Duration>,
) -> Response<FailoverBody<B, D>> {
    if let Some(after) = after {
        let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    }
    response
}

/// The status a spent turn answers with, from its first failure.
fn exhausted_status(class: FailureClass) -> StatusCode {
    match class {
        FailureClass::RateLimited | FailureClass::QuotaExhausted => StatusCode::TOO_MANY_REQUESTS,
        FailureClass::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
        FailureClass::Timeout => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::BAD_GATEWAY,
    }
}

/// Every option is spent: one error naming the first failure's cause and
/// the number of attempts. `only_probes`: every target was resting, and
/// the probe of the soonest failed too.
pub(super) fn exhausted<B, D: Dialect>(
    dialect: &D,
    first: Option<&(Arc<str>, Classification)>,
    budget: &TurnBudget,
    note: &str,
    only_probes: bool,
) -> Response<FailoverBody<B, D>> {
    let attempts = budget.attempts_used();
    let suffix = if note.is_empty() {
        String::new()
    } else {
        format!(" ({note})")
    };
    let unavailable = |message: &str| {
        error(
            dialect,
            StatusCode::SERVICE_UNAVAILABLE,
            &ErrorReply::coded(FailureClass::Overloaded, "no_available_target", message),
        )
    };
    let (target, failure) = match first {
        Some((target, failure)) if only_probes => {
            return unavailable(&format!(
                "no target is available right now{suffix}; the probe of {target} failed: {}: {}",
                failure.class,
                failure.class.client_message()
            ));
        }
        Some(first) => first,
        None => return unavailable(&format!("no target is available right now{suffix}")),
    };
    // The provider's message stays in the records: for the client, a
    // stable message of the class.
    let message = format!(
        "all options spent after {attempts} attempt{}; first failure: {} from {target}: {}{suffix}",
        if attempts == 1 { "" } else { "s" },
        failure.class,
        failure.class.client_message(),
    );
    // A request error nobody else could take (a context window too small
    // everywhere) keeps its own status; provider trouble maps by class.
    let status = if failure.class.is_request_error() {
        failure.client_status()
    } else {
        exhausted_status(failure.class)
    };
    let reply = ErrorReply {
        provider_code: failure.provider_code.as_deref(),
        ..ErrorReply::new(failure.class, &message)
    };
    with_retry_after(error(dialect, status, &reply), failure.retry.after)
}

/// The turn's budget refused another attempt.
pub(super) fn budget_stop<B, D: Dialect>(
    dialect: &D,
    refusal: &BudgetExhausted,
    first: Option<&(Arc<str>, Classification)>,
    budget: &TurnBudget,
) -> Response<FailoverBody<B, D>> {
    let message = refusal.to_string();
    match (refusal, first) {
        (BudgetExhausted::Spend { .. }, _) => error(
            dialect,
            StatusCode::PAYMENT_REQUIRED,
            &ErrorReply::coded(
                FailureClass::QuotaExhausted,
                "spend_ceiling_reached",
                &message,
            ),
        ),
        // Another option was there, but the fleet is retrying too much
        // right now: say so, rather than blame the first failure.
        (BudgetExhausted::RetryBudget { .. }, _) => {
            let message = match first {
                Some((target, failure)) => format!(
                    "{message}; first failure: {} from {target}: {}",
                    failure.class,
                    failure.class.client_message()
                ),
                None => message,
            };
            error(
                dialect,
                StatusCode::SERVICE_UNAVAILABLE,
                &ErrorReply::coded(FailureClass::Overloaded, "retry_budget_exhausted", &message),
            )
        }
        (BudgetExhausted::TenantCeiling { .. }, _) => error(
            dialect,
            StatusCode::PAYMENT_REQUIRED,
            &ErrorReply::coded(
                FailureClass::QuotaExhausted,
                "tenant_spend_ceiling_reached",
                &message,
            ),
        ),
        (BudgetExhausted::TenantRequired, _) => error(
            dialect,
            StatusCode::BAD_REQUEST,
            &ErrorReply::coded(FailureClass::InvalidRequest, "tenant_required", &message),
        ),
        // The store's own error is in the log, not for the client.
        (BudgetExhausted::SpendStoreUnavailable, _) => error(
            dialect,
            StatusCode::SERVICE_UNAVAILABLE,
            &ErrorReply::coded(
                FailureClass::Overloaded,
                "spend_store_unavailable",
                &message,
            ),
        ),
        (_, Some(_)) => exhausted(dialect, first, budget, &message, false),
        (_, None) => error(
            dialect,
            StatusCode::GATEWAY_TIMEOUT,
            &ErrorReply::coded(FailureClass::Timeout, "turn_budget_exhausted", &message),
        ),
    }
}
