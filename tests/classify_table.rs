//! Every row of the provider reference's classification table
//! (`shared/reference/provider-contracts.md`, section A), fed as real HTTP
//! responses from a fake inner service through `ClassifyLayer`; stream rows
//! through `Classifier::classify_in_band`; transport rows with real io and
//! client errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::time::Duration;
use tower_llm_failover::classify::Note;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm_failover::dialect::OpenAiChat;
use tower_llm_failover::{
    Decision, FailureClass, Phase, classify::Classification, classify::Classifier,
    classify::ClassifyLayer, classify::UpstreamError,
};

use Decision::*;
use FailureClass::*;

/// One pre-stream row: the response the fake provider sends and what the
/// classification must say.
struct HeadRow {
    row: &'static str,
    status: u16,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
    class: FailureClass,
    recovery: Decision,
    retry_after: Option<Duration>,
    code: Option<&'static str>,
}

async fn through_layer(status: u16, headers: &[(&str, &str)], body: &'static str) -> UpstreamError {
    let mut builder = Response::builder().status(status);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let response = builder
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let upstream = tower::service_fn(move |_req: Request<Full<Bytes>>| {
        let response = response.clone();
        async move { Ok::<_, Infallible>(response) }
    });
    let service = ServiceBuilder::new()
        .layer(ClassifyLayer::new().provider("fake"))
        .service(upstream);
    service
        .oneshot(Request::new(Full::default()))
        .await
        .expect_err("a non-success status must become an UpstreamError")
}

const fn secs(s: u64) -> Option<Duration> {
    Some(Duration::from_secs(s))
}

const fn ms(m: u64) -> Option<Duration> {
    Some(Duration::from_millis(m))
}

