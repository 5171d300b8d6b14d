//! Recorded streams of each dialect served to a client of another,
//! through `Failover`, compared byte for byte with hand-checked expected
//! streams in `tests/fixtures/translate/`: text, a tool call with streamed
//! arguments, parallel tool calls, thinking, a refusal, usage, and an
//! in-band error before output (nothing reaches the client: the turn's
//! error answer, in the client's dialect) and after it (the client's
//! terminal event).
//!
//! `UPDATE_TRANSLATE_FIXTURES=1 cargo test --test translate_fixtures`
//! rewrites the expected files; check every line of the diff by hand.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tower::ServiceExt;
use tower_llm_failover::dialect::{AnthropicMessages, Dialect, OpenAiChat, OpenAiResponses};
use tower_llm_failover::failover::{Caps, Failover, Target};
use tower_llm_testing::{FakeProvider, Reply, Step};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A recorded stream, one frame per event (the ids and timestamps in the
/// translated output come from it, so the output is deterministic).
fn recorded(path: &str) -> Reply {
    let wire = std::fs::read_to_string(root().join(path)).unwrap();
    Reply::Stream(
        wire.split_inclusive("\n\n")
            .map(|event| Step::data(event.to_owned()))
            .collect(),
    )
}

/// `got` with every `"created":<seconds>` (and a Responses stream's
/// `"created_at":<seconds>`) set to 0: a stream translated from Messages
/// (which has no creation time) is stamped with the time it was written.
fn timeless(got: &[u8]) -> Vec<u8> {
    let mut text = String::from_utf8_lossy(got).into_owned();
    for key in ["\"created\":", "\"created_at\":"] {
        let mut out = String::with_capacity(text.len());
        let mut rest = &*text;
        while let Some(at) = rest.find(key) {
            let (before, after) = rest.split_at(at + key.len());
            out.push_str(before);
            let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            out.push('0');
            rest = &after[digits..];
        }
        out.push_str(rest);
        text = out;
    }
    text.into_bytes()
}

/// Compares `got` (its timestamps zeroed) with the expected file, or
/// rewrites it on request.
fn check(name: &str, got: &[u8]) {
    let got = &timeless(got);
    let path = root().join("tests/fixtures/translate").join(name);
    if std::env::var_os("UPDATE_TRANSLATE_FIXTURES").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
        return;
    }
    let expected = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (UPDATE_TRANSLATE_FIXTURES=1 writes it)",
            path.display()
        )
    });
    assert_eq!(
        String::from_utf8_lossy(got),
        String::from_utf8_lossy(&expected),
        "{name}"
    );
}

