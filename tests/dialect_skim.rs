//! `OpenAiChat::inspect` through the public path (scanner, then dialect):
//! provider fixtures, borrowing, allocation and hostile nesting. The
//! differential tests against the serde reading live beside the skimmer
//! (`src/dialect/differential.rs`), where that reading is kept.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::borrow::Cow;

use bytes::Bytes;
use tower_llm_failover::dialect::ChatMemo;
use tower_llm_failover::sse::{SseEvent, SseItem, SseScanner};
use tower_llm_failover::{
    Usage, dialect::Chunk, dialect::ChunkKind, dialect::Dialect, dialect::OpenAiChat,
};

fn events(wire: &str) -> Vec<SseEvent> {
    let mut out = Vec::new();
    SseScanner::new().feed(&Bytes::from(wire.to_owned()), |item| {
        if let SseItem::Event(event) = item {
            out.push(event);
        }
    });
    out
}

fn one(wire: &str) -> SseEvent {
    let mut all = events(wire);
    assert_eq!(all.len(), 1, "{wire}");
    all.remove(0)
}

#[test]
fn provider_stream_events_read_as_documented() {
    let cases: &[(&str, ChunkKind, Option<&str>)] = &[
        // OpenAI's first chunk: role and empty content commit nothing.
        (
            "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
            ChunkKind::Preamble,
            None,
        ),
        // Azure's prompt-filter chunk: empty choices.
        (
            "data: {\"choices\":[],\"created\":0,\"id\":\"\",\"model\":\"\",\"object\":\"\",\"prompt_filter_results\":[{\"prompt_index\":0,\"content_filter_results\":{\"hate\":{\"filtered\":false,\"severity\":\"safe\"}}}]}\n\n",
            ChunkKind::Preamble,
            None,
        ),
        (
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"Let me think\"}}]}\n\n",
            ChunkKind::Output,
            None,
        ),
        (
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"\"}}]}}]}\n\n",
            ChunkKind::Output,
            None,
        ),
        // Azure ends a filtered stream with a finish reason, no output.
        (
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"content_filter\"}]}\n\n",
            ChunkKind::Preamble,
            Some("content_filter"),
        ),
        // OpenRouter's mid-stream error chunk.
        (
            "data: {\"id\":\"cmpl-abc123\",\"object\":\"chat.completion.chunk\",\"created\":1234567890,\"model\":\"gpt-3.5-turbo\",\"provider\":\"openai\",\"error\":{\"code\":\"server_error\",\"message\":\"Provider disconnected unexpectedly\"},\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"finish_reason\":\"error\"}]}\n\n",
            ChunkKind::Error,
            Some("error"),
        ),
        // vLLM and Gemini: bare error objects.
        (
            "data: {\"error\":{\"message\":\"EngineCore encountered an issue\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\n",
            ChunkKind::Error,
            None,
        ),
        (
            "data: {\"error\":{\"code\":503,\"message\":\"The model is overloaded. Please try again later.\",\"status\":\"UNAVAILABLE\"}}\n\n",
            ChunkKind::Error,
            None,
        ),
        // Ollama's native error is a string: truthy.
        (
            "data: {\"error\":\"an error was encountered while running the model\"}\n\n",
            ChunkKind::Error,
            None,
        ),
        // Anthropic's named error event.
        (
            "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n",
            ChunkKind::Error,
            None,
        ),
        // Gemini's OpenAI-compat error is an array: not a chunk.
        (
            "data: [{\"error\":{\"code\":429,\"message\":\"Resource has been exhausted (e.g. check quota).\",\"status\":\"RESOURCE_EXHAUSTED\"}}]\n\n",
            ChunkKind::Malformed,
            None,
        ),
        // Data split over lines joins with `\n`, which is JSON whitespace.
        (
            "data: {\"choices\":[{\"delta\":\ndata: {\"content\":\"hi\"}}]}\n\n",
            ChunkKind::Output,
            None,
        ),
        ("data: [DONE]\n\n", ChunkKind::Done, None),
        (
            "event: ping\ndata: {\"type\": \"ping\"}\n\n",
            ChunkKind::Preamble,
            None,
        ),
        (
            "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]} x\n\n",
            ChunkKind::Malformed,
            None,
        ),
    ];
    for (wire, kind, finish) in cases {
        let event = one(wire);
        let chunk = OpenAiChat.inspect(&event, &mut ChatMemo::default());
        assert_eq!(chunk.kind, *kind, "{wire}");
        assert_eq!(chunk.finish_reason.as_deref(), *finish, "{wire}");
    }
}

