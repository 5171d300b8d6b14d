//! The skimmer against the serde reading it replaced (`oracle`): the same
//! `Chunk`, the same borrowing, the same rejections, on fixtures, generated
//! chunk-shaped JSON and mutations of both.

use std::borrow::Cow;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};

use super::skim::{ChoiceSet, ChunkPrefix};
use super::{oracle, reply, request, stream as openai};
use crate::dialect::Chunk;

fn borrowed(cow: Option<&Cow<'_, str>>) -> Option<bool> {
    cow.map(|c| matches!(c, Cow::Borrowed(_)))
}

fn shape(chunk: &Chunk<'_>) -> [Option<bool>; 3] {
    [
        borrowed(chunk.identity.id.as_ref()),
        borrowed(chunk.identity.model.as_ref()),
        borrowed(chunk.finish_reason.as_ref()),
    ]
}

/// Both readings of `data`, for a `message` and an `error` event.
fn compare(data: &[u8]) -> Result<(), TestCaseError> {
    for error_event in [false, true] {
        let skimmed = openai::read_chunk(error_event, data);
        let reference = oracle::read_chunk(error_event, data);
        prop_assert_eq!(
            &skimmed,
            &reference,
            "error_event={} data={:?}",
            error_event,
            String::from_utf8_lossy(data)
        );
        prop_assert_eq!(shape(&skimmed), shape(&reference));
    }
    Ok(())
}

/// A stream's chunks read in turn with one memo (its prefix and template)
/// against each read with a fresh memo: the same kind, finish reason and
/// usage, the same choices seen and finished so far; an identity field
/// reads `None` only where the stream already has the chunk's value.
fn compare_stream(chunks: &[String]) -> Result<(), TestCaseError> {
    for error_event in [false, true] {
        let mut had = crate::dialect::ChunkIdentity::default();
        let mut prefix = ChunkPrefix::default();
        let (mut choices, mut alone_choices) = (ChoiceSet::default(), ChoiceSet::default());
        for chunk in chunks {
            let data = chunk.as_bytes();
            let next = openai::read_chunk_next(error_event, data, &mut prefix, &mut choices);
            let alone = openai::read_chunk_next(
                error_event,
                data,
                &mut ChunkPrefix::default(),
                &mut alone_choices,
            );
            prop_assert_eq!(&alone, &openai::read_chunk(error_event, data));
            let shown = format!("{chunk} after {chunks:?}");
            prop_assert_eq!(next.kind, alone.kind, "{}", shown);
            prop_assert_eq!(&next.finish_reason, &alone.finish_reason, "{}", shown);
            prop_assert_eq!(next.usage, alone.usage, "{}", shown);
            prop_assert_eq!(choices, alone_choices, "{}", shown);
            let (got, want) = (&next.identity, &alone.identity);
            prop_assert!(
                got.id == want.id || (got.id.is_none() && want.id == had.id),
                "{}",
                shown
            );
            prop_assert!(
                got.model == want.model || (got.model.is_none() && want.model == had.model),
                "{}",
                shown
            );
            prop_assert!(
                got.created == want.created
                    || (got.created.is_none() && want.created == had.created),
                "{}",
                shown
            );
            // What a stream keeps: the last value each field was given.
            if next.kind != crate::dialect::ChunkKind::Malformed {
                had.id = next.identity.id.clone().or(had.id);
                had.model = next.identity.model.clone().or(had.model);
                had.created = next.identity.created.or(had.created);
            }
        }
    }
    Ok(())
}

/// `text` cut to at most `at` bytes, on a character boundary.
fn cut(text: &str, mut at: usize) -> &str {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    &text[..at]
}

fn assert_same(data: &str) {
    if let Err(failure) = compare(data.as_bytes()) {
        panic!("{failure}");
    }
}