/// What a chat client streaming with usage reads from a Messages target
/// playing `fixture`.
async fn chat_client_reads(fixture: &str) -> (u16, Bytes) {
    let target = FakeProvider::new("claude").always(recorded(fixture));
    let failover = Failover::builder()
        .target(Target::new("claude", target).dialect(AnthropicMessages))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let request = Request::post("/v1/chat/completions")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    let response = failover.oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

/// What a Messages client streaming reads from a chat target playing
/// `fixture`.
async fn messages_client_reads(fixture: &str) -> (u16, Bytes) {
    let target = FakeProvider::new("gpt").always(recorded(fixture));
    let failover = Failover::builder()
        .dialect(AnthropicMessages)
        .target(Target::new("gpt", target).dialect(OpenAiChat))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let request = Request::post("/v1/messages")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","max_tokens":1024,"stream":true,"tools":[{"name":"get_weather","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    let response = failover.oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

#[tokio::test(start_paused = true)]
async fn messages_streams_read_by_a_chat_client() {
    for name in ["text", "thinking", "tool_use", "overloaded_after_40_deltas"] {
        let (status, body) =
            chat_client_reads(&format!("src/dialect/anthropic/fixtures/{name}.sse")).await;
        assert_eq!(status, 200, "{name}");
        check(&format!("messages_{name}.to_chat.sse"), &body);
    }
}

#[tokio::test(start_paused = true)]
async fn a_messages_error_before_output_reaches_a_chat_client_as_the_turns_error() {
    let (status, body) =
        chat_client_reads("src/dialect/anthropic/fixtures/overloaded_after_start.sse").await;
    assert_eq!(status, 503);
    check("messages_overloaded_after_start.to_chat.json", &body);
}

#[tokio::test(start_paused = true)]
async fn chat_streams_read_by_a_messages_client() {
    for name in ["text", "parallel_tool_calls", "reasoning", "refusal"] {
        let (status, body) =
            messages_client_reads(&format!("src/dialect/openai/fixtures/translate/{name}.sse"))
                .await;
        assert_eq!(status, 200, "{name}");
        check(&format!("chat_{name}.to_messages.sse"), &body);
    }
}

#[tokio::test(start_paused = true)]
async fn a_chat_error_reaches_a_messages_client_in_its_own_dialect() {
    let (status, body) =
        messages_client_reads("tests/fixtures/translate/inputs/chat_error_after_output.sse").await;
    assert_eq!(
        status, 200,
        "committed: the stream ends with its terminal event"
    );
    check("chat_error_after_output.to_messages.sse", &body);

    let (status, body) =
        messages_client_reads("tests/fixtures/translate/inputs/chat_error_before_output.sse").await;
    assert_eq!(status, 429, "nothing was sent: the turn's error answer");
    check("chat_error_before_output.to_messages.json", &body);
}

/// What a client of `client`'s dialect reads from a target of `target`'s
/// dialect playing `fixture`, streaming (with usage, when its dialect asks
/// for it) the request `body`, sent to `path`.
async fn reads<C: Dialect, T: Dialect>(
    client: C,
    target: T,
    path: &str,
    body: &'static [u8],
    fixture: &str,
) -> (u16, Bytes) {
    let provider = FakeProvider::new("target").always(recorded(fixture));
    let failover = Failover::builder()
        .dialect(client)
        .target(Target::new("target", provider).dialect(target))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let request = Request::post(path)
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    let response = failover.oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

/// A Responses client's streaming request with a function tool.
const RESPONSES_BODY: &[u8] = br#"{"model":"m","stream":true,"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"},"strict":false}],"input":"hi"}"#;

const CHAT_BODY: &[u8] = br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],"messages":[{"role":"user","content":"hi"}]}"#;

const MESSAGES_BODY: &[u8] = br#"{"model":"m","max_tokens":1024,"stream":true,"tools":[{"name":"get_weather","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test(start_paused = true)]
async fn responses_streams_read_by_chat_and_messages_clients() {
    for name in ["text", "function_calls", "reasoning", "refusal_incomplete"] {
        let fixture = format!("src/dialect/responses/fixtures/translate/{name}.sse");
        let (status, body) = reads(
            OpenAiChat,
            OpenAiResponses,
            "/v1/chat/completions",
            CHAT_BODY,
            &fixture,
        )
        .await;
        assert_eq!(status, 200, "{name}");
        check(&format!("responses_{name}.to_chat.sse"), &body);
        let (status, body) = reads(
            AnthropicMessages,
            OpenAiResponses,
            "/v1/messages",
            MESSAGES_BODY,
            &fixture,
        )
        .await;
        assert_eq!(status, 200, "{name}");
        check(&format!("responses_{name}.to_messages.sse"), &body);
    }
}

#[tokio::test(start_paused = true)]
async fn chat_and_messages_streams_read_by_a_responses_client() {
    for name in ["text", "parallel_tool_calls", "reasoning", "refusal"] {
        let fixture = format!("src/dialect/openai/fixtures/translate/{name}.sse");
        let (status, body) = reads(
            OpenAiResponses,
            OpenAiChat,
            "/v1/responses",
            RESPONSES_BODY,
            &fixture,
        )
        .await;
        assert_eq!(status, 200, "{name}");
        check(&format!("chat_{name}.to_responses.sse"), &body);
    }
    for name in ["text", "thinking", "tool_use", "overloaded_after_40_deltas"] {
        let fixture = format!("src/dialect/anthropic/fixtures/{name}.sse");
        let (status, body) = reads(
            OpenAiResponses,
            AnthropicMessages,
            "/v1/responses",
            RESPONSES_BODY,
            &fixture,
        )
        .await;
        assert_eq!(status, 200, "{name}");
        check(&format!("messages_{name}.to_responses.sse"), &body);
    }
}

#[tokio::test(start_paused = true)]
async fn a_chat_error_reaches_a_responses_client_in_its_own_dialect() {
    let (status, body) = reads(
        OpenAiResponses,
        OpenAiChat,
        "/v1/responses",
        RESPONSES_BODY,
        "tests/fixtures/translate/inputs/chat_error_after_output.sse",
    )
    .await;
    assert_eq!(
        status, 200,
        "committed: the stream ends with its terminal event"
    );
    check("chat_error_after_output.to_responses.sse", &body);

    let (status, body) = reads(
        OpenAiResponses,
        OpenAiChat,
        "/v1/responses",
        RESPONSES_BODY,
        "tests/fixtures/translate/inputs/chat_error_before_output.sse",
    )
    .await;
    assert_eq!(status, 429, "nothing was sent: the turn's error answer");
    check("chat_error_before_output.to_responses.json", &body);
}

#[tokio::test(start_paused = true)]
async fn a_responses_failure_reaches_chat_and_messages_clients_in_their_own_dialects() {
    let after = "src/dialect/responses/fixtures/failed_after_output.sse";
    let before = "src/dialect/responses/fixtures/failed_before_output.sse";
    let chat = (OpenAiChat, "/v1/chat/completions", CHAT_BODY, "to_chat");
    let messages = (
        AnthropicMessages,
        "/v1/messages",
        MESSAGES_BODY,
        "to_messages",
    );
    let (status, body) = reads(chat.0, OpenAiResponses, chat.1, chat.2, after).await;
    assert_eq!(
        status, 200,
        "committed: the stream ends with its terminal event"
    );
    check(
        &format!("responses_failed_after_output.{}.sse", chat.3),
        &body,
    );
    let (status, body) = reads(messages.0, OpenAiResponses, messages.1, messages.2, after).await;
    assert_eq!(
        status, 200,
        "committed: the stream ends with its terminal event"
    );
    check(
        &format!("responses_failed_after_output.{}.sse", messages.3),
        &body,
    );

    let (status, body) = reads(chat.0, OpenAiResponses, chat.1, chat.2, before).await;
    assert_eq!(status, 429, "nothing was sent: the turn's error answer");
    check(
        &format!("responses_failed_before_output.{}.json", chat.3),
        &body,
    );
    let (status, body) = reads(messages.0, OpenAiResponses, messages.1, messages.2, before).await;
    assert_eq!(status, 429, "nothing was sent: the turn's error answer");
    check(
        &format!("responses_failed_before_output.{}.json", messages.3),
        &body,
    );
}
