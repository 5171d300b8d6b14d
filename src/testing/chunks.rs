//! OpenAI chat-chunk SSE events for scripted streams.

use bytes::Bytes;

/// The completion id every helper here uses.
pub const ID: &str = "chatcmpl-test";

fn event(json: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {json}\n\n"))
}

/// The role chunk a stream opens with (preamble: no output).
pub fn role(model: &str) -> Bytes {
    event(&serde_json::json!({
        "id": ID, "object": "chat.completion.chunk", "created": 1, "model": model,
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]
    }))
}

/// A content delta.
pub fn content(model: &str, text: &str) -> Bytes {
    event(&serde_json::json!({
        "id": ID, "object": "chat.completion.chunk", "created": 1, "model": model,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]
    }))
}

/// The chunk that sets `finish_reason`.
pub fn finish(model: &str, reason: &str) -> Bytes {
    event(&serde_json::json!({
        "id": ID, "object": "chat.completion.chunk", "created": 1, "model": model,
        "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]
    }))
}

/// The usage chunk (`choices: []`).
pub fn usage(model: &str, prompt_tokens: u64, completion_tokens: u64) -> Bytes {
    event(&serde_json::json!({
        "id": ID, "object": "chat.completion.chunk", "created": 1, "model": model,
        "choices": [],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens}
    }))
}

/// `data: [DONE]`.
pub fn done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

/// A keep-alive comment.
pub fn keep_alive() -> Bytes {
    Bytes::from_static(b": keep-alive\n\n")
}

/// OpenAI's in-band 429 (`data: {"error":...}`).
pub fn rate_limit_error() -> Bytes {
    Bytes::from_static(
        b"data: {\"error\":{\"message\":\"Rate limit reached for gpt-4o-mini in organization org-x on tokens per min (TPM): Limit 200000, Used 199434, Requested 2299. Please try again in 519ms.\",\"type\":\"tokens\",\"param\":null,\"code\":\"rate_limit_exceeded\"}}\n\n",
    )
}

/// A whole healthy stream: role chunk, `tokens` content chunks, finish,
/// `[DONE]`. Token texts carry `model` so a spliced answer is visible.
pub fn full_stream(model: &str, tokens: usize) -> Vec<Bytes> {
    let mut out = vec![role(model)];
    out.extend((0..tokens).map(|i| content(model, &format!("{model}-{i} "))));
    out.push(finish(model, "stop"));
    out.push(done());
    out
}