/// Event data from the dialect's unit tests, the provider contracts, the
/// bench and the scripted test streams.
const FIXTURES: &[&str] = &[
    r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"finish_reason":null}]}"#,
    r#"{"choices":[{"delta":{"content":"x"}}]}"#,
    r#"{"choices":[{"delta":{"content":"\n"}}]}"#,
    r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":""}}]}}]}"#,
    r#"{"choices":[{"delta":{"refusal":"no"}}]}"#,
    r#"{"choices":[{"delta":{"reasoning_content":"hm"}}]}"#,
    r#"{"choices":[{"delta":{"reasoning":"hm"}}]}"#,
    r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
    r#"{"choices":[],"prompt_filter_results":[]}"#,
    r#"{"choices":[{"delta":{"content":"x""#,
    "not json",
    r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}"#,
    r#"{"id":"cmpl-abc123","object":"chat.completion.chunk","created":1234567890,"model":"gpt-3.5-turbo","provider":"openai","error":{"code":"server_error","message":"Provider disconnected unexpectedly"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}"#,
    r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#,
    r#"{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}"#,
    r#"{"error":{"message":"EngineCore encountered an issue…","type":"InternalServerError","param":null,"code":500}}"#,
    r#"{"error":null,"choices":[{"delta":{"content":"x"}}]}"#,
    "{}",
    r#"{"id":"c","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":40,"total_tokens":52}}"#,
    r#"{"error":{"message":"Rate limit reached for gpt-4o-mini in organization org-x on tokens per min (TPM): Limit 200000, Used 199434, Requested 2299. Please try again in 519ms. Visit https://platform.openai.com/account/rate-limits to learn more.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#,
    r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
    r#"{"error":{"message":"…","type":"insufficient_quota","param":null,"code":"credit_balance_exhausted"}}"#,
    r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
    r#"{"error":{"message":"Incorrect API key provided: sk-…","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
    r#"{"error":{"message":"The model `gpt-x` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#,
    r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry.","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"hate":{"filtered":false,"severity":"safe"},"jailbreak":{"filtered":true,"detected":true},"self_harm":{"filtered":false,"severity":"safe"},"sexual":{"filtered":false,"severity":"safe"},"violence":{"filtered":false,"severity":"safe"}}}}}"#,
    r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#,
    r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"},"request_id":"req_…"}"#,
    r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 205351 tokens > 200000 maximum"},"request_id":"req_011CV5J4YZo4J3KLTDZgDN7S"}"#,
    r#"{"error":{"code":429,"message":"You exceeded your current quota... Please retry in 53.016342224s.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","quotaDimensions":{"location":"global","model":"gemini-2.0-flash-lite"}}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"53s"}]}}"#,
    r#"[{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}]"#,
    r#"{"error":{"code":402,"message":"Insufficient credits"}}"#,
    r#"{"error":{"code":502,"message":"Provider returned error","metadata":{"provider_name":"openai","raw":"…"}}}"#,
    r#"{"error":{"code":403,"message":"Input flagged","metadata":{"reasons":["violence"],"flagged_input":"…","provider_name":"openai","model_slug":"openai/gpt-4o"}}}"#,
    r#"{"error":{"message":"This model's maximum context length is 4096 tokens…","type":"BadRequestError","param":null,"code":400}}"#,
    r#"{"error":{"message":"model \"llama9\" not found, try pulling it first","type":"not_found_error","param":null,"code":null}}"#,
    r#"{"error":"an error was encountered while running the model"}"#,
    r#"{"id":"chatcmpl-AbCdEfGhIjKlMnOpQrStUvWxYz012","object":"chat.completion.chunk","created":1732968000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
    r#"{"id":"chatcmpl-AbCdEfGhIjKlMnOpQrStUvWxYz012","object":"chat.completion.chunk","created":1732968000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[{"index":0,"delta":{"content":" token0042"},"logprobs":null,"finish_reason":null}]}"#,
    r#"{"id":"chatcmpl-AbCdEfGhIjKlMnOpQrStUvWxYz012","object":"chat.completion.chunk","created":1732968000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0ba0d124f1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}"#,
    r#"{"choices":[{"delta":{"content":"token 7 with \"escapes\" and ünïcode"},"finish_reason":null,"index":0}],"created":1,"id":"chatcmpl-test","model":"m","object":"chat.completion.chunk"}"#,
    r#"{"choices":[],"created":1,"id":"chatcmpl-test","model":"m","object":"chat.completion.chunk","usage":{"completion_tokens":40,"prompt_tokens":12,"total_tokens":52}}"#,
    r#"{"id":"chatcmpl-\u00e9","model":"m\/x","choices":[{"delta":{"content":null},"finish_reason":"st\u006fp"}]}"#,
    r#"["c",null,5,null,[1,2],[[{"content":"x"},"stop"]]]"#,
];

#[test]
fn fixtures_read_the_same() {
    for fixture in FIXTURES {
        assert_same(fixture);
        assert_same(&format!(" \n{fixture}\t\r\n"));
    }
}

#[test]
fn edge_cases_read_the_same() {
    let deep = 10_000;
    let cases = [
        "[".repeat(deep),
        format!("{{\"x\":{}", "[".repeat(deep)),
        format!("{{\"x\":{}{}}}", "[".repeat(deep), "]".repeat(deep)),
        format!("{{\"x\":{}{}}}", "{\"a\":".repeat(deep), "}".repeat(deep)),
        format!(
            "{{\"choices\":[{{\"delta\":{{\"content\":{}1{}}}}}]}}",
            "[".repeat(deep),
            "]".repeat(deep)
        ),
    ];
    for case in &cases {
        assert_same(case);
    }
    let small = [
        "",
        "null",
        "[]",
        "[null,null,null,null,null,null]",
        "[null,null,null,null,null,null,null]",
        r#"{"usage":[]}"#,
        r#"{"usage":[5]}"#,
        r#"{"usage":[null,3]}"#,
        r#"{"usage":[1,2,3]}"#,
        r#"{"choices":[[]]}"#,
        r#"{"choices":[[null,"stop"]]}"#,
        r#"{"choices":[[{"content":"x"},"stop",1]]}"#,
        r#"{"choices":[{"delta":["","",""," "]}]}"#,
        r#"{"choices":[{"delta":[null,null,null,null,null,null]}]}"#,
        r#"{"choices":[{"delta":5}]}"#,
        r#"{"choices":null}"#,
        r#"{"choices":{}}"#,
        r#"{"choices":[null]}"#,
        r#"{"choices":[{"finish_reason":null},{"finish_reason":"a"},{"finish_reason":"b"}]}"#,
        r#"{"choices":[{"finish_reason":"a"},{"finish_reason":5}]}"#,
        r#"{"choices":[{"finish_reason":"a"},{"finish_reason":"\ud800"}]}"#,
        r#"{"choices":[{"finish_reason":"a"},{"finish_reason":"\ud83d\ude00"}]}"#,
        r#"{"id":"\ud800"}"#,
        r#"{"id":"\udc00"}"#,
        r#"{"id":"\ud800\u0041"}"#,
        r#"{"id":"\ud800\n"}"#,
        r#"{"id":"\ud800\ud800"}"#,
        r#"{"id":"\ud800\udbff"}"#,
        r#"{"id":"\uD83D\uDE00"}"#,
        r#"{"x":"\ud800"}"#,
        r#"{"\ud800":1}"#,
        r#"{"\u0069d":"k","i\u0064":"dup"}"#,
        r#"{"\u0069d":"k"}"#,
        r#"{"c\u0068oices":[{"delta":{"cont\u0065nt":"x"}}]}"#,
        r#"{"id":"a","id":null}"#,
        r#"{"id":null,"id":null}"#,
        r#"{"x":1,"x":2}"#,
        r#"{"error":null,"error":null}"#,
        r#"{"created":-0}"#,
        r#"{"created":-9223372036854775808}"#,
        r#"{"created":-9223372036854775809}"#,
        r#"{"created":9223372036854775807}"#,
        r#"{"created":9223372036854775808}"#,
        r#"{"created":18446744073709551616}"#,
        r#"{"created":1e400}"#,
        r#"{"created":1.5}"#,
        r#"{"created":true}"#,
        r#"{"x":1e400}"#,
        r#"{"x":-0.0e-0}"#,
        r#"{"x":123456789012345678901234567890}"#,
        r#"{"usage":{"prompt_tokens":-0}}"#,
        r#"{"usage":{"prompt_tokens":-1}}"#,
        r#"{"usage":{"prompt_tokens":18446744073709551615}}"#,
        r#"{"usage":{"prompt_tokens":0,"prompt_tokens":0}}"#,
        r#"{"usage":5}"#,
        r#"{"error":{ }}"#,
        r#"{"error":[ ]}"#,
        r#"{"error":0.0}"#,
        r#"{"error":-0}"#,
        r#"{"error":" "}"#,
        "{\"x\":\"\u{7f}\"}",
        "{\"x\":\"\u{1f}\"}",
        "{\"x\":\"a\tb\"}",
        "\u{feff}{}",
        "{}\u{0}",
        "{} ",
        "{}x",
        "{\"x\":[1 2]}",
        "{\"x\":{\"a\" 1}}",
        "{\"x\":{1:2}}",
        "{\"x\":tru}",
        "{\"x\":nulll}",
    ];
    for case in small {
        assert_same(case);
    }
}

