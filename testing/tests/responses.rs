//! `FakeUpstream` speaking the OpenAI Responses API over real HTTP on
//! 127.0.0.1: the event stream, the tool call, the whole answer, every
//! fault, and the refusal on all three wires. Every wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tower_llm_testing::upstream::{FakeUpstream, Fault, REFUSAL};

/// Bound on any wait that should end at once; only reached on failure.
const PATIENCE: Duration = Duration::from_secs(5);
/// How long "nothing arrives" is watched for, once what must arrive has.
const QUIET: Duration = Duration::from_millis(60);

/// POSTs `body` to `path` on its own HTTP/1.1 connection, with `headers`.
async fn post_with(
    fake: &FakeUpstream,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Response<Incoming> {
    let stream = timeout(PATIENCE, TcpStream::connect(fake.addr()))
        .await
        .expect("connected in time")
        .unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = Request::post(path)
        .header("host", fake.addr().to_string())
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    timeout(PATIENCE, sender.send_request(request))
        .await
        .expect("response head in time")
        .unwrap()
}

async fn post(fake: &FakeUpstream, path: &str, body: &Value) -> Response<Incoming> {
    post_with(fake, path, &[], body).await
}

async fn responses(fake: &FakeUpstream, body: &Value) -> Response<Incoming> {
    post(fake, "/v1/responses", body).await
}

fn stream_request(model: &str) -> Value {
    json!({"model": model, "stream": true, "input": "hi there",
           "instructions": "Be brief.", "max_output_tokens": 64})
}

fn tool_request(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream,
           "input": [{"role": "user", "content": [{"type": "input_text", "text": "weather in Paris?"}]}],
           "tools": [{"type": "function", "name": "get_weather",
                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]})
}

async fn json_body(response: Response<Incoming>) -> Value {
    let bytes = timeout(PATIENCE, response.into_body().collect())
        .await
        .expect("body in time")
        .unwrap()
        .to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[derive(Debug, PartialEq)]
enum End {
    Clean,
    Error,
    Silent,
}

/// One SSE event: its name, and its data as JSON (`Err` with the raw text
/// when the data is not JSON).
#[derive(Debug)]
struct Event {
    name: String,
    data: Result<Value, String>,
}

impl Event {
    fn json(&self) -> &Value {
        self.data.as_ref().expect("JSON data")
    }
}

/// Reads SSE events until the body ends, fails, or stays silent for
/// `quiet`.
async fn read_events(body: &mut Incoming, quiet: Duration) -> (Vec<Event>, End) {
    let mut buffer = Vec::new();
    let mut events = Vec::new();
    let end = loop {
        match timeout(quiet, body.frame()).await {
            Err(_) => break End::Silent,
            Ok(None) => break End::Clean,
            Ok(Some(Err(_))) => break End::Error,
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    buffer.extend_from_slice(&data);
                }
                while let Some(at) = buffer.windows(2).position(|w| w == b"\n\n") {
                    let block: Vec<u8> = buffer.drain(..at + 2).collect();
                    events.push(parse_event(&String::from_utf8(block).unwrap()));
                }
            }
        }
    };
    assert!(buffer.is_empty(), "a partial event at the end: {buffer:?}");
    (events, end)
}

fn parse_event(block: &str) -> Event {
    let mut name = None;
    let mut data = None;
    for line in block.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            assert!(name.replace(n.to_owned()).is_none(), "{block}");
        } else if let Some(d) = line.strip_prefix("data: ") {
            assert!(data.replace(d.to_owned()).is_none(), "{block}");
        } else {
            assert!(line.is_empty(), "unexpected line {line:?} in {block:?}");
        }
    }
    let data = data.expect("a data line");
    Event {
        name: name.expect("an event line"),
        data: serde_json::from_str(&data).map_err(|_| data),
    }
}

/// Reads a whole stream that must end cleanly.
async fn stream(fake: &FakeUpstream, body: &Value) -> Vec<Event> {
    let response = responses(fake, body).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let (events, end) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(end, End::Clean);
    events
}

/// The events' names.
fn names(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.name.as_str()).collect()
}

