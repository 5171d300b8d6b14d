//! The OpenAI Responses dialect: `/v1/responses` requests (`input` items,
//! `instructions`, provider-hosted tools, `previous_response_id`), typed
//! lifecycle event streams (`response.created` … `response.completed`),
//! `response` objects, and OpenAI's `{"error":{...}}` error bodies.

mod reply;
mod request;
mod stream;
mod translate;

use bytes::{Bytes, BytesMut};
use http::StatusCode;

pub use request::ResponsesRequest;

use super::{
    AnswerFacts, BodyCheck, Chunk, ChunkIdentity, Dialect, ErrorFacts, ErrorReply, ErrorSource,
    NeutralEvent, NeutralRequest, OpenAiChat, RequestError, Requirements, TerminalError,
    TerminalMode,
};
use crate::FailureClass;
use crate::sse::SseEvent;

/// What the Responses dialect keeps of one stream: the last
/// `sequence_number` read (a terminal event continues it) and, for
/// translation, what the stream written so far said.
#[derive(Debug, Default)]
pub struct ResponsesMemo {
    last_sequence: Option<u64>,
    translation: translate::StreamMemo,
}

impl ResponsesMemo {
    /// The `sequence_number` of the next event the client gets: after the
    /// last one read, or written by translation.
    fn next_sequence(&self) -> u64 {
        self.last_sequence
            .map_or(0, |s| s.saturating_add(1))
            .max(self.translation.next_sequence())
    }
}

/// The OpenAI Responses dialect (`POST /v1/responses`).
///
/// - **Requirements**: `input` (a string or items: messages, function
///   calls and their outputs, reasoning, item references) and
///   `instructions` for the estimate; image and file inputs; function
///   `tools` and `parallel_tool_calls`; provider-hosted tools by type
///   ([`Requirements::hosted_tools`]); `max_output_tokens`; `reasoning`
///   (an effort other than `none`, or a summary); `text.format` (JSON
///   schema or object); `stream`; `store` (default `true`);
///   `previous_response_id`, `conversation` or an `item_reference`
///   ([`Requirements::provider_state`]). Every other field passes to a
///   Responses target untouched.
/// - **Upstream**: the client's bytes with the target's `model` spliced in.
/// - **Events**: `response.created`, `response.in_progress`,
///   `response.queued`, and an `output_item.added`, `content_part.added` or
///   summary part that carries no text yet are preamble, held until
///   commit; a non-empty delta of any kind (`output_text`,
///   `function_call_arguments`, `refusal`, `reasoning_summary_text`,
///   `reasoning_text`, ...), an item or part that already carries output
///   (a function call names its tool), an annotation, and a `*.done` with
///   text are output, which commits. `response.completed` ends the stream
///   with its usage (finish reason `completed`), as does a
///   `response.incomplete` with output (its reason:
///   `max_output_tokens`, `content_filter`). `response.failed`, `error`,
///   and a `response.incomplete` with no output are in-band failures.
/// - **Terminal** after commit: `response.failed` in the stream's response
///   id, continuing its `sequence_number`, `status: "failed"`, its `error`
///   carrying one of the API's codes and the gateway's class, phase, bytes
///   and output events sent; then an `error` event that both official
///   SDKs raise `APIError` on (see [`TerminalMode`]).
/// - **Whole answers**: a `response` object, `completed` (or `incomplete`
///   with output), with an `output` array; usage from `usage`.
/// - **Errors**: OpenAI's `{"error":{"message","type","param","code"}}`,
///   as for chat completions.
///
/// ```
/// use bytes::Bytes;
/// use tower_llm_failover::dialect::{ChunkKind, Dialect, OpenAiResponses};
/// use tower_llm_failover::sse::{SseItem, SseScanner};
///
/// let wire = Bytes::from_static(
///     b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n\
///       event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":1,\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"msg_1\",\"role\":\"assistant\",\"content\":[]}}\n\n\
///       event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n\
///       event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
/// );
/// let mut kinds = Vec::new();
/// let mut memo = Default::default();
/// SseScanner::new().feed(&wire, |item| {
///     if let SseItem::Event(event) = item {
///         kinds.push(OpenAiResponses.inspect(&event, &mut memo).kind);
///     }
/// });
/// use ChunkKind::*;
/// assert_eq!(kinds, [Preamble, Preamble, Output, Done]);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenAiResponses;