fn ws() -> impl Strategy<Value = &'static str> {
    prop_oneof![12 => Just(""), 1 => Just(" "), 1 => Just("\n\t"), 1 => Just("\r ")]
}

fn string() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => "[a-z0-9 _.-]{1,8}",
        1 => Just("é".to_owned()),
        1 => Just("日本".to_owned()),
        1 => Just("😀".to_owned()),
        1 => prop::sample::select(vec![
            "\\n", "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\r", "\\t", "\\u0041", "\\u00e9",
            "\\ud83d\\ude00", "\\uD83D\\uDE00", "\\ud800", "\\udc00", "\\u0000", "\\u001f",
        ])
        .prop_map(str::to_owned),
        1 => "\\\\u[dD][89abAB][0-9a-fA-F]{2}(\\\\u[dD][0-9a-fA-F]{3})?",
        1 => "\\\\u[dD][c-fC-F][0-9a-fA-F]{2}",
        1 => "\\\\u[0-9a-fA-F]{4}",
    ];
    prop::collection::vec(piece, 0..4).prop_map(|pieces| format!("\"{}\"", pieces.concat()))
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any::<u32>().prop_map(|n| n.to_string()),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => any::<f64>().prop_map(|n| format!("{n:?}")),
        1 => prop::sample::select(vec![
            "0", "-0", "1.5", "1e3", "-1E-3", "2.5e+10", "1e400", "-0.0",
            "18446744073709551615", "18446744073709551616", "9223372036854775807",
            "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
        ])
        .prop_map(str::to_owned),
    ]
}

fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => Just("null".to_owned()),
        1 => Just("true".to_owned()),
        1 => Just("false".to_owned()),
        2 => number(),
        3 => string(),
        1 => Just("\"\"".to_owned()),
    ]
}

/// Keys: every field the dialect reads, escaped spellings, and noise.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![8 => field_key(), 1 => string()]
}

fn field_key() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "id",
        "model",
        "created",
        "error",
        "usage",
        "choices",
        "delta",
        "finish_reason",
        "content",
        "tool_calls",
        "refusal",
        "reasoning_content",
        "reasoning",
        "prompt_tokens",
        "completion_tokens",
        "index",
        "object",
        "role",
        "x",
        "",
        "\\u0069d",
        "cont\\u0065nt",
        "finish\\u005freason",
        "\\ud800",
        "\\ud83d\\ude00",
        "é",
    ])
    .prop_map(|k| format!("\"{k}\""))
}

fn array(items: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    (prop::collection::vec((ws(), items, ws()), 0..4), ws()).prop_map(|(items, inner)| {
        if items.is_empty() {
            return format!("[{inner}]");
        }
        let items: Vec<String> = items
            .into_iter()
            .map(|(a, item, b)| format!("{a}{item}{b}"))
            .collect();
        format!("[{}]", items.join(","))
    })
}

fn object(entries: impl Strategy<Value = (String, String)>) -> impl Strategy<Value = String> {
    (prop::collection::vec((ws(), entries, ws()), 0..6), ws()).prop_map(|(entries, inner)| {
        if entries.is_empty() {
            return format!("{{{inner}}}");
        }
        let entries: Vec<String> = entries
            .into_iter()
            .map(|(a, (k, v), b)| format!("{a}{k}{a}:{b}{v}{b}"))
            .collect();
        format!("{{{}}}", entries.join(","))
    })
}

/// Any JSON value, nested a few levels.
fn value() -> impl Strategy<Value = String> {
    scalar().prop_recursive(4, 24, 4, |inner| {
        prop_oneof![array(inner.clone()), object((key(), inner)),]
    })
}

fn entry(
    name: &'static str,
    values: impl Strategy<Value = String> + 'static,
) -> BoxedStrategy<(String, String)> {
    values.prop_map(move |v| (format!("\"{name}\""), v)).boxed()
}

/// A struct as an object of chosen entries, or as an array of values.
fn record(
    entries: Vec<BoxedStrategy<(String, String)>>,
    fields: impl Strategy<Value = String> + Clone,
) -> impl Strategy<Value = String> {
    prop_oneof![
        8 => object(prop::strategy::Union::new(entries)),
        1 => array(fields),
    ]
}

fn delta() -> impl Strategy<Value = String> {
    let output = || {
        prop_oneof![
            3 => Just("null".to_owned()),
            3 => Just("\"\"".to_owned()),
            2 => Just("[]".to_owned()),
            1 => Just("[ ]".to_owned()),
            3 => string(),
            1 => value(),
        ]
    };
    record(
        vec![
            entry("content", output()),
            entry("tool_calls", output()),
            entry("refusal", output()),
            entry("reasoning_content", output()),
            entry("reasoning", output()),
            entry("role", string()),
            (key(), value()).boxed(),
        ],
        output(),
    )
}