const HEAD_ROWS: &[HeadRow] = &[
    HeadRow {
        row: "1 OpenAI rate limit",
        status: 429,
        headers: &[("retry-after-ms", "519"), ("retry-after", "1")],
        body: r#"{"error":{"message":"Rate limit reached for gpt-4o-mini in organization org-x on tokens per min (TPM): Limit 200000, Used 199434, Requested 2299. Please try again in 519ms. Visit https://platform.openai.com/account/rate-limits to learn more.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#,
        class: RateLimited,
        recovery: RetrySame,
        retry_after: ms(519),
        code: Some("rate_limit_exceeded"),
    },
    HeadRow {
        row: "1 Azure rate limit, numeric-string code, retry-after seconds",
        status: 429,
        headers: &[("retry-after", "7")],
        body: r#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API have exceeded token rate limit of your current tier."}}"#,
        class: RateLimited,
        recovery: RetrySame,
        retry_after: secs(7),
        code: Some("429"),
    },
    HeadRow {
        row: "1 rate limit with only x-ratelimit-reset of the exhausted limit",
        status: 429,
        headers: &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-remaining-tokens", "5000"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ],
        body: r#"{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#,
        class: RateLimited,
        recovery: RetrySame,
        retry_after: secs(1),
        code: Some("rate_limit_exceeded"),
    },
    HeadRow {
        row: "1a OpenAI request too large for the TPM tier",
        status: 429,
        headers: &[],
        body: r#"{"error":{"message":"Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 50000. The input or output tokens must be reduced in order to run successfully.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#,
        class: PayloadTooLarge,
        recovery: Reroute,
        retry_after: None,
        code: Some("rate_limit_exceeded"),
    },
    HeadRow {
        row: "2 OpenAI insufficient_quota",
        status: 429,
        headers: &[],
        body: r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
        class: QuotaExhausted,
        recovery: Reroute,
        retry_after: None,
        code: Some("insufficient_quota"),
    },
    HeadRow {
        row: "2 OpenAI credit_balance_exhausted (newer code)",
        status: 429,
        headers: &[],
        body: r#"{"error":{"message":"Your credit balance is exhausted.","type":"insufficient_quota","param":null,"code":"credit_balance_exhausted"}}"#,
        class: QuotaExhausted,
        recovery: Reroute,
        retry_after: None,
        code: Some("credit_balance_exhausted"),
    },
    HeadRow {
        row: "2 OpenAI project_spend_limit_exceeded",
        status: 429,
        headers: &[],
        body: r#"{"error":{"message":"Project spend limit exceeded.","type":"insufficient_quota","param":null,"code":"project_spend_limit_exceeded"}}"#,
        class: QuotaExhausted,
        recovery: Reroute,
        retry_after: None,
        code: Some("project_spend_limit_exceeded"),
    },
    HeadRow {
        row: "3 Anthropic rate_limit_error",
        status: 429,
        headers: &[
            ("retry-after", "30"),
            ("request-id", "req_011CSHoEeqs5C35K2UUqR7Fy"),
        ],
        body: r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#,
        class: RateLimited,
        recovery: RetrySame,
        retry_after: secs(30),
        code: Some("rate_limit_error"),
    },
    HeadRow {
        row: "3a Anthropic enforced spend limit, no retry-after",
        status: 429,
        headers: &[],
        body: r#"{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your spend limit.","details":{"error_code":"enforced_spend_limit_reached"}},"request_id":"req_1"}"#,
        class: QuotaExhausted,
        recovery: Reroute,
        retry_after: None,
        code: Some("enforced_spend_limit_reached"),
    },
    HeadRow {
        row: "3a variant: the same code with a retry-after is a rate limit",
        status: 429,
        headers: &[("retry-after", "12")],
        body: r#"{"type":"error","error":{"type":"rate_limit_error","message":"Spend rate limit.","details":{"error_code":"enforced_spend_limit_reached"}}}"#,
        class: RateLimited,
        recovery: RetrySame,
        retry_after: secs(12),
        code: Some("enforced_spend_limit_reached"),
    },
    HeadRow {
        row: "3b Anthropic API usage limits on a 400",
        status: 400,
        headers: &[],
        body: r#"{"type":"error","error":{"type":"invalid_request_error","message":"You have reached your specified API usage limits. You will regain access on 2026-12-01 at 00:00 UTC."}}"#,
        class: QuotaExhausted,
        recovery: Reroute,
        retry_after: None,
        code: Some("invalid_request_error"),
    },
    HeadRow {
        row: "4 Anthropic billing_error",
        status: 402,
        headers: &[],
        body: r#"{"type":"error","error":{"type":"billing_error","message":"Your credit balance is too low."}}"#,
        class: QuotaExhausted,
        recovery: Reroute,
        retry_after: None,
        code: Some("billing_error"),
    },
    HeadRow {
        row: "4 OpenRouter insufficient credits",
        status: 402,
        headers: &[],
        body: r#"{"error":{"code":402,"message":"Insufficient credits"}}"#,
        class: QuotaExhausted,
        recovery: Reroute,
        retry_after: None,
        code: Some("402"),
    },
    HeadRow {
        row: "4 DeepSeek insufficient balance",
        status: 402,
        headers: &[],
        body: r#"{"error":{"message":"Insufficient Balance","type":"unknown_error","param":null,"code":"invalid_request_error"}}"#,
        class: QuotaExhausted,
        recovery: Reroute,
        retry_after: None,
        code: Some("invalid_request_error"),
    },
    HeadRow {
        row: "5 Gemini per-day QuotaFailure (with a RetryInfo, still not retried)",
        status: 429,
        headers: &[],
        body: r#"{"error":{"code":429,"message":"You exceeded your current quota... Please retry in 53.016342224s.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","quotaDimensions":{"location":"global","model":"gemini-2.0-flash-lite"}}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"53s"}]}}"#,
        class: QuotaExhausted,
        recovery: Reroute,
        retry_after: secs(53),
        code: Some("RESOURCE_EXHAUSTED"),
    },
    HeadRow {
        row: "5 Gemini OpenAI-compatible array, per-day quota",
        status: 429,
        headers: &[],
        body: r#"[{"error":{"code":429,"message":"Quota exceeded","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsDailyPerProject"}]}]}}]"#,
        class: QuotaExhausted,
        recovery: Reroute,
        retry_after: None,
        code: Some("RESOURCE_EXHAUSTED"),
    },
    HeadRow {
        row: "5a Gemini RetryInfo 45.83s, per-minute quota",
        status: 429,
        headers: &[],
        body: r#"{"error":{"code":429,"message":"Resource exhausted.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerMinutePerProjectPerModel"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"45.83s"}]}}"#,
        class: RateLimited,
        recovery: RetrySame,
        retry_after: ms(45_830),
        code: Some("RESOURCE_EXHAUSTED"),
    },
    HeadRow {
        row: "5a Gemini wait named in the message only",
        status: 429,
        headers: &[],
        body: r#"{"error":{"code":429,"message":"Resource has been exhausted. Please retry in 43.7s.","status":"RESOURCE_EXHAUSTED"}}"#,
        class: RateLimited,
        recovery: RetrySame,
        retry_after: ms(43_700),
        code: Some("RESOURCE_EXHAUSTED"),
    },
    HeadRow {
        row: "5a Gemini OpenAI-compatible array, no details",
        status: 429,
        headers: &[],
        body: r#"[{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}]"#,
        class: RateLimited,
        recovery: RetrySame,
        retry_after: None,
        code: Some("RESOURCE_EXHAUSTED"),
    },
    HeadRow {
        row: "6 Anthropic 529 overloaded_error",
        status: 529,
        headers: &[],
        body: r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#,
        class: Overloaded,
        recovery: RetrySame,
        retry_after: None,
        code: Some("overloaded_error"),
    },
    HeadRow {
        row: "6a Gemini 503 UNAVAILABLE",
        status: 503,
        headers: &[],
        body: r#"{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}"#,
        class: Overloaded,
        recovery: RetrySame,
        retry_after: None,
        code: Some("UNAVAILABLE"),
    },
    HeadRow {
        row: "6a DeepSeek 503 Server Overloaded",
        status: 503,
        headers: &[],
        body: r#"{"error":{"message":"Server Overloaded","type":"server_error","param":null,"code":null}}"#,
        class: Overloaded,
        recovery: RetrySame,
        retry_after: None,
        code: Some("server_error"),
    },
    HeadRow {
        row: "6a OpenRouter 503 no available provider, with Retry-After",
        status: 503,
        headers: &[("Retry-After", "2")],
        body: r#"{"error":{"code":503,"message":"No available model provider that meets your routing requirements"}}"#,
        class: Overloaded,
        recovery: RetrySame,
        retry_after: secs(2),
        code: Some("503"),
    },
    HeadRow {
        row: "6a OpenAI server_is_overloaded",
        status: 503,
        headers: &[],
        body: r#"{"error":{"message":"The server is overloaded, please try again later.","type":"server_error","param":null,"code":"server_is_overloaded"}}"#,
        class: Overloaded,
        recovery: RetrySame,
        retry_after: None,
        code: Some("server_is_overloaded"),
    },
    HeadRow {
        row: "6b Groq 498 flex capacity_exceeded",
        status: 498,
        headers: &[],
        body: r#"{"error":{"message":"Flex tier capacity exceeded. Please try again later.","type":"invalid_request_error","code":"capacity_exceeded"}}"#,
        class: Overloaded,
        recovery: RetrySame,
        retry_after: None,
        code: Some("capacity_exceeded"),
    },
    HeadRow {
        row: "7 Anthropic 500 api_error",
        status: 500,
        headers: &[],
        body: r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
        class: ServerError,
        recovery: RetrySame,
        retry_after: None,
        code: Some("api_error"),
    },
    HeadRow {
        row: "7 Gemini 500 INTERNAL",
        status: 500,
        headers: &[],
        body: r#"{"error":{"code":500,"message":"An internal error has occurred.","status":"INTERNAL"}}"#,
        class: ServerError,
        recovery: RetrySame,
        retry_after: None,
        code: Some("INTERNAL"),
    },
    HeadRow {
        row: "7 OpenRouter 502 provider returned error",
        status: 502,
        headers: &[],
        body: r#"{"error":{"code":502,"message":"Provider returned error","metadata":{"provider_name":"openai","raw":"upstream said no"}}}"#,
        class: ServerError,
        recovery: RetrySame,
        retry_after: None,
        code: Some("502"),
    },
    HeadRow {
        row: "8 408 request timeout, empty body",
        status: 408,
        headers: &[],
        body: "",
        class: Timeout,
        recovery: RetrySame,
        retry_after: None,
        code: None,
    },
    HeadRow {
        row: "8 504 gateway timeout",
        status: 504,
        headers: &[],
        body: "<html><head><title>504 Gateway Time-out</title></head><body><center><h1>504 Gateway Time-out</h1></center></body></html>",
        class: Timeout,
        recovery: RetrySame,
        retry_after: None,
        code: None,
    },
    HeadRow {
        row: "8 Gemini DEADLINE_EXCEEDED",
        status: 504,
        headers: &[],
        body: r#"{"error":{"code":504,"message":"Deadline expired before operation could complete.","status":"DEADLINE_EXCEEDED"}}"#,
        class: Timeout,
        recovery: RetrySame,
        retry_after: None,
        code: Some("DEADLINE_EXCEEDED"),
    },
    HeadRow {
        row: "8 Anthropic timeout_error",
        status: 504,
        headers: &[],
        body: r#"{"type":"error","error":{"type":"timeout_error","message":"Request timed out"}}"#,
        class: Timeout,
        recovery: RetrySame,
        retry_after: None,
        code: Some("timeout_error"),
    },
    HeadRow {
        row: "9 409 lock timeout",
        status: 409,
        headers: &[],
        body: r#"{"error":{"message":"Another request is in progress.","type":"invalid_request_error","param":null,"code":null}}"#,
        class: ServerError,
        recovery: RetrySame,
        retry_after: None,
        code: Some("invalid_request_error"),
    },
    HeadRow {
        row: "10 Anthropic authentication_error",
        status: 401,
        headers: &[],
        body: r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
        class: Auth,
        recovery: Reroute,
        retry_after: None,
        code: Some("authentication_error"),
    },
    HeadRow {
        row: "10 OpenAI invalid_api_key",
        status: 401,
        headers: &[],
        body: r#"{"error":{"message":"Incorrect API key provided: sk-proj-abc123DEF456ghi789. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
        class: Auth,
        recovery: Reroute,
        retry_after: None,
        code: Some("invalid_api_key"),
    },
    HeadRow {
        row: "10 401 with no body (Ollama behind an auth proxy)",
        status: 401,
        headers: &[],
        body: "",
        class: Auth,
        recovery: Reroute,
        retry_after: None,
        code: None,
    },
    HeadRow {
        row: "11 Anthropic permission_error",
        status: 403,
        headers: &[],
        body: r#"{"type":"error","error":{"type":"permission_error","message":"Your API key does not have permission to use the specified resource."}}"#,
        class: PermissionDenied,
        recovery: Reroute,
        retry_after: None,
        code: Some("permission_error"),
    },
    HeadRow {
        row: "11 Gemini PERMISSION_DENIED",
        status: 403,
        headers: &[],
        body: r#"{"error":{"code":403,"message":"Permission denied on resource project.","status":"PERMISSION_DENIED"}}"#,
        class: PermissionDenied,
        recovery: Reroute,
        retry_after: None,
        code: Some("PERMISSION_DENIED"),
    },
    HeadRow {
        row: "11 OpenAI unsupported country",
        status: 403,
        headers: &[],
        body: r#"{"error":{"message":"Country, region, or territory not supported","type":"request_forbidden","param":null,"code":"unsupported_country_region_territory"}}"#,
        class: PermissionDenied,
        recovery: Reroute,
        retry_after: None,
        code: Some("unsupported_country_region_territory"),
    },
    HeadRow {
        row: "11a OpenRouter moderation",
        status: 403,
        headers: &[],
        body: r#"{"error":{"code":403,"message":"Input flagged","metadata":{"reasons":["violence"],"flagged_input":"...","provider_name":"openai","model_slug":"openai/gpt-4o"}}}"#,
        class: ContentFiltered,
        recovery: Stop,
        retry_after: None,
        code: Some("403"),
    },
    HeadRow {
        row: "12 OpenAI model_not_found",
        status: 404,
        headers: &[],
        body: r#"{"error":{"message":"The model `gpt-x` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#,
        class: ModelNotFound,
        recovery: Reroute,
        retry_after: None,
        code: Some("model_not_found"),
    },
    HeadRow {
        row: "12 Anthropic not_found_error",
        status: 404,
        headers: &[],
        body: r#"{"type":"error","error":{"type":"not_found_error","message":"model: claude-9"}}"#,
        class: ModelNotFound,
        recovery: Reroute,
        retry_after: None,
        code: Some("not_found_error"),
    },
    HeadRow {
        row: "12 Gemini NOT_FOUND",
        status: 404,
        headers: &[],
        body: r#"{"error":{"code":404,"message":"models/gemini-9 is not found for API version v1beta","status":"NOT_FOUND"}}"#,
        class: ModelNotFound,
        recovery: Reroute,
        retry_after: None,
        code: Some("NOT_FOUND"),
    },
    HeadRow {
        row: "12 Ollama not_found_error",
        status: 404,
        headers: &[],
        body: r#"{"error":{"message":"model \"llama9\" not found, try pulling it first","type":"not_found_error","param":null,"code":null}}"#,
        class: ModelNotFound,
        recovery: Reroute,
        retry_after: None,
        code: Some("not_found_error"),
    },
    HeadRow {
        row: "13 OpenAI context_length_exceeded",
        status: 400,
        headers: &[],
        body: r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        class: ContextLengthExceeded,
        recovery: Reroute,
        retry_after: None,
        code: Some("context_length_exceeded"),
    },
    HeadRow {
        row: "13 Anthropic prompt is too long",
        status: 400,
        headers: &[],
        body: r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 205351 tokens > 200000 maximum"},"request_id":"req_011CV5J4YZo4J3KLTDZgDN7S"}"#,
        class: ContextLengthExceeded,
        recovery: Reroute,
        retry_after: None,
        code: Some("invalid_request_error"),
    },
    HeadRow {
        row: "13 vLLM BadRequestError",
        status: 400,
        headers: &[],
        body: r#"{"error":{"message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","param":null,"code":400}}"#,
        class: ContextLengthExceeded,
        recovery: Reroute,
        retry_after: None,
        code: Some("BadRequestError"),
    },
    HeadRow {
        row: "14 Azure content_filter",
        status: 400,
        headers: &[],
        body: r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry.","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"hate":{"filtered":false,"severity":"safe"},"jailbreak":{"filtered":true,"detected":true}}}}}"#,
        class: ContentFiltered,
        recovery: Stop,
        retry_after: None,
        code: Some("content_filter"),
    },
    HeadRow {
        row: "15 Anthropic request_too_large",
        status: 413,
        headers: &[],
        body: r#"{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum allowed number of bytes."}}"#,
        class: PayloadTooLarge,
        recovery: Reroute,
        retry_after: None,
        code: Some("request_too_large"),
    },
    HeadRow {
        row: "15 Groq 413",
        status: 413,
        headers: &[],
        body: r#"{"error":{"message":"Request Entity Too Large","type":"invalid_request_error","code":"request_too_large"}}"#,
        class: PayloadTooLarge,
        recovery: Reroute,
        retry_after: None,
        code: Some("request_too_large"),
    },
    HeadRow {
        row: "16 OpenAI generic invalid_request_error",
        status: 400,
        headers: &[],
        body: r#"{"error":{"message":"Invalid value for 'temperature': must be <= 2.","type":"invalid_request_error","param":"temperature","code":"invalid_value"}}"#,
        class: InvalidRequest,
        recovery: Stop,
        retry_after: None,
        code: Some("invalid_value"),
    },
    HeadRow {
        row: "16 Gemini INVALID_ARGUMENT",
        status: 400,
        headers: &[],
        body: r#"{"error":{"code":400,"message":"Invalid JSON payload received.","status":"INVALID_ARGUMENT"}}"#,
        class: InvalidRequest,
        recovery: Stop,
        retry_after: None,
        code: Some("INVALID_ARGUMENT"),
    },
    HeadRow {
        row: "16 DeepSeek 422",
        status: 422,
        headers: &[],
        body: r#"{"error":{"message":"Invalid parameters","type":"invalid_request_error","param":null,"code":"invalid_request_error"}}"#,
        class: InvalidRequest,
        recovery: Stop,
        retry_after: None,
        code: Some("invalid_request_error"),
    },
    HeadRow {
        row: "16a Gemini FAILED_PRECONDITION",
        status: 400,
        headers: &[],
        body: r#"{"error":{"code":400,"message":"User location is not supported for the API use without a billing account linked.","status":"FAILED_PRECONDITION"}}"#,
        class: PermissionDenied,
        recovery: Reroute,
        retry_after: None,
        code: Some("FAILED_PRECONDITION"),
    },
];