#[test]
fn usage_and_identity_are_read() {
    let event = one(
        "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1732968000,\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":40,\"total_tokens\":52,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n",
    );
    let chunk = OpenAiChat.inspect(&event, &mut ChatMemo::default());
    assert_eq!(chunk.kind, ChunkKind::Preamble);
    assert_eq!(chunk.usage, Some(Usage::new(12, 40)));
    assert_eq!(chunk.identity.id.as_deref(), Some("chatcmpl-9"));
    assert_eq!(chunk.identity.model.as_deref(), Some("gpt-4o-mini"));
    assert_eq!(chunk.identity.created, Some(1_732_968_000));
}

#[test]
fn plain_strings_are_borrowed_and_escaped_ones_decoded() {
    let plain = one(
        "data: {\"id\":\"chatcmpl-1\",\"model\":\"m\",\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    );
    let chunk = OpenAiChat.inspect(&plain, &mut ChatMemo::default());
    assert!(matches!(
        chunk.identity.id,
        Some(Cow::Borrowed("chatcmpl-1"))
    ));
    assert!(matches!(chunk.identity.model, Some(Cow::Borrowed("m"))));
    assert!(matches!(chunk.finish_reason, Some(Cow::Borrowed("stop"))));

    let escaped = one(
        "data: {\"id\":\"chatcmpl-\\u00e9\\ud83d\\ude00\",\"model\":\"org\\/m\",\"choices\":[{\"delta\":{},\"finish_reason\":\"st\\u006fp\"}]}\n\n",
    );
    let chunk = OpenAiChat.inspect(&escaped, &mut ChatMemo::default());
    assert!(matches!(&chunk.identity.id, Some(Cow::Owned(id)) if id == "chatcmpl-é😀"));
    assert!(matches!(&chunk.identity.model, Some(Cow::Owned(m)) if m == "org/m"));
    assert!(matches!(&chunk.finish_reason, Some(Cow::Owned(f)) if f == "stop"));
}

#[test]
fn inspecting_plain_chunks_allocates_nothing() {
    let wire: String = (0..100)
        .map(|i| {
            format!(
                "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"token {i} with \\\"escapes\\\", \\u00e9 and ünïcode\",\"tool_calls\":null}},\"logprobs\":{{\"content\":[[[[]]]]}},\"finish_reason\":null}}]}}\n\n"
            )
        })
        .collect();
    let events = events(&wire);
    assert_eq!(events.len(), 100);
    let mut kinds = Vec::with_capacity(events.len());
    // One memo per stream: it keeps the first chunk's prefix (its one
    // allocation), and every chunk read after that allocates nothing.
    let mut memo = ChatMemo::default();
    let _ = OpenAiChat.inspect(&events[0], &mut memo);
    let counted = allocation_counter::measure(|| {
        for event in &events {
            kinds.push(OpenAiChat.inspect(event, &mut memo).kind);
        }
    });
    assert_eq!(counted.count_total, 0);
    assert!(kinds.iter().all(|kind| *kind == ChunkKind::Output));

    // An escaped id is decoded, which is the one allocation allowed.
    let escaped = one("data: {\"id\":\"chatcmpl-\\u0031\",\"choices\":[]}\n\n");
    let mut chunk = None;
    let counted =
        allocation_counter::measure(|| chunk = Some(OpenAiChat.inspect(&escaped, &mut memo)));
    assert_eq!(counted.count_total, 1);
    assert_eq!(chunk.unwrap().identity.id.as_deref(), Some("chatcmpl-1"));
}

/// Runs `inspect` on a thread with a small stack, so recursion per nesting
/// level would overflow it.
fn inspect_on_small_stack(wire: String) -> ChunkKind {
    std::thread::Builder::new()
        .stack_size(128 * 1024)
        .spawn(move || {
            let event = one(&wire);
            let chunk: Chunk<'_> = OpenAiChat.inspect(&event, &mut ChatMemo::default());
            chunk.kind
        })
        .unwrap()
        .join()
        .unwrap()
}

#[test]
fn deep_nesting_neither_overflows_nor_confuses() {
    let depth = 10_000;
    let open = "[".repeat(depth);
    let close = "]".repeat(depth);
    assert_eq!(
        inspect_on_small_stack(format!("data: {open}\n\n")),
        ChunkKind::Malformed
    );
    assert_eq!(
        inspect_on_small_stack(format!("data: {{\"x\":{open}\n\n")),
        ChunkKind::Malformed
    );
    // serde skips unknown values of any depth; so does the skimmer.
    assert_eq!(
        inspect_on_small_stack(format!(
            "data: {{\"x\":{open}{close},\"choices\":[{{\"delta\":{{\"content\":\"hi\"}}}}]}}\n\n"
        )),
        ChunkKind::Output
    );
    assert_eq!(
        inspect_on_small_stack(format!(
            "data: {{\"error\":{}0{}}}\n\n",
            "{\"e\":".repeat(depth),
            "}".repeat(depth)
        )),
        ChunkKind::Error
    );
    assert_eq!(
        inspect_on_small_stack(format!("data: {{\"x\":{open}{}}}\n\n", "}".repeat(depth))),
        ChunkKind::Malformed
    );
}