fn choice() -> impl Strategy<Value = String> {
    let finish = prop_oneof![3 => Just("null".to_owned()), 3 => string(), 1 => value()];
    let delta = prop_oneof![6 => delta(), 1 => Just("null".to_owned()), 1 => value()];
    choice_of("delta", delta.boxed(), finish.boxed())
}

/// A choice: its `delta` or `message` (named `name`), finish reason,
/// index, logprobs and noise, as an object or in the array form.
fn choice_of(
    name: &'static str,
    body: BoxedStrategy<String>,
    finish: BoxedStrategy<String>,
) -> impl Strategy<Value = String> {
    record(
        vec![
            entry(name, body.clone()),
            entry("finish_reason", finish.clone()),
            entry("index", number()),
            entry("logprobs", Just("null".to_owned())),
            (key(), value()).boxed(),
        ],
        prop_oneof![body, finish],
    )
}

fn usage() -> impl Strategy<Value = String> {
    let count = || prop_oneof![4 => any::<u32>().prop_map(|n| n.to_string()), 1 => number(), 1 => Just("null".to_owned())];
    record(
        vec![
            entry("prompt_tokens", count()),
            entry("completion_tokens", count()),
            entry("total_tokens", count()),
            (key(), value()).boxed(),
        ],
        count(),
    )
}

fn error() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => prop::sample::select(vec![
            "null", "false", "\"\"", "0", "{}", "[]", "{ }", "[ ]", "-0", "0.0", "true",
        ])
        .prop_map(str::to_owned),
        1 => value(),
    ]
}

/// A chunk-shaped JSON text.
fn chunk() -> impl Strategy<Value = String> {
    top_level(choice().boxed(), "chat.completion.chunk")
}

/// A chat chunk's or answer's top level: each field of any shape, with
/// `choices` most often a list of `choice` and `object` the given type.
fn top_level(choice: BoxedStrategy<String>, object: &'static str) -> impl Strategy<Value = String> {
    let text = || prop_oneof![4 => string(), 1 => Just("null".to_owned()), 1 => value()];
    let created = || prop_oneof![3 => number(), 1 => Just("null".to_owned()), 1 => value()];
    let usage = || prop_oneof![4 => usage(), 1 => Just("null".to_owned()), 1 => value()];
    let choices = move || {
        prop_oneof![
            6 => array(choice.clone()),
            1 => Just("null".to_owned()),
            1 => value(),
        ]
    };
    let body = record(
        vec![
            entry("id", text()),
            entry("model", text()),
            entry("created", created()),
            entry("error", error()),
            entry("usage", usage()),
            entry("choices", choices()),
            entry("choices", choices()),
            entry("object", Just(format!("\"{object}\""))),
            (key(), value()).boxed(),
        ],
        prop_oneof![text(), created(), usage(), choices(), error()],
    );
    (ws(), body, ws()).prop_map(|(a, body, b)| format!("{a}{body}{b}"))
}