#[tokio::test]
async fn head_rows_through_the_layer() {
    for row in HEAD_ROWS {
        let error = through_layer(row.status, row.headers, row.body).await;
        let c = error.classification();
        assert_eq!(c.class, row.class, "row {}: class ({c})", row.row);
        assert_eq!(c.phase, Phase::Head, "row {}: phase", row.row);
        assert_eq!(
            c.status.map(|s| s.as_u16()),
            Some(row.status),
            "row {}: status",
            row.row
        );
        assert_eq!(
            c.retry.after, row.retry_after,
            "row {}: retry hint",
            row.row
        );
        assert_eq!(c.recovery, row.recovery, "row {}: recovery", row.row);
        assert_eq!(
            c.provider_code.as_deref(),
            row.code,
            "row {}: provider code",
            row.row
        );
        assert!(!c.message.is_empty(), "row {}: message", row.row);
        assert_eq!(error.provider(), Some("fake"));
        assert_eq!(
            error.body().as_ref(),
            row.body.as_bytes(),
            "row {}: retained body",
            row.row
        );
    }
}

#[tokio::test]
async fn row_10_key_in_the_message_is_redacted() {
    let row = HEAD_ROWS
        .iter()
        .find(|r| r.row == "10 OpenAI invalid_api_key")
        .unwrap();
    let error = through_layer(row.status, row.headers, row.body).await;
    assert_eq!(
        error.classification().message,
        "Incorrect API key provided: [REDACTED]. You can find your API key at https://platform.openai.com/account/api-keys."
    );
}

