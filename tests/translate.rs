//! Targets of another dialect than the client's, through `Failover`: the
//! request translated, the answer read by the target's own dialect (the
//! commit point where it really is) and written in the client's, terminal
//! event included; what a dialect cannot express refused by name; a target
//! of the client's own dialect untouched, byte for byte.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tower::ServiceExt;
use tower_llm_failover::dialect::{AnthropicMessages, OpenAiChat, OpenAiResponses};
use tower_llm_failover::failover::{Capabilities, Caps, Failover, Target};
use tower_llm_failover::observe::TurnRecord;
use tower_llm_testing::{FakeProvider, Reply, Step, chunks};

const MESSAGES_TEXT: &str = include_str!("../src/dialect/anthropic/fixtures/text.sse");
const RESPONSES_TEXT: &str = include_str!("../src/dialect/responses/fixtures/translate/text.sse");
const RESPONSES_CALLS: &str =
    include_str!("../src/dialect/responses/fixtures/translate/function_calls.sse");

/// A recorded Messages stream, one frame per event.
fn messages_stream(wire: &str) -> Reply {
    Reply::Stream(
        wire.split_inclusive("\n\n")
            .map(|event| Step::data(event.to_owned()))
            .collect(),
    )
}

fn chat_request(body: Value) -> Request<Full<Bytes>> {
    Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn messages_request(body: Value) -> Request<Full<Bytes>> {
    Request::post("/v1/messages")
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "prompt-caching-2024-07-31")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// The `data:` payloads of a chat stream, `[DONE]` as a string.
fn chat_events(body: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(body).unwrap();
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|event| {
            let data = event
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or_else(|| panic!("an event without data: {event:?}"));
            if data == "[DONE]" {
                Value::String("[DONE]".into())
            } else {
                serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"))
            }
        })
        .collect()
}

/// The `(event, data)` pairs of a Messages stream.
fn messages_events(body: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(body).unwrap();
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|event| {
            let name = event
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or_else(|| panic!("an event without a name: {event:?}"));
            let data = event
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap();
            (name.to_owned(), serde_json::from_str(data).unwrap())
        })
        .collect()
}

fn chat_text(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

async fn collect(
    response: http::Response<impl http_body::Body<Data = Bytes, Error = impl std::fmt::Debug>>,
) -> (http::StatusCode, TurnRecord, Bytes) {
    let status = response.status();
    let run = response.extensions().get::<TurnRecord>().unwrap().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, run, body)
}

/// A chat stream with one tool call whose arguments come in three pieces.
fn chat_tool_call_stream() -> Reply {
    let chunk = |delta: Value, finish: Value| {
        Step::data(format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-tool", "object": "chat.completion.chunk", "created": 7,
                   "model": "gpt-x", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        ))
    };
    Reply::Stream(vec![
        chunk(json!({"role": "assistant", "content": null}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_abc", "type": "function",
                    "function": {"name": "get_weather", "arguments": ""}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"location\":"}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": " \"Paris\"}"}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        Step::data(format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-tool", "object": "chat.completion.chunk", "created": 7,
                   "model": "gpt-x", "choices": [],
                   "usage": {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}})
        )),
        Step::data("data: [DONE]\n\n"),
    ])
}