/// Every JSON event's `type` is its name, and the sequence numbers count
/// up from 0 (a malformed event's number is read from its text).
fn assert_well_formed(events: &[Event]) {
    for (i, event) in events.iter().enumerate() {
        let sequence = match &event.data {
            Ok(data) => {
                assert_eq!(data["type"], event.name, "{data}");
                data["sequence_number"].as_u64().unwrap()
            }
            Err(text) => {
                let (_, after) = text.split_once("\"sequence_number\":").unwrap();
                let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
                digits.parse().unwrap()
            }
        };
        assert_eq!(sequence, u64::try_from(i).unwrap(), "{event:?}");
    }
}

/// The `delta`s of the events named `name`.
fn deltas(events: &[Event], name: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.name == name)
        .map(|e| e.json()["delta"].as_str().unwrap().to_owned())
        .collect()
}

fn text_deltas(events: &[Event]) -> Vec<String> {
    deltas(events, "response.output_text.delta")
}

fn tokens(name: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{name}-tok{i} ")).collect()
}

fn event<'a>(events: &'a [Event], name: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no {name} in {:?}", names(events)))
        .json()
}

const PREAMBLE: [&str; 4] = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
];

#[tokio::test]
async fn a_text_stream_is_the_documented_event_sequence() {
    let fake = FakeUpstream::start("alpha").await;
    let events = stream(&fake, &stream_request("gpt-4o#fault:tokens=3")).await;
    assert_well_formed(&events);
    let mut expected = PREAMBLE.to_vec();
    expected.extend(["response.output_text.delta"; 3]);
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names(&events), expected);

    let created = &events[0].json()["response"];
    assert_eq!(created["id"], "resp_fake");
    assert_eq!(created["object"], "response");
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["model"], "gpt-4o#fault:tokens=3");
    assert_eq!(created["output"], json!([]));
    assert_eq!(created["usage"], Value::Null);
    assert_eq!(created["error"], Value::Null);
    assert_eq!(created["instructions"], "Be brief.");
    assert_eq!(created["max_output_tokens"], 64);
    assert_eq!(created["tool_choice"], "auto");
    assert_eq!(created["parallel_tool_calls"], true);
    assert_eq!(created["text"], json!({"format": {"type": "text"}}));
    assert!(created["created_at"].is_u64());
    assert_eq!(events[1].json()["response"], *created);

    let added = events[2].json();
    assert_eq!(added["output_index"], 0);
    assert_eq!(
        added["item"],
        json!({"id": "msg_fake_0", "type": "message", "status": "in_progress",
               "role": "assistant", "content": []})
    );
    let part = events[3].json();
    assert_eq!(
        (
            &part["item_id"],
            &part["output_index"],
            &part["content_index"]
        ),
        (&json!("msg_fake_0"), &json!(0), &json!(0))
    );
    assert_eq!(
        part["part"],
        json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
    );
    for delta in &events[4..7] {
        let delta = delta.json();
        assert_eq!(delta["item_id"], "msg_fake_0");
        assert_eq!(delta["logprobs"], json!([]));
    }
    assert_eq!(text_deltas(&events), tokens("alpha", 3));

    let text = text_deltas(&events).concat();
    assert_eq!(event(&events, "response.output_text.done")["text"], text);
    assert_eq!(
        event(&events, "response.content_part.done")["part"]["text"],
        text
    );
    let item = &event(&events, "response.output_item.done")["item"];
    assert_eq!(item["status"], "completed");
    assert_eq!(item["content"][0]["text"], text);

    let completed = &event(&events, "response.completed")["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["output"], json!([item]));
    assert_eq!(completed["output"][0]["content"][0]["text"], text);
    // "hi there" and "Be brief.": 4 words in.
    assert_eq!(
        completed["usage"],
        json!({"input_tokens": 4, "input_tokens_details": {"cached_tokens": 0},
               "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0},
               "total_tokens": 7})
    );
    assert_eq!(fake.attempts(), 1);
}