#[tokio::test]
async fn x_should_retry_false_turns_retry_same_into_reroute() {
    let error = through_layer(
        500,
        &[("x-should-retry", "false")],
        r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
    )
    .await;
    let c = error.classification();
    assert_eq!(
        (c.class, c.recovery, c.retry.should_retry),
        (ServerError, Reroute, Some(false))
    );

    // `true` is recorded but does not make a request error retryable.
    let error = through_layer(
        400,
        &[("x-should-retry", "true")],
        r#"{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}"#,
    )
    .await;
    let c = error.classification();
    assert_eq!(
        (c.class, c.recovery, c.retry.should_retry),
        (InvalidRequest, Stop, Some(true))
    );
}

#[tokio::test]
async fn a_wait_longer_than_the_cap_reroutes() {
    // Row 5a: gemini-cli treats long retryDelays as terminal; ours is 120 s by default.
    let error = through_layer(
        429,
        &[],
        r#"{"error":{"code":429,"message":"x","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"600s"}]}}"#,
    )
    .await;
    let c = error.classification();
    assert_eq!(
        (c.class, c.recovery, c.retry.after),
        (RateLimited, Reroute, secs(600))
    );
}

// --- Stream rows (20-25): in-band errors handed over by the dialect. ---

struct InBandRow {
    row: &'static str,
    event: Option<&'static str>,
    data: &'static str,
    class: FailureClass,
    status: Option<u16>,
    code: Option<&'static str>,
}