#[tokio::test(start_paused = true)]
async fn a_chat_client_served_by_a_messages_target_reads_a_chat_stream() {
    let claude = FakeProvider::new("claude").always(messages_stream(MESSAGES_TEXT));
    let failover = Failover::builder()
        .target(
            Target::new("claude", claude.clone())
                .model("claude-sonnet")
                .dialect(AnthropicMessages),
        )
        .build();
    let request = chat_request(json!({
        "model": "gpt-x", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    }));
    let (status, run, body) = collect(failover.oneshot(request).await.unwrap()).await;
    assert_eq!(status, 200);

    // The request went out in Messages' form, on its path.
    let seen = &claude.seen()[0];
    assert_eq!(seen.uri.path(), "/v1/messages");
    assert_eq!(seen.headers["anthropic-version"], "2023-06-01");
    assert_eq!(seen.body["model"], "claude-sonnet");
    assert_eq!(seen.body["system"], "Be brief.");
    assert_eq!(seen.body["max_tokens"], 4096, "Messages requires one");
    assert_eq!(seen.body["stream"], true);
    assert_eq!(seen.body["messages"][0]["role"], "user");

    // The answer came back as a chat stream.
    let events = chat_events(&body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    for event in &events[..events.len() - 1] {
        assert_eq!(event["object"], "chat.completion.chunk", "{event}");
        let id = event["id"].as_str().unwrap();
        assert!(id.starts_with("chatcmpl-"), "{id}");
    }
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chat_text(&events), "Hello!");
    let finish: Vec<_> = events
        .iter()
        .filter_map(|e| e["choices"][0]["finish_reason"].as_str())
        .collect();
    assert_eq!(finish, ["stop"], "end_turn is stop");
    let usage = events
        .iter()
        .find(|e| e["usage"].is_object())
        .expect("usage was asked for");
    assert_eq!(usage["usage"]["prompt_tokens"], 25);
    assert_eq!(usage["usage"]["completion_tokens"], 15);

    let attempts = run.attempts();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].dialect, "anthropic-messages");
    assert_eq!(attempts[0].finish_reason.as_deref(), Some("end_turn"));
}

#[tokio::test(start_paused = true)]
async fn usage_the_chat_client_did_not_ask_for_is_not_written() {
    let claude = FakeProvider::new("claude").always(messages_stream(MESSAGES_TEXT));
    let failover = Failover::builder()
        .target(Target::new("claude", claude).dialect(AnthropicMessages))
        .build();
    let request = chat_request(json!({
        "model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]
    }));
    let (_, run, body) = collect(failover.oneshot(request).await.unwrap()).await;
    let events = chat_events(&body);
    assert!(
        events
            .iter()
            .all(|e| e.get("usage").is_none_or(Value::is_null)),
        "{events:?}"
    );
    assert_eq!(chat_text(&events), "Hello!");
    // The turn still counted it.
    let usage = run.attempts()[0].usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (25, 15));
}

#[tokio::test(start_paused = true)]
async fn a_messages_client_served_by_a_chat_target_reads_the_tool_call_as_messages_events() {
    let gpt = FakeProvider::new("gpt").always(chat_tool_call_stream());
    let failover = Failover::builder()
        .dialect(AnthropicMessages)
        .target(Target::new("gpt", gpt.clone()).dialect(OpenAiChat))
        .build();
    let request = messages_request(json!({
        "model": "claude-x", "max_tokens": 32000, "stream": true,
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "weather?", "cache_control": {"type": "ephemeral"}}]}]
    }));
    let (status, _, body) = collect(failover.oneshot(request).await.unwrap()).await;
    assert_eq!(status, 200);

    let seen = &gpt.seen()[0];
    assert_eq!(seen.uri.path(), "/v1/chat/completions");
    assert!(seen.headers.get("anthropic-version").is_none());
    assert!(
        seen.headers.get("anthropic-beta").is_none(),
        "betas are advisory"
    );
    assert_eq!(seen.body["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(seen.body["stream_options"]["include_usage"], true);

    let events = messages_events(&body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    let start = &events[0].1["message"];
    assert!(start["id"].as_str().unwrap().starts_with("msg_"), "{start}");
    let tool = events
        .iter()
        .find(|(n, d)| n == "content_block_start" && d["content_block"]["type"] == "tool_use")
        .expect("a tool_use block");
    assert_eq!(
        tool.1["content_block"]["id"], "toolu_abc",
        "call_abc in Messages' form"
    );
    assert_eq!(tool.1["content_block"]["name"], "get_weather");
    let arguments: String = events
        .iter()
        .filter_map(|(_, d)| d["delta"]["partial_json"].as_str())
        .collect();
    let arguments: Value = serde_json::from_str(&arguments).unwrap();
    assert_eq!(arguments, json!({"location": "Paris"}));
    let delta = events.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta.1["usage"]["output_tokens"], 9);
}

#[tokio::test(start_paused = true)]
async fn an_in_band_error_before_output_reroutes_and_the_native_backup_passes_untouched() {
    let overloaded = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"c\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n\
         event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let claude = FakeProvider::new("claude").always(messages_stream(overloaded));
    let wire = chunks::full_stream("backup", 3);
    let backup = FakeProvider::new("backup").always(Reply::Stream(
        wire.iter().cloned().map(Step::Data).collect(),
    ));
    let failover = Failover::builder()
        .target(Target::new("claude", claude.clone()).dialect(AnthropicMessages))
        // Declared in the clients' own dialect: not translated.
        .target(Target::new("backup", backup).dialect(OpenAiChat))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let request = chat_request(json!({
        "model": "m", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "hi"}]
    }));
    let (status, run, body) = collect(failover.oneshot(request).await.unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(claude.calls(), 1);
    // The backup's bytes, exactly as it sent them.
    assert_eq!(body, Bytes::from(wire.concat()));
    let attempts = run.attempts();
    assert_eq!(attempts[0].dialect, "anthropic-messages");
    assert_eq!(
        attempts[0].class.map(|c| c.as_str()),
        Some("overloaded"),
        "read by the Messages dialect"
    );
    assert_eq!(attempts[1].dialect, "openai-chat");
}