#[tokio::test]
async fn events_start_with_their_type_then_their_sequence_number() {
    let fake = FakeUpstream::start("p").await;
    let response = responses(&fake, &stream_request("m#fault:tokens=1")).await;
    let bytes = timeout(PATIENCE, response.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(
        text.starts_with(
            "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_fake\",\"object\":\"response\","
        ),
        "{text}"
    );
    assert!(text.ends_with("}\n\n"));
    assert!(!text.contains("[DONE]"));
}

#[tokio::test]
async fn a_request_with_a_function_tool_streams_a_function_call() {
    let fake = FakeUpstream::start("p").await;
    let events = stream(&fake, &tool_request("m#fault:tokens=2", true)).await;
    assert_well_formed(&events);
    let expected = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ];
    assert_eq!(names(&events), expected);
    assert_eq!(
        events[2].json()["item"],
        json!({"id": "fc_fake_0", "type": "function_call", "status": "in_progress",
               "arguments": "", "call_id": "call_fake", "name": "get_weather"})
    );
    let pieces = deltas(&events, "response.function_call_arguments.delta");
    for delta in &events[3..7] {
        assert_eq!(delta.json()["item_id"], "fc_fake_0");
        assert_eq!(delta.json()["output_index"], 0);
    }
    let arguments = pieces.concat();
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        json!({"q": "p-tok0 p-tok1 "})
    );
    let done = event(&events, "response.function_call_arguments.done");
    assert_eq!(done["arguments"], arguments);
    assert_eq!(done["name"], "get_weather");
    let item = &event(&events, "response.output_item.done")["item"];
    assert_eq!(item["status"], "completed");
    assert_eq!(item["arguments"], arguments);
    let completed = &event(&events, "response.completed")["response"];
    assert_eq!(completed["output"], json!([item]));
    assert_eq!(completed["tools"][0]["name"], "get_weather");
    assert_eq!(completed["usage"]["output_tokens"], 2);
    assert_eq!(completed["usage"]["input_tokens"], 3);
    assert!(text_deltas(&events).is_empty());
}

#[tokio::test]
async fn a_whole_answer_is_the_completed_response_object() {
    let fake = FakeUpstream::start("p").await;
    let request =
        json!({"model": "m#fault:tokens=2", "input": [{"role": "user", "content": "hello"}]});
    let response = responses(&fake, &request).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/json");
    let body = json_body(response).await;
    assert_eq!(body["id"], "resp_fake");
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "completed");
    assert_eq!(
        body["output"],
        json!([{"id": "msg_fake_0", "type": "message", "status": "completed",
                "role": "assistant", "content": [
                    {"type": "output_text", "text": "p-tok0 p-tok1 ", "annotations": [], "logprobs": []}]}])
    );
    assert_eq!(body["usage"]["input_tokens"], 1);
    assert_eq!(body["usage"]["output_tokens"], 2);
    assert_eq!(body["usage"]["total_tokens"], 3);

    let body = json_body(responses(&fake, &tool_request("m#fault:tokens=1", false)).await).await;
    let call = &body["output"][0];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["call_id"], "call_fake");
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["arguments"], r#"{"q": "p-tok0 "}"#);
}

#[tokio::test]
async fn a_bad_request_is_an_openai_400_naming_the_parameter() {
    let fake = FakeUpstream::start("p").await;
    for (body, param, code) in [
        (
            json!({"input": "hi"}),
            "model",
            "missing_required_parameter",
        ),
        (json!({"model": "m"}), "input", "missing_required_parameter"),
        (json!({"model": 3, "input": "hi"}), "model", "invalid_type"),
        (json!({"model": "m", "input": 3}), "input", "invalid_type"),
    ] {
        let response = responses(&fake, &body).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{body}");
        let error = json_body(response).await;
        assert_eq!(error["error"]["type"], "invalid_request_error");
        assert_eq!(error["error"]["param"], param);
        assert_eq!(error["error"]["code"], code);
        assert!(error["error"]["message"].as_str().unwrap().contains(param));
    }
    let response = responses(&fake, &json!({"model": "fault:explode", "input": "x"})).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(json_body(response).await["error"]["message"].is_string());
    assert_eq!(fake.attempts(), 5);
}