const IN_BAND_ROWS: &[InBandRow] = &[
    InBandRow {
        row: "20 OpenAI mid-stream error",
        event: None,
        data: r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}"#,
        class: ServerError,
        status: None,
        code: Some("server_error"),
    },
    InBandRow {
        row: "20 Gemini native SSE error",
        event: None,
        data: r#"{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}"#,
        class: Overloaded,
        status: Some(503),
        code: Some("UNAVAILABLE"),
    },
    InBandRow {
        row: "20 OpenAI-style rate limit mid-stream",
        event: None,
        data: r#"{"error":{"message":"Rate limit reached","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#,
        class: RateLimited,
        status: None,
        code: Some("rate_limit_exceeded"),
    },
    InBandRow {
        row: "21 OpenRouter error chunk, string code",
        event: None,
        data: r#"{"id":"cmpl-abc123","object":"chat.completion.chunk","created":1234567890,"model":"gpt-3.5-turbo","provider":"openai","error":{"code":"server_error","message":"Provider disconnected unexpectedly"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}"#,
        class: ServerError,
        status: None,
        code: Some("server_error"),
    },
    InBandRow {
        row: "21 OpenRouter error chunk, numeric code",
        event: None,
        data: r#"{"id":"cmpl-abc123","object":"chat.completion.chunk","error":{"code":429,"message":"Rate limited by provider"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}"#,
        class: RateLimited,
        status: Some(429),
        code: Some("429"),
    },
    InBandRow {
        row: "22 Anthropic event: error overloaded",
        event: Some("error"),
        data: r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#,
        class: Overloaded,
        status: None,
        code: Some("overloaded_error"),
    },
    InBandRow {
        row: "22 Anthropic event: error, other inner type",
        event: Some("error"),
        data: r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
        class: ServerError,
        status: None,
        code: Some("api_error"),
    },
    InBandRow {
        row: "24 OpenAI finish_reason content_filter",
        event: None,
        data: r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"content_filter"}]}"#,
        class: ContentFiltered,
        status: None,
        code: Some("content_filter"),
    },
    InBandRow {
        row: "24 Gemini finishReason SAFETY",
        event: None,
        data: r#"{"candidates":[{"content":{"parts":[{"text":""}]},"finishReason":"SAFETY"}]}"#,
        class: ContentFiltered,
        status: None,
        code: Some("SAFETY"),
    },
    InBandRow {
        row: "24 Gemini promptFeedback.blockReason",
        event: None,
        data: r#"{"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"}}"#,
        class: ContentFiltered,
        status: None,
        code: Some("PROHIBITED_CONTENT"),
    },
    InBandRow {
        row: "25 vLLM error (then [DONE]), 500",
        event: None,
        data: r#"{"error":{"message":"EngineCore encountered an issue. See stack trace for the root cause.","type":"InternalServerError","param":null,"code":500}}"#,
        class: ServerError,
        status: Some(500),
        code: Some("InternalServerError"),
    },
    InBandRow {
        row: "25 vLLM error (then [DONE]), 400 context",
        event: None,
        data: r#"{"error":{"message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","param":null,"code":400}}"#,
        class: ContextLengthExceeded,
        status: Some(400),
        code: Some("BadRequestError"),
    },
    InBandRow {
        row: "Ollama native NDJSON error",
        event: None,
        data: r#"{"error":"an error was encountered while running the model"}"#,
        class: ServerError,
        status: None,
        code: None,
    },
];