#[tokio::test(start_paused = true)]
async fn a_foreign_stream_cut_after_output_ends_in_the_clients_dialect() {
    let cut = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_cut\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"c\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n\
         event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
         event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n";
    let Reply::Stream(mut steps) = messages_stream(cut) else {
        unreachable!()
    };
    steps.push(Step::Error("connection reset".into()));
    let claude = FakeProvider::new("claude").always(Reply::Stream(steps));
    let backup = FakeProvider::new("backup").always(Reply::stream("backup", 3));
    let failover = Failover::builder()
        .target(Target::new("claude", claude).dialect(AnthropicMessages))
        .target(Target::new("backup", backup.clone()))
        .build();
    let request = chat_request(json!({
        "model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]
    }));
    let (_, _, body) = collect(failover.oneshot(request).await.unwrap()).await;
    let events = chat_events(&body);
    assert_eq!(chat_text(&events), "Hel", "the delta, then nothing spliced");
    assert_eq!(backup.calls(), 0);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let terminal = &events[events.len() - 2];
    assert!(terminal["error"].is_object(), "{terminal}");
    assert_eq!(terminal["choices"][0]["finish_reason"], "error");
    assert_eq!(
        terminal["id"], events[0]["id"],
        "the terminal keeps the translated stream's id"
    );
    assert!(terminal["id"].as_str().unwrap().starts_with("chatcmpl-"));
}

#[tokio::test(start_paused = true)]
async fn a_chat_stream_failing_after_output_ends_a_messages_client_with_event_error() {
    let error = Step::data(
        "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"code\":null}}\n\n",
    );
    let gpt = FakeProvider::new("gpt").always(Reply::tokens_then("gpt", 2, vec![error]));
    let failover = Failover::builder()
        .dialect(AnthropicMessages)
        .target(Target::new("gpt", gpt).dialect(OpenAiChat))
        .build();
    let request = messages_request(json!({
        "model": "c", "max_tokens": 64, "stream": true, "messages": [{"role": "user", "content": "hi"}]
    }));
    let (_, _, body) = collect(failover.oneshot(request).await.unwrap()).await;
    let events = messages_events(&body);
    let text: String = events
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "gpt-0 gpt-1 ");
    let (name, data) = events.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(data["type"], "error");
    assert!(!events.iter().any(|(n, _)| n == "message_stop"));
}