#[tokio::test]
async fn a_status_fault_is_chats_error_body_and_headers() {
    let fake = FakeUpstream::start("p").await;
    let body = stream_request("fault:status=429;retry_after=2;retry_after_ms=1500");
    let response = responses(&fake, &body).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "2");
    assert_eq!(response.headers()["retry-after-ms"], "1500");
    assert_eq!(response.headers()["content-type"], "application/json");
    assert!(
        response
            .headers()
            .get("anthropic-ratelimit-requests-limit")
            .is_none()
    );
    let error = json_body(response).await;
    assert_eq!(error["error"]["code"], "rate_limit_exceeded");
    assert!(error["error"]["message"].is_string());

    let response = responses(&fake, &stream_request("fault:status=503")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(json_body(response).await["error"]["type"], "server_error");
}

#[tokio::test]
async fn error_after_zero_is_response_failed_before_any_output() {
    let fake = FakeUpstream::start("p").await;
    let events = stream(&fake, &stream_request("fault:error_after=0")).await;
    assert_well_formed(&events);
    let mut expected = PREAMBLE.to_vec();
    expected.push("response.failed");
    assert_eq!(names(&events), expected);
    let failed = &events[4].json()["response"];
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"]["code"], "server_error");
    assert!(failed["error"]["message"].is_string());
    assert_eq!(failed["output"], json!([]));

    // A function call's item names the tool: it is output, so it comes
    // after the failure point.
    let events = stream(&fake, &tool_request("fault:error_after=0", true)).await;
    assert_eq!(
        names(&events),
        [
            "response.created",
            "response.in_progress",
            "response.failed"
        ]
    );
}

#[tokio::test]
async fn error_after_n_is_n_deltas_then_response_failed() {
    let fake = FakeUpstream::start("p").await;
    let events = stream(
        &fake,
        &stream_request("fault:error_after=3;error=rate_limit"),
    )
    .await;
    assert_well_formed(&events);
    assert_eq!(text_deltas(&events), tokens("p", 3));
    assert_eq!(events.len(), 4 + 3 + 1);
    let last = events.last().unwrap();
    assert_eq!(last.name, "response.failed");
    assert_eq!(
        last.json()["response"]["error"]["code"],
        "rate_limit_exceeded"
    );
    assert!(!names(&events).contains(&"response.completed"));

    // Whole: a 200 with the failed response object.
    let body = json!({"model": "fault:error_after=1", "input": "x"});
    let body = json_body(responses(&fake, &body).await).await;
    assert_eq!(body["status"], "failed");
    assert_eq!(body["error"]["code"], "server_error");
}

