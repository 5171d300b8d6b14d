//! OpenAI chat-chunk SSE events for scripted streams.

use bytes::Bytes;

/// The completion id every helper here uses.
pub const ID: &str = "chatcmpl-test";

/// The id of the tool call a fake tool-call answer makes.
pub const TOOL_CALL_ID: &str = "call_fake";

/// A chunk in OpenAI's own field order (`id`, `object`, `created`,
/// `model`, `choices`, then `usage`), as the API sends it: `json!` alone
/// would sort the keys, and every chunk would start with `choices`.
fn chunk(model: &str, choices: &str, usage: Option<serde_json::Value>) -> Bytes {
    let model = serde_json::Value::from(model);
    let usage = usage
        .map(|usage| format!(",\"usage\":{usage}"))
        .unwrap_or_default();
    Bytes::from(format!(
        "data: {{\"id\":\"{ID}\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":{model},\"choices\":{choices}{usage}}}\n\n"
    ))
}

/// `choices` with one choice in OpenAI's field order (`index`, `delta`,
/// `finish_reason`), as JSON text (a `Value` would sort the keys again).
fn choice(delta: serde_json::Value, finish_reason: Option<&str>) -> String {
    choice_text(&delta.to_string(), finish_reason)
}

/// [`choice`] with the delta already written as JSON text.
fn choice_text(delta: &str, finish_reason: Option<&str>) -> String {
    let finish_reason = serde_json::Value::from(finish_reason);
    format!("[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish_reason}}}]")
}

/// The role chunk a stream opens with (preamble: no output).
pub fn role(model: &str) -> Bytes {
    chunk(
        model,
        &choice(
            serde_json::json!({"role": "assistant", "content": ""}),
            None,
        ),
        None,
    )
}

/// A content delta.
pub fn content(model: &str, text: &str) -> Bytes {
    chunk(
        model,
        &choice(serde_json::json!({ "content": text }), None),
        None,
    )
}

/// A refusal delta (`{"refusal": text}`), as a model that declines sends
/// it instead of content.
pub fn refusal(model: &str, text: &str) -> Bytes {
    chunk(
        model,
        &choice(serde_json::json!({ "refusal": text }), None),
        None,
    )
}

/// The chunk that opens tool call `index`: its id, `type: function`, the
/// function's name and empty `arguments`, in OpenAI's field order.
pub fn tool_call_start(model: &str, index: u32, id: &str, name: &str) -> Bytes {
    let id = serde_json::Value::from(id);
    let name = serde_json::Value::from(name);
    let delta = format!(
        "{{\"tool_calls\":[{{\"index\":{index},\"id\":{id},\"type\":\"function\",\"function\":{{\"name\":{name},\"arguments\":\"\"}}}}]}}"
    );
    chunk(model, &choice_text(&delta, None), None)
}

/// A piece of tool call `index`'s arguments (JSON text, joined by the
/// client).
pub fn tool_call_arguments(model: &str, index: u32, piece: &str) -> Bytes {
    let piece = serde_json::Value::from(piece);
    let delta = format!(
        "{{\"tool_calls\":[{{\"index\":{index},\"function\":{{\"arguments\":{piece}}}}}]}}"
    );
    chunk(model, &choice_text(&delta, None), None)
}

/// The chunk that sets `finish_reason`.
pub fn finish(model: &str, reason: &str) -> Bytes {
    chunk(model, &choice(serde_json::json!({}), Some(reason)), None)
}

/// The usage chunk (`choices: []`).
pub fn usage(model: &str, input_tokens: u64, output_tokens: u64) -> Bytes {
    chunk(
        model,
        "[]",
        Some(serde_json::json!({
            "prompt_tokens": input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens
        })),
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The fakes write chunks as OpenAI does, identity first, and escape
    /// what they are given.
    #[test]
    fn chunks_come_in_openai_field_order_and_are_json() {
        let text = |b: Bytes| String::from_utf8(b.to_vec()).unwrap_or_default();
        let chunk = text(content("m\"odel", "say \"hi\"\n"));
        assert!(
            chunk.starts_with(
                r#"data: {"id":"chatcmpl-test","object":"chat.completion.chunk","created":1,"model":"m\"odel","choices":[{"index":0,"delta":{"content":"say \"hi\"\n"},"finish_reason":null}]}"#
            ),
            "{chunk}"
        );
        for chunk in [
            role("m"),
            content("m", "x"),
            finish("m", "stop"),
            usage("m", 3, 4),
        ] {
            let chunk = text(chunk);
            let json = chunk
                .strip_prefix("data: ")
                .and_then(|c| c.strip_suffix("\n\n"))
                .unwrap_or_default();
            let value: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
            assert_eq!(value["object"], "chat.completion.chunk", "{chunk}");
            assert!(json.starts_with(r#"{"id":"#), "{chunk}");
        }
        assert!(text(usage("m", 3, 4)).contains(r#""choices":[],"usage":{"#));
        assert!(text(finish("m", "stop")).contains(r#""finish_reason":"stop"}]"#));
    }
}