#[tokio::test(start_paused = true)]
async fn whole_answers_are_translated_both_ways() {
    // A chat client, a Messages answer.
    let message = json!({
        "id": "msg_whole", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [{"type": "text", "text": "Bonjour"}], "stop_reason": "max_tokens",
        "stop_sequence": null, "usage": {"input_tokens": 11, "output_tokens": 4, "cache_read_input_tokens": 5}
    });
    let claude = FakeProvider::new("claude").always(Reply::Json {
        status: 200,
        headers: vec![],
        body: Bytes::from(message.to_string()),
    });
    let failover = Failover::builder()
        .target(Target::new("claude", claude).dialect(AnthropicMessages))
        .build();
    let request =
        chat_request(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}));
    let (status, _, body) = collect(failover.oneshot(request).await.unwrap()).await;
    assert_eq!(status, 200);
    let completion: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(completion["object"], "chat.completion");
    assert_eq!(completion["id"], "chatcmpl-whole");
    assert_eq!(completion["choices"][0]["message"]["content"], "Bonjour");
    assert_eq!(completion["choices"][0]["finish_reason"], "length");
    assert_eq!(
        completion["usage"]["prompt_tokens"], 16,
        "cache reads count as input"
    );
    assert_eq!(
        completion["usage"]["prompt_tokens_details"]["cached_tokens"],
        5
    );
    assert_eq!(completion["usage"]["completion_tokens"], 4);

    // A Messages client, a chat answer.
    let gpt = FakeProvider::new("gpt").always(Reply::completion("gpt"));
    let failover = Failover::builder()
        .dialect(AnthropicMessages)
        .target(Target::new("gpt", gpt).dialect(OpenAiChat))
        .build();
    let request = messages_request(json!({
        "model": "c", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]
    }));
    let (status, _, body) = collect(failover.oneshot(request).await.unwrap()).await;
    assert_eq!(status, 200);
    let message: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(message["type"], "message");
    assert_eq!(message["id"], "msg_fake");
    assert_eq!(message["content"][0]["text"], "answer from gpt");
    assert_eq!(message["stop_reason"], "end_turn");
    assert_eq!(message["usage"]["input_tokens"], 10);
    assert_eq!(message["usage"]["output_tokens"], 5);
}