impl Dialect for OpenAiResponses {
    type Request = ResponsesRequest;
    type Memo = ResponsesMemo;

    fn read_request(&self, body: Bytes) -> Result<(Requirements, ResponsesRequest), RequestError> {
        request::read(body)
    }

    fn upstream_body(&self, request: &ResponsesRequest, model: &str) -> Bytes {
        request::upstream_body(request, model)
    }

    fn inspect<'a>(&self, event: &'a SseEvent, memo: &mut ResponsesMemo) -> Chunk<'a> {
        stream::inspect(event, memo)
    }

    fn terminal(
        &self,
        identity: &ChunkIdentity<'_>,
        finish_reason: &str,
        error: &TerminalError,
        mode: TerminalMode,
    ) -> Bytes {
        stream::terminal(0, identity, finish_reason, error, mode)
    }

    fn stream_terminal(
        &self,
        memo: &ResponsesMemo,
        identity: &ChunkIdentity<'_>,
        finish_reason: &str,
        error: &TerminalError,
        mode: TerminalMode,
    ) -> Bytes {
        stream::terminal(memo.next_sequence(), identity, finish_reason, error, mode)
    }

    /// A Responses stream ends with `response.completed`, which only the
    /// provider can write (it carries the whole response): no frame of the
    /// gateway's stands in for it.
    fn done_frame(&self) -> Bytes {
        Bytes::new()
    }

    fn error_facts(&self, source: ErrorSource<'_>) -> Option<ErrorFacts> {
        match source {
            ErrorSource::Event(event) => stream::error_facts(event.data()),
            ErrorSource::Body(body) => stream::error_facts_of_body(body),
        }
    }

    fn check_answer(&self, body: &[u8]) -> (BodyCheck, AnswerFacts) {
        reply::check_answer(body)
    }

    fn error_body(&self, error: &ErrorReply<'_>) -> Bytes {
        OpenAiChat.error_body(error)
    }

    fn error_status(&self, class: FailureClass, status: StatusCode) -> StatusCode {
        OpenAiChat.error_status(class, status)
    }

    fn name(&self) -> &'static str {
        "openai-responses"
    }

    fn upstream_path(&self) -> Option<&'static str> {
        Some("/v1/responses")
    }

    fn to_neutral(&self, request: &ResponsesRequest) -> Result<NeutralRequest, String> {
        translate::to_neutral(request)
    }

    fn body_from_neutral(&self, request: &NeutralRequest, model: &str) -> Result<Bytes, String> {
        translate::body_from_neutral(request, model)
    }

    fn decode_event(
        &self,
        event: &SseEvent,
        memo: &mut ResponsesMemo,
        out: &mut Vec<NeutralEvent>,
    ) {
        translate::decode_event(event, &mut memo.translation, out);
    }

    fn encode_event(&self, event: &NeutralEvent, memo: &mut ResponsesMemo, out: &mut BytesMut) {
        translate::encode_event(event, &mut memo.translation, out);
    }

    fn encoded_identity<'m>(&self, memo: &'m ResponsesMemo) -> ChunkIdentity<'m> {
        memo.translation.identity()
    }

    fn decode_answer(&self, body: &[u8]) -> Option<Vec<NeutralEvent>> {
        translate::decode_answer(body)
    }

    fn encode_answer(&self, events: &[NeutralEvent]) -> Option<Bytes> {
        translate::encode_answer(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Usage;
    use crate::dialect::{BodyFault, ChunkKind, ProviderState, ResponseFormat};
    use crate::sse::{SseItem, SseScanner};
    use crate::{FailureClass, Phase};
    use serde_json::{Value, json};

    /// (event name, kind, finish reason, usage, id) of every event, read
    /// with one memo as a stream is.
    type Read = (
        String,
        ChunkKind,
        Option<String>,
        Option<Usage>,
        Option<String>,
    );

    fn read_all(wire: &str) -> (Vec<Read>, ResponsesMemo) {
        let mut out = Vec::new();
        let mut memo = ResponsesMemo::default();
        SseScanner::new().feed(&Bytes::copy_from_slice(wire.as_bytes()), |item| {
            if let SseItem::Event(event) = item {
                let chunk = OpenAiResponses.inspect(&event, &mut memo);
                let name = String::from_utf8_lossy(event.event().unwrap_or(b"")).into_owned();
                out.push((
                    name,
                    chunk.kind,
                    chunk.finish_reason.map(|f| f.into_owned()),
                    chunk.usage,
                    chunk.identity.id.map(|i| i.into_owned()),
                ));
            }
        });
        (out, memo)
    }

    fn kinds(reads: &[Read]) -> Vec<ChunkKind> {
        reads.iter().map(|r| r.1).collect()
    }

    use ChunkKind::{Done, Error, Malformed, Output, Preamble};

    #[test]
    fn a_text_answer_holds_its_lifecycle_and_commits_on_the_first_delta() {
        let (reads, memo) = read_all(include_str!("fixtures/text.sse"));
        let mut expected = vec![Preamble; 4];
        expected.extend([Output; 7]);
        // output_text.done, content_part.done, output_item.done repeat
        // the text: output (after commit they change nothing).
        expected.extend([Output, Output, Output, Done]);
        assert_eq!(kinds(&reads), expected);
        assert_eq!(reads[0].4.as_deref(), Some("resp_68a1"));
        let last = reads.last().unwrap();
        assert_eq!(last.2.as_deref(), Some("completed"));
        assert_eq!(
            last.3,
            Some(Usage {
                cached_input_tokens: 12,
                ..Usage::new(36, 9)
            })
        );
        assert_eq!(memo.next_sequence(), reads.len() as u64);
    }

    #[test]
    fn a_function_call_commits_on_its_item_which_names_the_tool() {
        let (reads, _) = read_all(include_str!("fixtures/function_call.sse"));
        let mut expected = vec![Preamble, Preamble, Output];
        expected.extend([Output; 5]);
        expected.extend([Output, Output, Done]);
        assert_eq!(kinds(&reads), expected);
        assert_eq!(reads[2].0, "response.output_item.added");
    }

    #[test]
    fn a_reasoning_summary_is_output() {
        let (reads, _) = read_all(include_str!("fixtures/reasoning.sse"));
        assert_eq!(
            kinds(&reads)[..6],
            [Preamble, Preamble, Preamble, Preamble, Output, Output]
        );
        assert_eq!(reads[4].0, "response.reasoning_summary_text.delta");
        assert_eq!(*kinds(&reads).last().unwrap(), Done);
    }

    #[test]
    fn a_refusal_is_output() {
        let (reads, _) = read_all(include_str!("fixtures/refusal.sse"));
        assert_eq!(
            kinds(&reads)[..6],
            [Preamble, Preamble, Preamble, Preamble, Output, Output]
        );
        assert_eq!(reads[4].0, "response.refusal.delta");
    }

    /// The facts of the stream's in-band error: its code and message.
    fn in_band(wire: &str) -> (Option<String>, Option<String>) {
        let mut facts = None;
        SseScanner::new().feed(&Bytes::copy_from_slice(wire.as_bytes()), |item| {
            if let SseItem::Event(event) = item
                && OpenAiResponses
                    .inspect(&event, &mut ResponsesMemo::default())
                    .kind
                    == Error
            {
                facts = OpenAiResponses.error_facts(ErrorSource::Event(&event));
            }
        });
        let facts = facts.expect("an error event with facts");
        (facts.code, facts.message)
    }

    #[test]
    fn response_failed_before_and_after_output_is_an_in_band_failure() {
        let (reads, _) = read_all(include_str!("fixtures/failed_before_output.sse"));
        assert_eq!(
            kinds(&reads),
            [Preamble, Preamble, Preamble, Preamble, Error]
        );
        // Classified rate limited by the code (tests/responses.rs).
        assert_eq!(
            in_band(include_str!("fixtures/failed_before_output.sse"))
                .0
                .as_deref(),
            Some("rate_limit_exceeded")
        );
        let (reads, _) = read_all(include_str!("fixtures/failed_after_output.sse"));
        assert_eq!(
            kinds(&reads),
            [
                Preamble, Preamble, Preamble, Preamble, Output, Output, Output, Error
            ]
        );
        assert_eq!(
            in_band(include_str!("fixtures/failed_after_output.sse")),
            (
                Some("server_error".to_owned()),
                Some("The model produced invalid content.".to_owned())
            )
        );
    }

    fn event(kind: &str, data: Value) -> String {
        let mut data = data;
        data["type"] = json!(kind);
        format!("event: {kind}\ndata: {data}\n\n")
    }

    #[test]
    fn edge_events() {
        let incomplete = |output: Value| {
            event(
                "response.incomplete",
                json!({"sequence_number": 3, "response": {"id": "resp_1", "status": "incomplete",
                    "incomplete_details": {"reason": "max_output_tokens"}, "output": output,
                    "usage": {"input_tokens": 3, "output_tokens": 50}}}),
            )
        };
        let with_text =
            json!([{"type": "message", "content": [{"type": "output_text", "text": "cut"}]}]);
        let cases: Vec<(String, ChunkKind)> = vec![
            // Incomplete after output ends the answer; with none, it fails.
            (incomplete(with_text), Done),
            (incomplete(json!([])), Error),
            (incomplete(json!([{"type": "reasoning", "summary": []}])), Error),
            (event("error", json!({"code": "server_error", "message": "m", "sequence_number": 2})), Error),
            // `event: error` is an error whatever its data says.
            ("event: error\ndata: {\"type\": \"err\n\n".to_owned(), Error),
            // Unnamed events are read by `type`.
            ("data: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n".to_owned(), Output),
            // An empty delta is no output.
            (event("response.output_text.delta", json!({"delta": ""})), Preamble),
            (event("response.function_call_arguments.delta", json!({"delta": "{"})), Output),
            (event("response.reasoning_text.delta", json!({"delta": "hm"})), Output),
            (event("response.output_text.annotation.added", json!({"annotation": {}})), Output),
            // A hosted tool's call is the model's action: output.
            (event("response.output_item.added", json!({"item": {"type": "web_search_call", "status": "in_progress"}})), Output),
            (event("response.content_part.added", json!({"part": {"type": "output_text", "text": "pre"}})), Output),
            (event("response.output_text.done", json!({"text": ""})), Preamble),
            (event("response.queued", json!({"response": {"id": "resp_1"}})), Preamble),
            (event("response.future_event", json!({})), Preamble),
            // Named one thing, typed another; no response; not JSON.
            ("event: response.created\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n".to_owned(), Malformed),
            (event("response.created", json!({})), Malformed),
            (event("response.output_item.added", json!({})), Malformed),
            ("event: response.output_text.delta\ndata: {\"type\":\n\n".to_owned(), Malformed),
            ("event: response.output_text.delta\ndata: [1]\n\n".to_owned(), Malformed),
        ];
        for (wire, kind) in &cases {
            let (reads, _) = read_all(wire);
            assert_eq!(reads.len(), 1, "{wire}");
            assert_eq!(reads[0].1, *kind, "{wire}");
        }
        let (reads, _) = read_all(&incomplete(
            json!([{"type": "message", "content": [{"type": "output_text", "text": "cut"}]}]),
        ));
        assert_eq!(reads[0].2.as_deref(), Some("max_output_tokens"));
        let (code, message) = in_band(&incomplete(json!([])));
        assert_eq!(code.as_deref(), Some("max_output_tokens"));
        assert!(message.unwrap().contains("no output"));
    }

    fn frames(bytes: &Bytes) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        SseScanner::new().feed(bytes, |item| {
            if let SseItem::Event(event) = item {
                let name = String::from_utf8_lossy(event.event().unwrap_or(b"")).into_owned();
                out.push((name, serde_json::from_slice(event.data()).unwrap()));
            }
        });
        out
    }

    #[test]
    fn the_terminal_continues_the_sequence_in_the_responses_identity() {
        let (_, memo) = read_all(
            include_str!("fixtures/failed_after_output.sse")
                .rsplit_once("event: response.failed")
                .unwrap()
                .0,
        );
        assert_eq!(memo.next_sequence(), 7);
        let identity = ChunkIdentity {
            id: Some("resp_68a1".into()),
            model: Some("gpt-5".into()),
            created: Some(1_756_000_000),
        };
        let error = TerminalError {
            provider_code: Some("server_error".to_owned()),
            bytes_sent: 1234,
            output_events: 3,
            ..TerminalError::new(
                FailureClass::Connect,
                Phase::Committed,
                "the stream was cut",
            )
        };
        let wire =
            OpenAiResponses.stream_terminal(&memo, &identity, "error", &error, TerminalMode::Raise);
        let frames = frames(&wire);
        assert_eq!(frames.len(), 2);
        let (name, failed) = &frames[0];
        assert_eq!(name, "response.failed");
        assert_eq!(failed["type"], "response.failed");
        assert_eq!(failed["sequence_number"], 7);
        let response = &failed["response"];
        assert_eq!(response["id"], "resp_68a1");
        assert_eq!(response["status"], "failed");
        assert_eq!(response["model"], "gpt-5");
        assert_eq!(response["created_at"], 1_756_000_000);
        assert_eq!(response["output"], json!([]));
        assert_eq!(response["error"]["code"], "server_error");
        assert_eq!(response["error"]["type"], "connect");
        assert_eq!(response["error"]["phase"], "committed");
        assert_eq!(response["error"]["bytes_sent"], 1234);
        assert_eq!(response["error"]["output_events"], 3);
        assert_eq!(response["error"]["provider_code"], "server_error");
        // What the SDKs raise on: a top-level `error` object.
        let (name, error_event) = &frames[1];
        assert_eq!(name, "error");
        assert_eq!(error_event["type"], "error");
        assert_eq!(error_event["sequence_number"], 8);
        assert_eq!(error_event["code"], "server_error");
        assert_eq!(error_event["message"], "the stream was cut");
        assert_eq!(error_event["error"]["message"], "the stream was cut");
        assert_eq!(error_event["error"]["phase"], "committed");

        let only = frames_of(&memo, &identity, &error, TerminalMode::ErrorEventOnly);
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].0, "error");
        assert_eq!(only[0].1["sequence_number"], 7);
        let quiet = frames_of(&memo, &identity, &error, TerminalMode::Finish);
        assert_eq!(quiet.len(), 1);
        assert_eq!(quiet[0].0, "response.incomplete");
        assert_eq!(
            quiet[0].1["response"]["incomplete_details"]["reason"],
            "error"
        );
        assert_eq!(quiet[0].1["response"]["stream_error"]["phase"], "committed");
        assert!(quiet[0].1.get("error").is_none(), "no SDK raises on it");

        let limited = TerminalError::new(FailureClass::RateLimited, Phase::Committed, "slow down");
        let rate = frames_of(&memo, &identity, &limited, TerminalMode::Raise);
        assert_eq!(
            rate[0].1["response"]["error"]["code"],
            "rate_limit_exceeded"
        );
    }

    fn frames_of(
        memo: &ResponsesMemo,
        identity: &ChunkIdentity<'_>,
        error: &TerminalError,
        mode: TerminalMode,
    ) -> Vec<(String, Value)> {
        frames(&OpenAiResponses.stream_terminal(memo, identity, "error", error, mode))
    }

    #[test]
    fn whole_responses_are_checked_and_read() {
        let ok = json!({"id": "resp_1", "object": "response", "status": "completed", "model": "gpt-5",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "Hi"}]}],
            "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 2}});
        let (check, facts) = OpenAiResponses.check_answer(ok.to_string().as_bytes());
        assert_eq!(
            check,
            BodyCheck::Valid {
                usage: Some(Usage {
                    cached_input_tokens: 4,
                    ..Usage::new(10, 2)
                }),
                model: Some("gpt-5".to_owned()),
            }
        );
        assert_eq!(facts.id.as_deref(), Some("resp_1"));
        assert_eq!(facts.finish_reason.as_deref(), Some("completed"));
        let cut = json!({"object": "response", "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "Hi"}]}]});
        let (check, facts) = OpenAiResponses.check_answer(cut.to_string().as_bytes());
        assert!(matches!(check, BodyCheck::Valid { .. }));
        assert_eq!(facts.finish_reason.as_deref(), Some("max_output_tokens"));
        let failed = json!({"id": "resp_1", "object": "response", "status": "failed", "output": [],
            "error": {"code": "server_error", "message": "boom"}});
        for (bad, fault) in [
            (failed.to_string(), BodyFault::NoAnswer),
            (
                json!({"object": "response", "status": "incomplete", "output": []}).to_string(),
                BodyFault::NoAnswer,
            ),
            (
                json!({"object": "response", "status": "in_progress", "output": []}).to_string(),
                BodyFault::NoAnswer,
            ),
            (
                json!({"object": "response", "status": "completed"}).to_string(),
                BodyFault::NoAnswer,
            ),
            (
                json!({"object": "chat.completion", "status": "completed", "output": []})
                    .to_string(),
                BodyFault::NoAnswer,
            ),
            (
                json!({"error": {"message": "m", "type": "server_error"}}).to_string(),
                BodyFault::NoAnswer,
            ),
            ("[1]".to_owned(), BodyFault::UnexpectedJson),
            ("{\"status\":".to_owned(), BodyFault::NotJson),
        ] {
            match OpenAiResponses.check_answer(bad.as_bytes()).0 {
                BodyCheck::Invalid { fault: got, .. } => assert_eq!(got, fault, "{bad}"),
                other => panic!("{other:?} for {bad}"),
            }
        }
        let facts = OpenAiResponses
            .error_facts(ErrorSource::Body(failed.to_string().as_bytes()))
            .unwrap();
        assert_eq!(facts.code.as_deref(), Some("server_error"));
        assert_eq!(facts.message.as_deref(), Some("boom"));
        assert!(
            OpenAiResponses
                .error_facts(ErrorSource::Body(ok.to_string().as_bytes()))
                .is_none()
        );
    }

    fn read_json(value: Value) -> Result<(Requirements, ResponsesRequest), RequestError> {
        OpenAiResponses.read_request(Bytes::from(value.to_string()))
    }

    #[test]
    fn reads_what_an_agents_request_needs() {
        let (r, _) = read_json(json!({
            "model": "gpt-5",
            "instructions": "be brief",
            "input": [
                {"type": "message", "role": "developer", "content": "use tools"},
                {"role": "user", "content": [
                    {"type": "input_text", "text": "what is in these?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBOR"},
                    {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBER"}
                ]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}
            ],
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
            "parallel_tool_calls": true,
            "max_output_tokens": 2048,
            "reasoning": {"effort": "high", "summary": "auto"},
            "include": ["reasoning.encrypted_content"],
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
            "store": false,
            "stream": true,
            "prompt_cache_key": "k",
            "client_metadata": {"agent": "x"}
        }))
        .unwrap();
        assert_eq!(r.model, "gpt-5");
        assert!(r.stream && r.include_usage && r.tools && r.parallel_tool_calls && r.reasoning);
        assert!(r.image_input && r.document_input);
        assert!(!r.store && r.hosted_tools.is_empty() && r.provider_state.is_none());
        assert_eq!(r.response_format, Some(ResponseFormat::JsonSchema));
        assert_eq!(r.max_output_tokens, Some(2048));
        assert!(r.input_tokens > 10);

        let (r, _) = read_json(json!({"model": "m", "input": "hi",
            "tools": [{"type": "web_search"}, {"type": "function", "name": "f"}, {"type": "file_search", "vector_store_ids": ["vs_1"]}, {"type": "web_search"}],
            "parallel_tool_calls": false, "reasoning": {"effort": "none"}}))
        .unwrap();
        assert_eq!(r.hosted_tools, ["web_search", "file_search"]);
        assert!(r.tools && !r.parallel_tool_calls && !r.reasoning && r.store && !r.stream);
    }

    #[test]
    fn state_held_by_a_provider_is_named() {
        let state = |extra: Value| {
            let mut body = json!({"model": "m", "input": "hi"});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            read_json(body).unwrap().0.provider_state
        };
        assert_eq!(
            state(json!({"previous_response_id": "resp_9"})),
            Some(ProviderState {
                field: "previous_response_id",
                id: "resp_9".to_owned()
            })
        );
        assert_eq!(
            state(json!({"conversation": "conv_1"})),
            Some(ProviderState {
                field: "conversation",
                id: "conv_1".to_owned()
            })
        );
        assert_eq!(
            state(json!({"conversation": {"id": "conv_2"}})),
            Some(ProviderState {
                field: "conversation",
                id: "conv_2".to_owned()
            })
        );
        assert_eq!(
            state(json!({"input": [{"type": "item_reference", "id": "msg_7"}]})),
            Some(ProviderState {
                field: "item_reference",
                id: "msg_7".to_owned()
            })
        );
        assert_eq!(state(json!({"previous_response_id": null})), None);
    }

    #[test]
    fn fields_a_lenient_provider_would_coerce_are_refused() {
        for (field, value, expected) in [
            ("stream", json!("true"), "a boolean"),
            ("store", json!(1), "a boolean"),
            ("parallel_tool_calls", json!("no"), "a boolean"),
            ("max_output_tokens", json!(5.0), "a non-negative integer"),
            ("model", json!(3), "a string"),
            ("previous_response_id", json!(7), "a string"),
            ("input", json!(7), "a string or an array"),
            (
                "conversation",
                json!({"name": "x"}),
                "a string or an object with an id",
            ),
        ] {
            let mut body = json!({"model": "m", "input": "hi"});
            body[field] = value.clone();
            assert_eq!(
                read_json(body).err(),
                Some(RequestError::WrongType { field, expected }),
                "{field}: {value}"
            );
        }
        assert_eq!(
            read_json(json!({"input": "hi"})).err(),
            Some(RequestError::MissingModel)
        );
        assert_eq!(read_json(json!("x")).err(), Some(RequestError::NotObject));
    }

    #[test]
    fn the_upstream_body_is_the_clients_bytes_with_the_model() {
        let raw = r#"{ "model" : "gpt-5", "input": "hi", "prompt_cache_key": "k", "x_unknown": {"a": [1]}, "store": false }"#;
        let (_, request) = OpenAiResponses
            .read_request(Bytes::from_static(raw.as_bytes()))
            .unwrap();
        let body = OpenAiResponses.upstream_body(&request, "gpt-5-mini");
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{ "model" : "gpt-5-mini", "input": "hi", "prompt_cache_key": "k", "x_unknown": {"a": [1]}, "store": false }"#
        );
    }

    #[test]
    fn errors_have_openais_shape() {
        let body = OpenAiResponses.error_body(&ErrorReply::coded(
            FailureClass::Overloaded,
            "no_available_target",
            "none left",
        ));
        let json: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"]["message"], "none left");
        assert_eq!(json["error"]["code"], "no_available_target");
        assert_eq!(OpenAiResponses.name(), "openai-responses");
        assert_eq!(OpenAiResponses.upstream_path(), Some("/v1/responses"));
    }
}