#[tokio::test]
async fn reset_after_40_is_exactly_40_deltas_then_an_error() {
    let fake = FakeUpstream::start("p").await;
    let response = responses(&fake, &stream_request("fault:reset_after=40;tokens=80")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let (events, end) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(end, End::Error);
    assert_well_formed(&events);
    assert_eq!(text_deltas(&events), tokens("p", 40));
    assert_eq!(events.len(), 4 + 40);

    // Whole: half the JSON, then the reset.
    let body = json!({"model": "fault:reset_after=1", "input": "x"});
    let response = responses(&fake, &body).await;
    assert!(
        timeout(PATIENCE, response.into_body().collect())
            .await
            .unwrap()
            .is_err()
    );
    // The fake goes on serving.
    let events = stream(&fake, &stream_request("m#fault:tokens=2")).await;
    assert_eq!(text_deltas(&events), tokens("p", 2));
}

#[tokio::test]
async fn malformed_at_n_breaks_one_event_and_the_stream_goes_on() {
    let fake = FakeUpstream::start("p").await;
    let events = stream(&fake, &stream_request("fault:malformed_at=2;tokens=4")).await;
    assert_well_formed(&events);
    let broken: Vec<usize> = (0..events.len())
        .filter(|&i| events[i].data.is_err())
        .collect();
    // The preamble, deltas 0 and 1, then the broken event.
    assert_eq!(broken, [6]);
    assert_eq!(events[6].name, "response.output_text.delta");
    assert!(
        events[6]
            .data
            .as_ref()
            .unwrap_err()
            .ends_with("\"delta\":\"p-brok")
    );
    assert_eq!(text_deltas(&events[..6]), tokens("p", 2));
    assert_eq!(text_deltas(&events[7..]), tokens("p", 4)[2..]);
    assert_eq!(events.last().unwrap().name, "response.completed");
}

#[tokio::test]
async fn eof_after_n_and_no_done_end_without_response_completed() {
    let fake = FakeUpstream::start("p").await;
    let events = stream(&fake, &stream_request("fault:eof_after=3")).await;
    assert_well_formed(&events);
    assert_eq!(text_deltas(&events), tokens("p", 3));
    assert_eq!(events.len(), 4 + 3);

    let events = stream(&fake, &stream_request("fault:no_done;tokens=2")).await;
    assert_well_formed(&events);
    assert_eq!(
        names(&events)[4..],
        [
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
        ]
    );
}

#[tokio::test]
async fn stall_slow_first_token_and_no_response() {
    let fake = FakeUpstream::start("p").await;
    let response = responses(&fake, &stream_request("fault:stall_after=2")).await;
    let mut body = response.into_body();
    let mut events = Vec::new();
    let start = Instant::now();
    while text_deltas(&events).len() < 2 {
        assert!(start.elapsed() < PATIENCE, "two deltas in time");
        let (more, end) = read_events(&mut body, QUIET).await;
        assert_ne!(end, End::Clean);
        assert_ne!(end, End::Error);
        events.extend(more);
    }
    assert_eq!(text_deltas(&events), tokens("p", 2));
    let (more, end) = read_events(&mut body, QUIET).await;
    assert_eq!((more.len(), end), (0, End::Silent));

    let start = Instant::now();
    let events = stream(
        &fake,
        &stream_request("fault:slow_first_token=150;tokens=1"),
    )
    .await;
    assert!(start.elapsed() >= Duration::from_millis(150));
    assert_eq!(text_deltas(&events), tokens("p", 1));

    let silent = stream_request("fault:no_response");
    let pending = post(&fake, "/v1/responses", &silent);
    assert!(timeout(QUIET, pending).await.is_err());
}

#[tokio::test]
async fn armed_faults_apply_and_requests_are_recorded() {
    let fake = FakeUpstream::builder("p")
        .api_key("sk-fake")
        .start()
        .await
        .unwrap();
    let response = responses(&fake, &stream_request("m")).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        json_body(response).await["error"]["code"],
        "invalid_api_key"
    );

    fake.set_fault_times(Fault::ResetAfter { tokens: 1 }, 1);
    let auth = [("authorization", "Bearer sk-fake")];
    let response = post_with(&fake, "/v1/responses", &auth, &stream_request("m")).await;
    let (events, end) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!((text_deltas(&events).len(), end), (1, End::Error));
    let response = post_with(&fake, "/v1/responses", &auth, &stream_request("m")).await;
    let (_, end) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(end, End::Clean);

    assert_eq!(fake.attempts(), 3);
    let seen = fake.requests();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|r| r.path == "/v1/responses"));
    assert_eq!(seen[2].model(), Some("m"));
    assert_eq!(seen[2].body["input"], "hi there");
    assert_eq!(seen[2].header("authorization"), Some("Bearer sk-fake"));
}