#[tokio::test(start_paused = true)]
async fn what_a_dialect_cannot_express_refuses_the_target_by_name() {
    let primary = FakeProvider::new("primary").always(Reply::status(
        503,
        r#"{"error":{"message":"down","type":"server_error","param":null,"code":null}}"#,
    ));
    let claude = FakeProvider::new("claude").always(messages_stream(MESSAGES_TEXT));
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .target(Target::new("backup", claude.clone()).dialect(AnthropicMessages))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let request = chat_request(json!({
        "model": "m", "n": 2, "messages": [{"role": "user", "content": "hi"}]
    }));
    let (status, _, body) = collect(failover.oneshot(request).await.unwrap()).await;
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert_eq!(status, 503, "{text}");
    assert!(
        text.contains("backup (anthropic-messages) cannot express n > 1"),
        "{text}"
    );
    assert_eq!(primary.calls(), 1);
    assert_eq!(claude.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_output_limit_is_defaulted_and_clipped_for_a_translated_target() {
    let claude = FakeProvider::new("claude").always(messages_stream(MESSAGES_TEXT));
    let capabilities = Capabilities {
        max_output_tokens: Some(1_000),
        default_output_tokens: Some(512),
        ..Capabilities::default()
    };
    let failover = Failover::builder()
        .target(
            Target::new("claude", claude.clone())
                .capabilities(capabilities)
                .dialect(AnthropicMessages),
        )
        .build();
    for (asked, sent) in [(None, 512), (Some(5_000), 1_000), (Some(300), 300)] {
        let mut body =
            json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
        if let Some(asked) = asked {
            body["max_completion_tokens"] = json!(asked);
        }
        let (status, _, _) =
            collect(failover.clone().oneshot(chat_request(body)).await.unwrap()).await;
        assert_eq!(status, 200, "a larger limit is clipped, not refused");
        assert_eq!(claude.seen().last().unwrap().body["max_tokens"], sent);
    }
}

#[tokio::test(start_paused = true)]
async fn a_target_of_the_clients_own_dialect_is_not_translated() {
    let wire = chunks::full_stream("gpt", 4);
    let gpt = FakeProvider::new("gpt").always(Reply::Stream(
        wire.iter().cloned().map(Step::Data).collect(),
    ));
    let failover = Failover::builder()
        .target(Target::new("gpt", gpt.clone()).dialect(OpenAiChat))
        .build();
    let body = json!({
        "model": "m", "stream": true, "stream_options": {"include_usage": true},
        "custom_field": {"kept": true}, "messages": [{"role": "user", "content": "hi"}]
    });
    let (_, run, answer) =
        collect(failover.oneshot(chat_request(body.clone())).await.unwrap()).await;
    assert_eq!(answer, Bytes::from(wire.concat()), "byte for byte");
    assert_eq!(gpt.seen()[0].body["custom_field"], json!({"kept": true}));
    assert_eq!(run.attempts()[0].dialect, "openai-chat");
}

// --- the Responses API ------------------------------------------------------

fn responses_request(body: Value) -> Request<Full<Bytes>> {
    Request::post("/v1/responses")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// The `(event, data)` pairs of a Responses stream, each event's name its
/// data's `type`, sequence numbers from 0 by 1.
fn responses_events(body: &[u8]) -> Vec<(String, Value)> {
    let events = messages_events(body);
    for (sequence, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str(), "{data}");
        assert_eq!(data["sequence_number"], sequence, "{data}");
    }
    events
}

#[tokio::test(start_paused = true)]
async fn a_chat_client_served_by_a_responses_target_reads_a_chat_stream() {
    let gpt = FakeProvider::new("gpt").always(messages_stream(RESPONSES_TEXT));
    let failover = Failover::builder()
        .target(
            Target::new("gpt", gpt.clone())
                .model("gpt-4.1")
                .dialect(OpenAiResponses),
        )
        .build();
    let request = chat_request(json!({
        "model": "gpt-x", "stream": true, "stream_options": {"include_usage": true},
        "max_tokens": 5,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "done"}
        ]
    }));
    let (status, run, body) = collect(failover.oneshot(request).await.unwrap()).await;
    assert_eq!(status, 200);

    // The request went out as a Responses request, on its path.
    let seen = &gpt.seen()[0];
    assert_eq!(seen.uri.path(), "/v1/responses");
    assert_eq!(seen.body["model"], "gpt-4.1");
    assert_eq!(seen.body["store"], false, "nothing left stored");
    assert_eq!(seen.body["stream"], true);
    assert_eq!(seen.body["max_output_tokens"], 16, "the API's least");
    assert_eq!(
        seen.body["input"],
        json!([
            {"type": "message", "role": "system", "content": "Be brief."},
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "done"}
        ])
    );
    assert_eq!(
        seen.body["tools"],
        json!([{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": false}])
    );

    // The answer came back as a chat stream.
    let events = chat_events(&body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    for event in &events[..events.len() - 1] {
        assert_eq!(event["object"], "chat.completion.chunk", "{event}");
        assert_eq!(event["id"], "chatcmpl-68c1f0a2b3d4e5f60718293a4b5c6d7e");
        assert_eq!(event["created"], 1_757_540_002);
    }
    assert_eq!(chat_text(&events), "Hello there! How can I help?");
    let finish: Vec<_> = events
        .iter()
        .filter_map(|e| e["choices"][0]["finish_reason"].as_str())
        .collect();
    assert_eq!(finish, ["stop"]);
    let usage = &events.iter().find(|e| e["usage"].is_object()).unwrap()["usage"];
    assert_eq!(usage["prompt_tokens"], 1117);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 1024);
    assert_eq!(usage["completion_tokens"], 9);

    let attempts = run.attempts();
    assert_eq!(attempts[0].dialect, "openai-responses");
    assert_eq!(attempts[0].finish_reason.as_deref(), Some("completed"));
}

#[tokio::test(start_paused = true)]
async fn a_messages_client_served_by_a_responses_target_reads_its_tool_calls() {
    let gpt = FakeProvider::new("gpt").always(messages_stream(RESPONSES_CALLS));
    let failover = Failover::builder()
        .dialect(AnthropicMessages)
        .target(Target::new("gpt", gpt.clone()).dialect(OpenAiResponses))
        .build();
    let request = messages_request(json!({
        "model": "claude-x", "max_tokens": 1024, "stream": true,
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "weather and AAPL?"}]
    }));
    let (status, _, body) = collect(failover.oneshot(request).await.unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(gpt.seen()[0].uri.path(), "/v1/responses");
    assert!(gpt.seen()[0].headers.get("anthropic-version").is_none());

    let events = messages_events(&body);
    let tools: Vec<&Value> = events
        .iter()
        .filter(|(n, d)| n == "content_block_start" && d["content_block"]["type"] == "tool_use")
        .map(|(_, d)| &d["content_block"])
        .collect();
    assert_eq!(tools.len(), 2);
    assert_eq!(
        tools[0]["id"], "toolu_qYxLm3Weather0",
        "call_ in Messages' form"
    );
    assert_eq!(tools[1]["name"], "get_stock_price");
    let delta = events.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta.1["usage"]["output_tokens"], 60);
}