/// A chunk as a stream sends most of them: the same text around one
/// string (`content` or another output field) that changes, sometimes a
/// finish reason or usage after it.
fn streamed_chunk() -> impl Strategy<Value = String> {
    let field = prop::sample::select(vec!["content", "refusal", "reasoning_content"]);
    let text = prop_oneof![
        6 => "[a-z0-9 ]{1,12}".prop_map(|t| format!("\"{t}\"")),
        1 => Just("\"\"".to_owned()),
        3 => string(),
        1 => value(),
    ];
    let after = prop::sample::select(vec![
        r#""finish_reason":null}]}"#,
        r#""finish_reason":"stop"}]}"#,
        r#""finish_reason":null,"index":1}]}"#,
        r#""finish_reason":null}],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
        r#""finish_reason":null}],"id":"other"}"#,
        r#""finish_reason":null}],"error":{"message":"x"}}"#,
        r#""finish_reason":null}]} "#,
        r#""finish_reason":null},{"index":1,"delta":{"content":"y"}}]}"#,
    ]);
    // Most providers write the identity first; some after `choices`.
    let identity_last = prop::sample::select(vec!["", r#","id":"a""#, r#","id":"b","model":"n""#]);
    (
        field,
        text,
        ws(),
        prop::bool::weighted(0.6),
        after,
        prop::bool::weighted(0.2),
        identity_last,
    )
        .prop_map(|(field, text, ws, plain, after, last, identity)| {
            let after = if plain {
                r#""finish_reason":null}]}"#
            } else {
                after
            };
            if last {
                let finish = if plain { "null" } else { r#""stop""# };
                format!(
                    r#"{{"choices":[{{"index":0,"delta":{{"{field}":{ws}{text}{ws}}},"finish_reason":{finish}}}]{identity}}}"#
                )
            } else {
                format!(
                    r#"{{"id":"chatcmpl-s","object":"chat.completion.chunk","created":1,"model":"m","choices":[{{"index":0,"delta":{{"{field}":{ws}{text}{ws}}},{after}"#
                )
            }
        })
}

/// A whole answer's choice: a message where a chunk has a delta.
fn whole_choice() -> impl Strategy<Value = String> {
    let finish = prop_oneof![
        3 => prop::sample::select(vec!["stop", "length", "tool_calls", "content_filter"])
            .prop_map(|reason| format!("\"{reason}\"")),
        3 => string(),
        2 => Just("null".to_owned()),
        1 => value(),
    ];
    let message = prop_oneof![
        4 => (string(), string()).prop_map(|(role, content)| format!(r#"{{"role":{role},"content":{content}}}"#)),
        1 => value(),
    ];
    choice_of("message", message.boxed(), finish.boxed())
}

/// A JSON text close to a real answer: a non-empty `choices` of choices
/// with messages, often an id, a model and a usage, rarely an error, and
/// noise, in any order.
fn answer_like() -> impl Strategy<Value = String> {
    let text = || prop_oneof![6 => string(), 1 => Just("null".to_owned()), 1 => value()];
    let count = || prop_oneof![8 => any::<u32>().prop_map(|n| n.to_string()), 1 => number()];
    let usage = (count(), count(), 0..3u8).prop_map(|(p, c, how)| match how {
        0 => format!(r#"{{"prompt_tokens":{p},"completion_tokens":{c},"total_tokens":3}}"#),
        1 => format!(r#"{{"completion_tokens":{c},"prompt_tokens_details":{{"cached_tokens":0}},"prompt_tokens":{p}}}"#),
        _ => format!(r#"{{"prompt_tokens":{p}}}"#),
    });
    let choices = prop::collection::vec(whole_choice(), 1..3)
        .prop_map(|choices| format!("[{}]", choices.join(",")));
    let optional = |name: &'static str, values: BoxedStrategy<String>| {
        prop::option::weighted(0.7, values.prop_map(move |v| (format!("\"{name}\""), v)))
    };
    (
        choices,
        optional("id", text().boxed()),
        optional("model", text().boxed()),
        optional("usage", usage.boxed()),
        optional(
            "error",
            prop_oneof![9 => Just("null".to_owned()), 1 => error()].boxed(),
        ),
        prop::collection::vec((key(), value()), 0..3),
        ws(),
    )
        .prop_flat_map(|(choices, id, model, usage, error, noise, ws)| {
            let mut entries = vec![("\"choices\"".to_owned(), choices)];
            entries.extend([id, model, usage, error].into_iter().flatten());
            entries.extend(noise);
            shuffled_object(entries, ws)
        })
}

/// An object of `entries` in any order, `ws` around each key and value.
fn shuffled_object(
    entries: Vec<(String, String)>,
    ws: &'static str,
) -> impl Strategy<Value = String> {
    Just(entries).prop_shuffle().prop_map(move |entries| {
        let entries: Vec<String> = entries
            .into_iter()
            .map(|(k, v)| format!("{ws}{k}:{ws}{v}"))
            .collect();
        format!("{{{}}}", entries.join(","))
    })
}

/// A whole-answer-shaped JSON text (`chat.completion`): close to a real
/// answer, or any mix of its fields.
fn completion() -> impl Strategy<Value = String> {
    prop_oneof![1 => answer_like(), 1 => any_completion()]
}

/// Any mix of a completion's fields, each of any shape.
fn any_completion() -> impl Strategy<Value = String> {
    top_level(whole_choice().boxed(), "chat.completion")
}

/// The answer check (the skimmer first) against serde's reading alone.
fn compare_answer(body: &[u8]) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        reply::check_answer(body),
        reply::check_answer_in_full(body),
        "{:?}",
        String::from_utf8_lossy(body)
    );
    Ok(())
}

/// Whole answers from the dialect's tests, the provider contracts and the
/// bench's prepared upstream.
const ANSWERS: &[&str] = &[
    r#"{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
    r#"{"choices":[{"finish_reason":"stop","index":0,"message":{"content":"up-tok0 up-tok1 up-tok2 up-tok3 up-tok4 up-tok5 up-tok6 up-tok7 ","role":"assistant"}}],"created":1,"id":"chatcmpl-test","model":"bench","object":"chat.completion","usage":{"completion_tokens":8,"prompt_tokens":2,"total_tokens":10}}"#,
    r#"{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion","created":1741569952,"model":"gpt-4.1-2025-04-14","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I assist you today?","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default"}"#,
    r#"{"id":"chatcmpl-tool","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":30,"completion_tokens":12,"total_tokens":42}}"#,
    r#"{"id":"x","choices":[{"finish_reason":"length"},{"finish_reason":"stop"}],"error":null,"usage":null,"model":null}"#,
    r#"{"id":7,"choices":[{"message":{"finish_reason":"no"}}]}"#,
];

/// Each fixture read both ways by `compare`. The usual ones (as they are
/// and with whitespace around) take the skimmer's way (`skimmed`): the
/// reading is not serde's under another name. The others take the way
/// `others_skimmed` says, when it says.
fn fixtures_agree(
    usual: &[&str],
    others: &[&str],
    compare: fn(&[u8]) -> Result<(), TestCaseError>,
    skimmed: fn(&[u8]) -> bool,
    others_skimmed: Option<bool>,
) {
    for fixture in usual {
        for body in [fixture.to_string(), format!(" \n{fixture}\t\r\n")] {
            if let Err(failure) = compare(body.as_bytes()) {
                panic!("{failure}");
            }
            assert!(skimmed(body.as_bytes()), "{body}");
        }
    }
    for body in others {
        if let Err(failure) = compare(body.as_bytes()) {
            panic!("{failure}");
        }
        if let Some(expected) = others_skimmed {
            assert_eq!(skimmed(body.as_bytes()), expected, "{body}");
        }
    }
}

#[test]
fn fixture_answers_read_the_same() {
    fixtures_agree(
        ANSWERS,
        FIXTURES,
        compare_answer,
        |body| super::skim::skim_completion(body).is_some(),
        None,
    );
}

/// Bytes that make or break JSON when dropped into it.
const MUTANTS: &[u8] = b"{}[]\",:\\0123456789-+.eEntrufals \n\t\x01\x1fxu";

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let byte = prop::sample::select(MUTANTS);
    prop_oneof![
        3 => (any::<usize>(), byte.clone()).prop_map(|(at, b)| Mutation::Flip(at, b)),
        2 => (any::<usize>(), byte).prop_map(|(at, b)| Mutation::Insert(at, b)),
        2 => any::<usize>().prop_map(Mutation::Delete),
        1 => any::<usize>().prop_map(Mutation::Truncate),
    ]
}

/// Applies mutations; `None` when the result is not UTF-8 (event data
/// always is).
fn mutate(text: &str, mutations: &[Mutation]) -> Option<String> {
    let mut bytes = text.as_bytes().to_vec();
    for mutation in mutations {
        let len = bytes.len();
        match *mutation {
            Mutation::Flip(at, byte) if len > 0 => bytes[at % len] = byte,
            Mutation::Insert(at, byte) => bytes.insert(at % (len + 1), byte),
            Mutation::Delete(at) if len > 0 => {
                bytes.remove(at % len);
            }
            Mutation::Truncate(at) => bytes.truncate(at % (len + 1)),
            _ => {}
        }
    }
    String::from_utf8(bytes).ok()
}

fn config(cases: u32) -> Config {
    Config {
        cases,
        // Failures are turned into cases in `edge_cases_read_the_same`
        // rather than files outside this module.
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config(3000))]

    #[test]
    fn generated_chunks_read_the_same(text in chunk()) {
        compare(text.as_bytes())?;
    }

    #[test]
    fn generated_values_read_the_same(text in value()) {
        compare(text.as_bytes())?;
    }

    #[test]
    fn mutated_chunks_read_the_same(
        text in chunk(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        if let Some(mutated) = mutate(&text, &mutations) {
            compare(mutated.as_bytes())?;
        }
    }

    #[test]
    fn chunks_read_the_same_after_an_earlier_chunk(
        first in prop_oneof![chunk(), prop::sample::select(FIXTURES).prop_map(str::to_owned)],
        other in chunk(),
        mutations in prop::collection::vec(mutation(), 1..4),
        how in 0..4u8,
        at in any::<prop::sample::Index>(),
    ) {
        let second = match how {
            0 => other,
            1 => first.clone(),
            2 => mutate(&first, &mutations).unwrap_or(other),
            // The first's text up to a point, then another chunk's tail:
            // the point often lies past the first's prefix.
            _ => {
                let head = cut(&first, at.index(first.len() + 1));
                let from = cut(&other, at.index(other.len() + 1)).len();
                format!("{head}{}", &other[from..])
            }
        };
        compare_stream(&[first, second])?;
    }

    #[test]
    fn streams_read_the_same_chunk_after_chunk(
        chunks in prop::collection::vec(
            prop_oneof![
                8 => streamed_chunk(),
                1 => chunk(),
                1 => prop::sample::select(FIXTURES).prop_map(str::to_owned),
            ],
            1..8,
        ),
        mutations in prop::collection::vec(mutation(), 1..4),
        mutate_at in any::<prop::sample::Index>(),
    ) {
        let mut chunks = chunks;
        let at = mutate_at.index(chunks.len());
        if let Some(mutated) = mutate(&chunks[at], &mutations) {
            chunks.insert(at, mutated);
        }
        compare_stream(&chunks)?;
    }

    #[test]
    fn mutated_fixtures_read_the_same(
        fixture in prop::sample::select(FIXTURES),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        if let Some(mutated) = mutate(fixture, &mutations) {
            compare(mutated.as_bytes())?;
        }
    }
}

/// Three property tests of a reading against its reference (`compare`):
/// on generated texts, on mutations of generated texts and fixtures, and
/// on fixtures with a byte that is not UTF-8.
macro_rules! readings_agree {
    ($generated:ident, $mutated:ident, $not_utf8:ident: $texts:expr, $fixtures:expr, $compare:ident) => {
        proptest! {
            #![proptest_config(config(3000))]

            #[test]
            fn $generated(text in $texts) {
                $compare(text.as_bytes())?;
            }

            #[test]
            fn $mutated(
                text in prop_oneof![$texts, prop::sample::select($fixtures).prop_map(str::to_owned)],
                mutations in prop::collection::vec(mutation(), 1..4),
            ) {
                if let Some(mutated) = mutate(&text, &mutations) {
                    $compare(mutated.as_bytes())?;
                }
            }

            #[test]
            fn $not_utf8(
                fixture in prop::sample::select($fixtures),
                at in any::<prop::sample::Index>(),
                byte in 0x80u8..=0xff,
            ) {
                let mut body = fixture.as_bytes().to_vec();
                let at = at.index(body.len());
                body[at] = byte;
                $compare(&body)?;
            }
        }
    };
}

readings_agree!(
    generated_answers_check_the_same,
    mutated_answers_check_the_same,
    answers_that_are_not_utf8_check_the_same: completion(), ANSWERS, compare_answer
);

/// A stream of usual chunks keeps a template after its second chunk, and
/// chunks that differ from it only in their output string read through it
/// as they read alone; one whose string is empty, or whose text around it
/// differs, does not fit it.
#[test]
fn chunks_that_differ_in_their_output_string_read_through_the_template() {
    let chunk = |text: &str, after: &str| {
        format!(
            r#"{{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{{"index":0,"delta":{{"content":{text}}},"finish_reason":{after}}}]}}"#
        )
    };
    let mut prefix = ChunkPrefix::default();
    let mut choices = ChoiceSet::default();
    let first = chunk(r#""a""#, "null");
    openai::read_chunk_next(false, first.as_bytes(), &mut prefix, &mut choices);
    assert!(
        !prefix.has_template(),
        "the first chunk sets the prefix only"
    );
    let second = chunk(r#""b""#, "null");
    openai::read_chunk_next(false, second.as_bytes(), &mut prefix, &mut choices);
    assert!(prefix.has_template());
    for after in ["null", r#""stop""#] {
        for text in [
            r#""token 7""#,
            r#""\"quoted\" \u00e9""#,
            r#""""#,
            r#""\ud800""#,
            "\"x\u{1}\"",
            r#""unterminated"#,
            "null",
            r#"["x"]"#,
        ] {
            let data = chunk(text, after);
            let mut alone_choices = choices;
            let next = openai::read_chunk_next(false, data.as_bytes(), &mut prefix, &mut choices);
            let alone = openai::read_chunk_next(
                false,
                data.as_bytes(),
                &mut ChunkPrefix::default(),
                &mut alone_choices,
            );
            assert_eq!(
                (next.kind, &next.finish_reason, next.usage),
                (alone.kind, &alone.finish_reason, alone.usage),
                "{data}"
            );
            assert_eq!(choices, alone_choices, "{data}");
        }
    }
}

/// Chunks that differ in a second string (OpenAI's per-chunk
/// `obfuscation`) never fit a template: after a few misses the stream
/// stops keeping one, and every chunk reads as it reads alone.
#[test]
fn a_stream_whose_chunks_never_fit_stops_keeping_templates() {
    let stream: Vec<String> = (0..12)
        .map(|n| {
            format!(
                r#"{{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{{"index":0,"delta":{{"content":"t{n}"}},"finish_reason":null}}],"obfuscation":"{}"}}"#,
                "x".repeat(n + 1)
            )
        })
        .collect();
    if let Err(failure) = compare_stream(&stream) {
        panic!("{failure}");
    }
    let mut prefix = ChunkPrefix::default();
    let mut choices = ChoiceSet::default();
    let mut kept = Vec::new();
    for chunk in &stream {
        openai::read_chunk_next(false, chunk.as_bytes(), &mut prefix, &mut choices);
        kept.push(prefix.has_template());
    }
    assert!(kept[1] && kept[8], "kept while it might fit: {kept:?}");
    assert!(
        !kept[9] && !kept[11],
        "given up after eight misses: {kept:?}"
    );
}

/// A template taken from a chunk whose identity follows its `choices`
/// would hide that identity: such chunks are read in full.
#[test]
fn an_identity_after_the_choices_is_read_from_every_chunk() {
    let chunk = |text: &str, finish: &str, id: &str| {
        format!(
            r#"{{"choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":{finish}}}],"id":"{id}"}}"#
        )
    };
    let stream = [
        chunk("x", "null", "a"),
        chunk("y", "null", "a"),
        chunk("z", r#""stop""#, "b"),
        chunk("w", "null", "a"),
    ];
    if let Err(failure) = compare_stream(&stream) {
        panic!("{failure}");
    }
}

/// A valid chunk that keeps no prefix (here the array form) gives the
/// stream its identity: the next chunk is read whole, not as one with the
/// older prefix's identity.
#[test]
fn a_valid_chunk_without_a_prefix_drops_the_older_one() {
    let usual = |text: &str| {
        format!(
            r#"{{"id":"chatcmpl-s","object":"chat.completion.chunk","created":1,"model":"m","choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":null}}]}}"#
        )
    };
    let stream = [
        usual("a"),
        r#"["c",null,5,null,[1,2],[[{"content":"x"},"stop"]]]"#.to_owned(),
        usual("b"),
    ];
    if let Err(failure) = compare_stream(&stream) {
        panic!("{failure}");
    }
}

/// Generated answers take both ways, skimmer and serde, and reach every
/// kind of outcome, so the agreement above is not vacuous.
#[test]
fn generated_answers_cover_both_readings() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    use crate::dialect::BodyCheck;

    let mut runner = TestRunner::deterministic();
    let strategy = completion();
    let (mut skimmed, mut valid, mut invalid, mut reason, mut usage) = (0, 0, 0, 0, 0);
    for _ in 0..3000 {
        let text = strategy.new_tree(&mut runner).unwrap().current();
        if let Some(answer) = super::skim::skim_completion(text.as_bytes()) {
            skimmed += 1;
            reason += usize::from(answer.finish_reason.is_some());
            usage += usize::from(answer.usage.is_some());
        }
        match reply::check_answer_in_full(text.as_bytes()).0 {
            BodyCheck::Valid { .. } => valid += 1,
            BodyCheck::Invalid { .. } => invalid += 1,
        }
    }
    assert!(
        skimmed >= 300 && valid > skimmed && invalid >= 300 && reason >= 50 && usage >= 100,
        "skimmed={skimmed} valid={valid} invalid={invalid} reason={reason} usage={usage}"
    );
}

/// The generators reach every outcome, so agreement is not vacuous.
#[test]
fn generated_chunks_cover_every_outcome() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    use crate::dialect::ChunkKind;

    let mut runner = TestRunner::deterministic();
    let strategy = chunk();
    let mut kinds = std::collections::HashSet::new();
    let (mut finish, mut usage, mut owned) = (false, false, false);
    for _ in 0..3000 {
        let text = strategy.new_tree(&mut runner).unwrap().current();
        let chunk = openai::read_chunk(false, text.as_bytes());
        kinds.insert(chunk.kind);
        finish |= chunk.finish_reason.is_some();
        usage |= chunk.usage.is_some();
        owned |= matches!(chunk.identity.id, Some(Cow::Owned(_)));
    }
    for kind in [
        ChunkKind::Preamble,
        ChunkKind::Output,
        ChunkKind::Error,
        ChunkKind::Malformed,
    ] {
        assert!(kinds.contains(&kind), "never produced {kind:?}");
    }
    assert!(
        finish && usage && owned,
        "finish={finish} usage={usage} owned={owned}"
    );
}

/// The request read (the skimmer first) against serde's reading alone:
/// the same requirements, spans and errors.
fn compare_request(body: &[u8]) -> Result<(), TestCaseError> {
    let read = request::read(bytes::Bytes::copy_from_slice(body));
    let reference = request::read_in_full(bytes::Bytes::copy_from_slice(body));
    prop_assert_eq!(
        format!("{read:?}"),
        format!("{reference:?}"),
        "{:?}",
        String::from_utf8_lossy(body)
    );
    Ok(())
}

/// Requests from the dialect's tests, the provider contracts and the
/// benches.
const REQUESTS: &[&str] = &[
    r#"{"model":"bench","messages":[{"role":"user","content":"Say hello."}]}"#,
    r#"{"model":"bench","stream":true,"messages":[{"role":"user","content":"Say hello."}]}"#,
    r#"{"model": "gpt-4o", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \"there\"\n"}], "temperature": 0.2, "user": "u-1", "stream": false}"#,
    r#"{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"call_1","content":"42"}],"stream":null}"#,
    r#"{"messages":[],"model":"","metadata":{"a":[1,2,{"b":null}]},"top_p":1e-3}"#,
    r#"{"model":"m","messages":[{"content":"a","content":"b"},{"tool_calls":[],"content":7}]}"#,
    r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":256,"max_completion_tokens":null}"#,
    r#"{"model":"o3","max_completion_tokens":0,"messages":[],"max_tokens":18446744073709551615}"#,
];

/// Requests of other shapes, each read by serde: a judged field, escapes,
/// repeated fields, arrays of parts, wrong types, trailing bytes.
const SERDE_REQUESTS: &[&str] = &[
    r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]}"#,
    r#"{"model":"m","messages":[],"max_tokens":5.0}"#,
    r#"{"model":"m","messages":[],"max_tokens":-1}"#,
    r#"{"model":"m","messages":[],"max_completion_tokens":18446744073709551616}"#,
    r#"{"model":"m","messages":[],"max_tokens":1,"max_tokens":2}"#,
    r#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":false}}"#,
    r#"{"model":"m","messages":[],"tools":[{"type":"function"}],"parallel_tool_calls":true}"#,
    r#"{"model":"m\u0031","messages":[]}"#,
    r#"{"m\u006fdel":"m","messages":[]}"#,
    r#"{"model":"m","model":"n","messages":[]}"#,
    r#"{"model":"m","messages":[],"messages":[]}"#,
    r#"{"model":"m","stream":null,"messages":[],"stream":true}"#,
    r#"{"model":"m","messages":[],"stream":"true"}"#,
    r#"{"model":null,"messages":[]}"#,
    r#"{"model":"m"}"#,
    r#"{"model":"m","messages":{}}"#,
    r#"{"model":"m","messages":[1,"two",[3]]}"#,
    r#"{"model":"m","messages":[]} x"#,
    r#"{"model":"m","messages":[]"#,
    "{\"model\":\"m\",\"messages\":[],\"x\":\"\u{1}\"}",
    "\u{c}{\"model\":\"m\",\"messages\":[]}",
];

#[test]
fn fixture_requests_read_the_same() {
    fixtures_agree(
        REQUESTS,
        SERDE_REQUESTS,
        compare_request,
        |body| super::skim::skim_request(body).is_some(),
        Some(false),
    );
}

/// A message: usually a role and string content, sometimes tool calls,
/// parts, repeats, noise, or no object at all.
fn message() -> impl Strategy<Value = String> {
    let content = prop_oneof![
        6 => string(),
        1 => Just("null".to_owned()),
        1 => Just(r#"[{"type":"text","text":"hi"}]"#.to_owned()),
        1 => value(),
    ];
    let fields = vec![
        entry("role", string()),
        entry("content", content.clone()),
        entry("tool_calls", value()),
        entry("name", string()),
        entry("cont\\u0065nt", content),
        (key(), value()).boxed(),
    ];
    prop_oneof![
        6 => (string(), string()).prop_map(|(role, content)| format!(r#"{{"role":{role},"content":{content}}}"#)),
        3 => object(prop::strategy::Union::new(fields)),
        1 => value(),
    ]
}

/// A JSON text close to a chat request: usually a `model` and a list of
/// messages, often `stream`, sometimes a field the read judges, noise or
/// repeats, in any order.
fn request_like() -> impl Strategy<Value = String> {
    let model = prop_oneof![6 => string(), 1 => Just("null".to_owned()), 1 => value()];
    let stream = prop_oneof![
        2 => Just("true".to_owned()),
        2 => Just("false".to_owned()),
        1 => Just("null".to_owned()),
        1 => scalar(),
    ];
    let messages = prop_oneof![
        8 => prop::collection::vec(message(), 0..4)
            .prop_map(|messages| format!("[{}]", messages.join(","))),
        1 => value(),
    ];
    let judged = prop::sample::select(vec![
        "tools",
        "functions",
        "response_format",
        "stream_options",
        "max_completion_tokens",
        "max_tokens",
        "parallel_tool_calls",
        "n",
        "reasoning_effort",
        "reasoning",
    ])
    .prop_map(|k| format!("\"{k}\""));
    let count = prop_oneof![
        4 => any::<u32>().prop_map(|n| n.to_string()),
        1 => Just("null".to_owned()),
        1 => number(),
    ];
    let optional = |name: &'static str, values: BoxedStrategy<String>, p: f64| {
        prop::option::weighted(p, values.prop_map(move |v| (format!("\"{name}\""), v))).boxed()
    };
    let fields = vec![
        optional("model", model.boxed(), 0.95),
        optional("messages", messages.boxed(), 0.95),
        optional("stream", stream.boxed(), 0.5),
        optional("temperature", number().boxed(), 0.3),
        optional("max_tokens", count.clone().boxed(), 0.3),
        optional("max_completion_tokens", count.boxed(), 0.2),
        prop::option::weighted(0.2, (judged, value())).boxed(),
    ];
    let noise = prop::collection::vec(
        prop_oneof![
            3 => (key(), value()),
            1 => (Just("\"model\"".to_owned()), string()),
            1 => (Just("\"stream\"".to_owned()), Just("false".to_owned())),
            1 => (Just("\"messages\"".to_owned()), Just("[]".to_owned())),
        ],
        0..2,
    );
    (fields, noise, ws()).prop_flat_map(|(fields, noise, ws)| {
        let mut entries: Vec<(String, String)> = fields.into_iter().flatten().collect();
        entries.extend(noise);
        shuffled_object(entries, ws)
    })
}

readings_agree!(
    generated_requests_read_the_same,
    mutated_requests_read_the_same,
    requests_that_are_not_utf8_read_the_same: request_like(), REQUESTS, compare_request
);

/// Generated requests take both ways, skimmer and serde, and reach both
/// outcomes, so the agreement above is not vacuous.
#[test]
fn generated_requests_cover_both_readings() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let strategy = request_like();
    let (mut skimmed, mut read, mut refused, mut streams) = (0, 0, 0, 0);
    for _ in 0..3000 {
        let text = strategy.new_tree(&mut runner).unwrap().current();
        if let Some(usual) = super::skim::skim_request(text.as_bytes()) {
            skimmed += 1;
            streams += usize::from(usual.stream);
        }
        match request::read_in_full(bytes::Bytes::from(text)) {
            Ok(_) => read += 1,
            Err(_) => refused += 1,
        }
    }
    assert!(
        skimmed >= 300 && read > skimmed && refused >= 300 && streams >= 50,
        "skimmed={skimmed} read={read} refused={refused} streams={streams}"
    );
}