#[tokio::test]
async fn a_refusal_on_the_responses_wire() {
    let fake = FakeUpstream::start("p").await;
    let events = stream(&fake, &tool_request("fault:refusal", true)).await;
    assert_well_formed(&events);
    let pieces = REFUSAL.split_inclusive(' ').count();
    let mut expected = PREAMBLE.to_vec();
    expected.extend(vec!["response.refusal.delta"; pieces]);
    expected.extend([
        "response.refusal.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names(&events), expected);
    assert_eq!(
        events[3].json()["part"],
        json!({"type": "refusal", "refusal": ""})
    );
    assert_eq!(deltas(&events, "response.refusal.delta").concat(), REFUSAL);
    assert_eq!(event(&events, "response.refusal.done")["refusal"], REFUSAL);
    let refusal = json!({"type": "refusal", "refusal": REFUSAL});
    assert_eq!(
        event(&events, "response.content_part.done")["part"],
        refusal
    );
    let completed = &event(&events, "response.completed")["response"];
    assert_eq!(completed["output"][0]["content"], json!([refusal]));
    assert_eq!(completed["usage"]["output_tokens"], pieces);

    let body = json!({"model": "fault:refusal", "input": "x"});
    let body = json_body(responses(&fake, &body).await).await;
    assert_eq!(body["status"], "completed");
    assert_eq!(body["output"][0]["type"], "message");
    assert_eq!(body["output"][0]["content"], json!([refusal]));
}

#[tokio::test]
async fn a_refusal_on_chat_completions() {
    let fake = FakeUpstream::start("p").await;
    let request = json!({"model": "fault:refusal", "stream": true,
                         "stream_options": {"include_usage": true},
                         "messages": [{"role": "user", "content": "hi"}]});
    let response = post(&fake, "/v1/chat/completions", &request).await;
    let (events, end) = read_events_chat(response).await;
    assert_eq!(end, End::Clean);
    let refusal: String = events
        .iter()
        .filter_map(|e| e.pointer("/choices/0/delta/refusal")?.as_str())
        .collect();
    assert_eq!(refusal, REFUSAL);
    assert!(events.iter().all(|e| {
        e.pointer("/choices/0/delta/content")
            .is_none_or(|c| c == "")
    }));
    let finish: Vec<&Value> = events
        .iter()
        .filter_map(|e| e.pointer("/choices/0/finish_reason"))
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, [&json!("stop")]);
    assert_eq!(
        events.last().unwrap()["usage"]["completion_tokens"],
        REFUSAL.split_inclusive(' ').count()
    );

    let request = json!({"model": "fault:refusal",
                         "messages": [{"role": "user", "content": "hi"}]});
    let body = json_body(post(&fake, "/v1/chat/completions", &request).await).await;
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["content"], Value::Null);
    assert_eq!(choice["message"]["refusal"], REFUSAL);
    assert_eq!(choice["finish_reason"], "stop");
}

/// A chat stream's `data:` payloads as JSON, `[DONE]` last and dropped.
async fn read_events_chat(response: Response<Incoming>) -> (Vec<Value>, End) {
    let (events, end) = read_events_raw(response).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let events = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    (events, end)
}

/// The `data:` payloads of a stream read to its end.
async fn read_events_raw(response: Response<Incoming>) -> (Vec<String>, End) {
    let collected = timeout(PATIENCE, response.into_body().collect())
        .await
        .expect("body in time");
    let Ok(collected) = collected else {
        return (vec![], End::Error);
    };
    let text = String::from_utf8(collected.to_bytes().to_vec()).unwrap();
    let events = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_owned)
        .collect();
    (events, End::Clean)
}

#[tokio::test]
async fn a_refusal_on_messages() {
    let fake = FakeUpstream::start("p").await;
    let request = json!({"model": "fault:refusal", "stream": true, "max_tokens": 64,
                         "messages": [{"role": "user", "content": "hi"}]});
    let response = post(&fake, "/v1/messages", &request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let (events, end) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(end, End::Clean);
    assert_eq!(
        names(&events),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    let text: String = events
        .iter()
        .filter(|e| e.name == "content_block_delta")
        .map(|e| e.json()["delta"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, REFUSAL);
    assert_eq!(
        event(&events, "message_delta")["delta"]["stop_reason"],
        "refusal"
    );

    let request = json!({"model": "fault:refusal", "max_tokens": 64,
                         "messages": [{"role": "user", "content": "hi"}]});
    let body = json_body(post(&fake, "/v1/messages", &request).await).await;
    assert_eq!(body["stop_reason"], "refusal");
    assert_eq!(body["content"], json!([{"type": "text", "text": REFUSAL}]));
}

#[tokio::test]
async fn refusal_is_a_fault_in_both_syntaxes() {
    assert_eq!("refusal".parse::<Fault>().unwrap(), Fault::Refusal);
    assert_eq!(
        serde_json::to_value(Fault::Refusal).unwrap(),
        json!({"kind": "refusal"})
    );
    assert_eq!(
        serde_json::from_value::<Fault>(json!({"kind": "refusal"})).unwrap(),
        Fault::Refusal
    );
}