#[tokio::test(start_paused = true)]
async fn a_responses_client_served_by_a_chat_target_reads_a_responses_stream() {
    let gpt = FakeProvider::new("gpt").always(chat_tool_call_stream());
    let failover = Failover::builder()
        .dialect(OpenAiResponses)
        .target(Target::new("gpt", gpt.clone()).dialect(OpenAiChat))
        .build();
    let request = responses_request(json!({
        "model": "gpt-5", "stream": true, "store": true,
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "weather?"}]}],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": true}],
        "reasoning": {"effort": "low", "summary": "auto"},
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k"
    }));
    let (status, run, body) = collect(failover.oneshot(request).await.unwrap()).await;
    assert_eq!(status, 200);

    let seen = &gpt.seen()[0];
    assert_eq!(seen.uri.path(), "/v1/chat/completions");
    assert_eq!(
        seen.body["messages"],
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "weather?"}])
    );
    assert_eq!(seen.body["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(seen.body["tools"][0]["function"]["strict"], true);
    assert_eq!(seen.body["stream_options"]["include_usage"], true);
    assert_eq!(seen.body.get("prompt_cache_key"), None, "a hint, dropped");

    let events = responses_events(&body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let id = &events[0].1["response"]["id"];
    assert_eq!(id, "resp_tool", "chatcmpl-tool in this dialect's form");
    let item = &events[2].1;
    assert_eq!(item["output_index"], 0);
    assert_eq!(item["item"]["call_id"], "call_abc");
    assert_eq!(item["item"]["name"], "get_weather");
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(&completed["id"], id);
    assert_eq!(completed["status"], "completed");
    assert_eq!(
        completed["output"][0]["arguments"],
        "{\"location\": \"Paris\"}"
    );
    assert_eq!(completed["usage"]["input_tokens"], 30);
    assert_eq!(completed["usage"]["output_tokens"], 9);
    assert_eq!(completed["usage"]["total_tokens"], 39);
    assert_eq!(run.attempts()[0].dialect, "openai-chat");
}

#[tokio::test(start_paused = true)]
async fn a_responses_client_served_by_a_messages_target_reads_text_and_usage() {
    let claude = FakeProvider::new("claude").always(messages_stream(MESSAGES_TEXT));
    let failover = Failover::builder()
        .dialect(OpenAiResponses)
        .target(Target::new("claude", claude.clone()).dialect(AnthropicMessages))
        .build();
    let request = responses_request(json!({"model": "m", "stream": true, "input": "hi"}));
    let (status, _, body) = collect(failover.oneshot(request).await.unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(claude.seen()[0].uri.path(), "/v1/messages");
    assert_eq!(
        claude.seen()[0].body["messages"][0]["content"][0]["text"],
        "hi"
    );

    let events = responses_events(&body);
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .filter_map(|(_, d)| d["delta"].as_str())
        .collect();
    assert_eq!(text, "Hello!");
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(events.last().unwrap().0, "response.completed");
    assert_eq!(completed["id"], "resp_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY");
    assert_eq!(completed["output"][0]["content"][0]["text"], "Hello!");
    assert_eq!(completed["usage"]["input_tokens"], 25);
    assert_eq!(completed["usage"]["output_tokens"], 15);
}

#[tokio::test(start_paused = true)]
async fn a_chat_stream_failing_after_output_ends_a_responses_client_with_response_failed() {
    let error = Step::data(
        "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"code\":null}}\n\n",
    );
    let gpt = FakeProvider::new("gpt").always(Reply::tokens_then("gpt", 2, vec![error]));
    let failover = Failover::builder()
        .dialect(OpenAiResponses)
        .target(Target::new("gpt", gpt).dialect(OpenAiChat))
        .build();
    let request = responses_request(json!({"model": "m", "stream": true, "input": "hi"}));
    let (_, _, body) = collect(failover.oneshot(request).await.unwrap()).await;
    // The translated events and the terminal continue one sequence.
    let events = responses_events(&body);
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .filter_map(|(_, d)| d["delta"].as_str())
        .collect();
    assert_eq!(text, "gpt-0 gpt-1 ");
    let (name, failed) = &events[events.len() - 2];
    assert_eq!(name, "response.failed");
    assert_eq!(
        failed["response"]["id"], events[0].1["response"]["id"],
        "the terminal keeps the translated stream's id"
    );
    assert_eq!(events.last().unwrap().0, "error");
    assert!(!events.iter().any(|(n, _)| n == "response.completed"));
}

#[tokio::test(start_paused = true)]
async fn whole_responses_are_translated_both_ways() {
    // A chat client, a Responses answer.
    let response = json!({
        "id": "resp_whole", "object": "response", "created_at": 9, "status": "incomplete",
        "model": "gpt-4.1", "incomplete_details": {"reason": "max_output_tokens"},
        "output": [{"id": "msg_1", "type": "message", "status": "incomplete", "role": "assistant",
                    "content": [{"type": "output_text", "text": "Bonjour", "annotations": []}]}],
        "usage": {"input_tokens": 16, "input_tokens_details": {"cached_tokens": 5},
                  "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 20},
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [], "error": null
    });
    let gpt = FakeProvider::new("gpt").always(Reply::Json {
        status: 200,
        headers: vec![],
        body: Bytes::from(response.to_string()),
    });
    let failover = Failover::builder()
        .target(Target::new("gpt", gpt).dialect(OpenAiResponses))
        .build();
    let request =
        chat_request(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}));
    let (status, _, body) = collect(failover.oneshot(request).await.unwrap()).await;
    assert_eq!(status, 200);
    let completion: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(completion["id"], "chatcmpl-whole");
    assert_eq!(completion["choices"][0]["message"]["content"], "Bonjour");
    assert_eq!(completion["choices"][0]["finish_reason"], "length");
    assert_eq!(completion["usage"]["prompt_tokens"], 16);
    assert_eq!(
        completion["usage"]["prompt_tokens_details"]["cached_tokens"],
        5
    );

    // A Responses client, a chat answer.
    let gpt = FakeProvider::new("gpt").always(Reply::completion("gpt"));
    let failover = Failover::builder()
        .dialect(OpenAiResponses)
        .target(Target::new("gpt", gpt.clone()).dialect(OpenAiChat))
        .build();
    let request = responses_request(json!({"model": "m", "input": "hi"}));
    let (status, _, body) = collect(failover.oneshot(request).await.unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(gpt.seen()[0].body.get("stream"), None);
    let response: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(response["object"], "response");
    assert_eq!(response["id"], "resp_fake");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["output"][0]["type"], "message");
    assert_eq!(
        response["output"][0]["content"][0]["text"],
        "answer from gpt"
    );
    assert_eq!(response["usage"]["input_tokens"], 10);
    assert_eq!(response["usage"]["output_tokens"], 5);
}

#[tokio::test(start_paused = true)]
async fn what_the_responses_dialect_cannot_translate_refuses_the_target_by_name() {
    let gpt = FakeProvider::new("gpt").always(Reply::stream("gpt", 2));
    let failover = Failover::builder()
        .dialect(OpenAiResponses)
        .target(Target::new("backup", gpt.clone()).dialect(OpenAiChat))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    for (extra, reason) in [
        (
            json!({"tools": [{"type": "custom", "name": "grep"}]}),
            "backup (openai-chat) cannot be sent this request: the custom tool grep",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]}),
            "backup (openai-chat) cannot be sent this request: input_file file_id",
        ),
    ] {
        let mut body = json!({"model": "m", "stream": true, "input": "hi"});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        let (status, _, body) = collect(
            failover
                .clone()
                .oneshot(responses_request(body))
                .await
                .unwrap(),
        )
        .await;
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert_ne!(status, 200, "{text}");
        assert!(text.contains(reason), "{text}");
    }
    // What a Responses target cannot express: stop sequences.
    let target = FakeProvider::new("gpt").always(messages_stream(RESPONSES_TEXT));
    let failover = Failover::builder()
        .target(Target::new("backup", target.clone()).dialect(OpenAiResponses))
        .build();
    let request = chat_request(json!({
        "model": "m", "stop": ["END"], "messages": [{"role": "user", "content": "hi"}]
    }));
    let (_, _, body) = collect(failover.oneshot(request).await.unwrap()).await;
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(
        text.contains("backup (openai-responses) cannot express stop sequences"),
        "{text}"
    );
    assert_eq!(gpt.calls() + target.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_hedge_to_a_target_of_another_dialect_wins_and_the_client_reads_its_own() {
    use std::time::Duration;
    use tower_llm_failover::Decision;
    use tower_llm_failover::failover::Hedge;
    // The primary speaks the client's dialect but is slow; the hedge goes
    // to a Messages target, whose stream is translated from its first byte.
    let gpt = FakeProvider::new("gpt").always(Reply::Delayed(
        Duration::from_secs(3),
        Box::new(Reply::stream("primary", 8)),
    ));
    let claude = FakeProvider::new("claude").always(messages_stream(MESSAGES_TEXT));
    let failover = Failover::builder()
        .target(Target::new("gpt", gpt.clone()).dialect(OpenAiChat))
        .target(
            Target::new("claude", claude.clone())
                .model("claude-sonnet")
                .dialect(AnthropicMessages),
        )
        .hedge(Hedge::after(Duration::from_millis(200)).with_budget_percent(100.0))
        .build();
    let request = chat_request(json!({
        "model": "gpt-x", "stream": true,
        "messages": [{"role": "user", "content": "hi"}]
    }));
    let (status, run, body) = collect(failover.oneshot(request).await.unwrap()).await;
    assert_eq!(status, 200);

    // The hedge went out in Messages' form.
    assert_eq!(claude.seen()[0].uri.path(), "/v1/messages");
    assert_eq!(claude.seen()[0].body["model"], "claude-sonnet");
    // The client read one whole chat stream, the translated one, and
    // nothing of the primary's.
    let events = chat_events(&body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    for event in &events[..events.len() - 1] {
        assert_eq!(event["object"], "chat.completion.chunk", "{event}");
    }
    assert_eq!(chat_text(&events), "Hello!");
    assert!(!String::from_utf8_lossy(&body).contains("primary"));
    // The primary was sent, then dropped before its head.
    assert_eq!((gpt.calls(), claude.calls()), (1, 1));
    assert_eq!(gpt.tally().cut(), 1);
    assert_eq!(gpt.tally().frames(), 0);

    let mut attempts = run.attempts();
    attempts.sort_by_key(|a| a.attempt);
    let seen: Vec<_> = attempts
        .iter()
        .map(|a| (&*a.target, a.dialect, a.decision, a.hedged))
        .collect();
    assert_eq!(
        seen,
        [
            ("gpt", "openai-chat", Decision::LostRace, false),
            ("claude", "anthropic-messages", Decision::Committed, true),
        ]
    );
    assert_eq!(attempts[1].finish_reason.as_deref(), Some("end_turn"));
}