#[test]
fn in_band_rows() {
    let classifier = Classifier::new();
    for phase in [Phase::Preamble, Phase::Committed] {
        for row in IN_BAND_ROWS {
            let c =
                classifier.classify_in_band(Some("fake"), row.event, row.data.as_bytes(), phase);
            assert_eq!(c.class, row.class, "row {}: class ({c})", row.row);
            assert_eq!(c.phase, phase, "row {}: phase", row.row);
            assert_eq!(
                c.status.map(|s| s.as_u16()),
                row.status,
                "row {}: status",
                row.row
            );
            assert_eq!(
                c.provider_code.as_deref(),
                row.code,
                "row {}: code",
                row.row
            );
            assert_eq!(
                c.recovery,
                row.class.default_recovery(),
                "row {}: recovery",
                row.row
            );
            assert_eq!((c.phase != Phase::Committed), phase == Phase::Preamble);
        }
    }
}

#[test]
fn row_23_truncated_stream() {
    let c = Classification::truncated(Phase::Preamble);
    assert_eq!(
        (c.class, c.phase, c.recovery),
        (InvalidResponse, Phase::Preamble, Reroute)
    );
    assert_eq!(c.note, Some(Note::TruncatedStream));
    let c = Classification::truncated(Phase::Committed);
    assert!(!(c.phase != Phase::Committed));
}

#[test]
fn row_18_cancelled() {
    let c = Classification::cancelled(Phase::Preamble);
    assert_eq!((c.class, c.recovery), (Cancelled, Stop));
}

#[test]
fn row_8_our_own_timeout() {
    let c = Classification::timeout(Phase::Head, "the first byte");
    assert_eq!(
        (c.class, c.phase, c.recovery),
        (Timeout, Phase::Head, RetrySame)
    );
    assert_eq!(c.message, "timed out waiting for the first byte");
}

// --- Row 19: a 200 that is not what it claims. ---

#[test]
fn row_19_invalid_completions() {
    let classifier = Classifier::new();
    let ok = br#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#;
    assert!(classifier.validate_body(&OpenAiChat, None, ok).is_ok());

    let cases: &[(&[u8], FailureClass, Option<Note>)] = &[
        (b"{\"id\":\"c\",\"choices\":[", InvalidResponse, Some(Note::InvalidJson)),
        (b"not json at all", InvalidResponse, Some(Note::InvalidJson)),
        (br#"{"id":"c","object":"chat.completion"}"#, InvalidResponse, Some(Note::NoAnswer)),
        (br#"{"id":"c","choices":[]}"#, InvalidResponse, Some(Note::NoAnswer)),
        (br#"{"id":"c","choices":null}"#, InvalidResponse, Some(Note::NoAnswer)),
        (br#"[1,2]"#, InvalidResponse, Some(Note::UnexpectedJson)),
        // Gemini compat: unwrap the array, then classify the inner error.
        (
            br#"[{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}]"#,
            RateLimited,
            Some(Note::ErrorOn200),
        ),
        (
            br#"{"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}"#,
            ServerError,
            Some(Note::ErrorOn200),
        ),
    ];
    for (body, class, note) in cases {
        let c = classifier
            .validate_body(&OpenAiChat, Some("fake"), body)
            .expect_err(&String::from_utf8_lossy(body));
        assert_eq!(c.class, *class, "{}", String::from_utf8_lossy(body));
        assert_eq!(c.phase, Phase::Preamble);
        assert_eq!(c.note, *note);
    }
    // `"error": null` is no error.
    assert!(
        classifier
            .validate_body(
                &OpenAiChat,
                None,
                br#"{"error":null,"choices":[{"index":0}]}"#
            )
            .is_ok()
    );
}

// --- Row 17: transport failures, with real errors. ---

#[tokio::test]
async fn row_17_connection_refused_is_before_send() {
    // A port that was just free: connecting is refused by the kernel.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let error = tokio::net::TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionRefused);
    let c = Classifier::new().classify_transport(Some("fake"), &error, false);
    assert_eq!(
        (c.class, c.phase, c.recovery),
        (Connect, Phase::BeforeSend, RetrySame)
    );
    assert!(!c.phase.may_have_reached_provider());
}

#[test]
fn row_17_io_kinds() {
    use std::io::{Error, ErrorKind};
    let classifier = Classifier::new();
    let cases = [
        (ErrorKind::NotFound, false, Connect, Phase::BeforeSend),
        (
            ErrorKind::HostUnreachable,
            false,
            Connect,
            Phase::BeforeSend,
        ),
        (ErrorKind::ConnectionReset, false, Connect, Phase::Head),
        (ErrorKind::ConnectionAborted, false, Connect, Phase::Head),
        (ErrorKind::BrokenPipe, false, Connect, Phase::Head),
        (ErrorKind::UnexpectedEof, false, Connect, Phase::Head),
        (ErrorKind::ConnectionReset, true, Connect, Phase::Preamble),
        (ErrorKind::TimedOut, false, Timeout, Phase::Head),
        (ErrorKind::TimedOut, true, Timeout, Phase::Preamble),
        (
            ErrorKind::InvalidData,
            true,
            InvalidResponse,
            Phase::Preamble,
        ),
    ];
    for (kind, head, class, phase) in cases {
        let c = classifier.classify_transport(None, &Error::from(kind), head);
        assert_eq!(
            (c.class, c.phase),
            (class, phase),
            "{kind:?} head_received={head}"
        );
        assert_eq!(
            c.phase.may_have_reached_provider(),
            phase != Phase::BeforeSend
        );
    }
}

#[tokio::test]
async fn row_17_elapsed_and_wrapped_errors() {
    let elapsed = tokio::time::timeout(Duration::ZERO, std::future::pending::<()>())
        .await
        .unwrap_err();
    let classifier = Classifier::new();
    let c = classifier.classify_transport(None, &elapsed, false);
    assert_eq!((c.class, c.phase), (Timeout, Phase::Head));

    // An Elapsed wrapped in an io::Error (io::Error::source skips it).
    let wrapped = std::io::Error::other(elapsed);
    let c = classifier.classify_transport(None, &wrapped, true);
    assert_eq!((c.class, c.phase), (Timeout, Phase::Preamble));
}

#[cfg(feature = "hyper")]
mod client {
    use super::*;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
        Client::builder(TokioExecutor::new()).build_http()
    }

    #[tokio::test]
    async fn refused_through_the_real_client_is_before_send() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let service = ServiceBuilder::new()
            .layer(ClassifyLayer::new().provider("local"))
            .service(client());
        let request = Request::get(format!("http://{addr}/v1/chat/completions"))
            .body(Full::default())
            .unwrap();
        let error = service.oneshot(request).await.unwrap_err();
        let c = error.classification();
        assert_eq!(
            (c.class, c.phase, c.recovery),
            (Connect, Phase::BeforeSend, RetrySame)
        );
        assert_eq!(c.note, Some(Note::ConnectFailed));
        assert!(std::error::Error::source(&error).is_some());
    }

    #[tokio::test]
    async fn closed_before_the_head_is_connect_at_head() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await;
            // Close without answering: the request reached the "provider".
        });
        let service = ServiceBuilder::new()
            .layer(ClassifyLayer::new())
            .service(client());
        let request = Request::post(format!("http://{addr}/v1/chat/completions"))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let error = service.oneshot(request).await.unwrap_err();
        let c = error.classification();
        assert_eq!((c.class, c.phase), (Connect, Phase::Head), "{c}");
        assert!(c.phase.may_have_reached_provider());
    }

    #[tokio::test]
    async fn a_real_429_and_a_reset_mid_body() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        const BODY: &str = r#"{"error":{"message":"slow down","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
        tokio::spawn(async move {
            let responses = [
                format!(
                    "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 3\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{BODY}",
                    BODY.len()
                ),
                // Promises 100 bytes, sends 5, closes: the body breaks mid-stream.
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 100\r\nconnection: close\r\n\r\ndata:".to_owned(),
            ];
            for response in responses {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                socket.write_all(response.as_bytes()).await.unwrap();
                socket.shutdown().await.unwrap();
            }
        });
        let service = ServiceBuilder::new()
            .layer(ClassifyLayer::new().provider("local"))
            .service(client());
        let request = || {
            Request::post(format!("http://{addr}/v1/chat/completions"))
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap()
        };
        let error = service.clone().oneshot(request()).await.unwrap_err();
        let c = error.classification();
        assert_eq!(
            (c.class, c.phase, c.retry.after),
            (RateLimited, Phase::Head, secs(3))
        );
        assert_eq!(error.body().as_ref(), BODY.as_bytes());

        let response = service.oneshot(request()).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        let body_error = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap_err();
        let c = Classifier::new().classify_transport(Some("local"), &body_error, true);
        assert_eq!((c.class, c.phase), (Connect, Phase::Preamble), "{c}");
    }
}
