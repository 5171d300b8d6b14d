//! A toy dialect proves the `Dialect` trait: `LineDialect`, a made-up wire
//! format with one JSON object per SSE event, written here in a test file
//! alone, gets hold-back, reroute before commit, a terminal event of its own
//! after commit and whole-body validation through `Failover`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use serde::Deserialize;
use serde_json::{Value, json};
use tower::ServiceExt;
use tower_llm_failover::FailureClass;
use tower_llm_failover::dialect::{
    AnswerFacts, BodyCheck, BodyFault, Chunk, ChunkIdentity, ChunkKind, Dialect, ErrorFacts,
    ErrorReply, ErrorSource, RequestError, Requirements, TerminalError, TerminalMode,
};
use tower_llm_failover::failover::Caps;
use tower_llm_failover::failover::{Failover, Target};
use tower_llm_failover::observe::TurnRecord;
use tower_llm_failover::sse::SseEvent;
use tower_llm_testing::{FakeProvider, Reply, Step};

// ---- The dialect ---------------------------------------------------------

/// The Line wire format. Requests: `{"model":"m","stream":true,"prompt":"..."}`.
/// Each SSE event's data is one object: `{"text":"..."}` (output),
/// `{"done":true,"reason":"stop"}` (finish and end), `{"fail":{"kind":..,
/// "msg":..}}` (in-band error), anything else (e.g. `{"hello":true}`) is
/// preamble. A whole answer is `{"text":"...","done":true,"reason":"stop"}`.
#[derive(Debug, Clone, Copy)]
struct LineDialect;

/// What `LineDialect` keeps of a client's request.
#[derive(Debug, Clone)]
struct LineRequest {
    stream: bool,
    prompt: String,
}

/// One event's data (or a whole answer), borrowed from the bytes.
#[derive(Deserialize)]
struct Line<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(default)]
    done: bool,
    #[serde(borrow, default)]
    reason: Option<Cow<'a, str>>,
    #[serde(default)]
    fail: Option<serde::de::IgnoredAny>,
}

/// What a `{"fail":{"kind":..,"msg":..}}` says, for classification.
fn fail_facts(data: &[u8]) -> Option<ErrorFacts> {
    let value: Value = serde_json::from_slice(data).ok()?;
    let fail = value.get("fail")?;
    Some(ErrorFacts {
        code: Some(fail.get("kind")?.as_str()?.to_owned()),
        message: fail.get("msg").and_then(Value::as_str).map(str::to_owned),
        ..ErrorFacts::default()
    })
}

fn frame(data: &Value) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

impl Dialect for LineDialect {
    type Request = LineRequest;
    type Memo = ();

    fn read_request(&self, body: Bytes) -> Result<(Requirements, LineRequest), RequestError> {
        let value: Value =
            serde_json::from_slice(&body).map_err(|e| RequestError::NotJson(e.to_string()))?;
        let object = value.as_object().ok_or(RequestError::NotObject)?;
        let model = object.get("model").and_then(Value::as_str);
        let prompt = object.get("prompt").and_then(Value::as_str);
        let stream = object.get("stream").and_then(Value::as_bool) == Some(true);
        let model = model.ok_or(RequestError::MissingModel)?;
        let prompt = prompt.ok_or(RequestError::Invalid {
            field: "prompt",
            problem: "is required and must be a string",
        })?;
        let requirements = Requirements {
            stream,
            input_tokens: prompt.len() as u64 / 4 + 1,
            ..Requirements::new(model)
        };
        let prompt = prompt.to_owned();
        Ok((requirements, LineRequest { stream, prompt }))
    }

    fn upstream_body(&self, request: &LineRequest, model: &str) -> Bytes {
        let body = json!({"model": model, "stream": request.stream, "prompt": request.prompt});
        Bytes::from(body.to_string())
    }

    fn inspect<'a>(&self, event: &'a SseEvent, _memo: &mut ()) -> Chunk<'a> {
        let Ok(line) = serde_json::from_slice::<Line<'a>>(event.data()) else {
            return Chunk::of(ChunkKind::Malformed);
        };
        let kind = if line.fail.is_some() || event.is_named("error") {
            ChunkKind::Error
        } else if line.done {
            ChunkKind::Done
        } else if line.text.as_ref().is_some_and(|t| !t.is_empty()) {
            ChunkKind::Output
        } else {
            ChunkKind::Preamble
        };
        let finish_reason = line
            .done
            .then(|| line.reason.unwrap_or(Cow::Borrowed("stop")));
        Chunk {
            finish_reason,
            ..Chunk::of(kind)
        }
    }

    fn error_facts(&self, source: ErrorSource<'_>) -> Option<ErrorFacts> {
        match source {
            ErrorSource::Event(event) => fail_facts(event.data()),
            ErrorSource::Body(body) => fail_facts(body),
            _ => None,
        }
    }

    fn terminal(
        &self,
        _identity: &ChunkIdentity<'_>,
        finish_reason: &str,
        error: &TerminalError,
        mode: TerminalMode,
    ) -> Bytes {
        let fail = json!({"kind": error.class.as_str(), "msg": error.message});
        match mode {
            TerminalMode::ErrorEventOnly => {
                Bytes::from(format!("event: error\ndata: {}\n\n", json!({"fail": fail})))
            }
            TerminalMode::Finish => frame(&json!({"done": true, "reason": finish_reason})),
            TerminalMode::Raise => {
                frame(&json!({"done": true, "reason": finish_reason, "fail": fail}))
            }
        }
    }

    fn done_frame(&self) -> Bytes {
        frame(&json!({"done": true, "reason": "stop"}))
    }

    fn check_answer(&self, body: &[u8]) -> (BodyCheck, AnswerFacts) {
        let (fault, message) = match serde_json::from_slice::<Line<'_>>(body) {
            Ok(line) if line.text.is_some() && line.done && line.fail.is_none() => {
                let (usage, model) = (None, None);
                return (BodyCheck::Valid { usage, model }, AnswerFacts::default());
            }
            Ok(_) => (BodyFault::NoAnswer, "no text, or not done".to_owned()),
            Err(e) if e.is_data() => (BodyFault::UnexpectedJson, e.to_string()),
            Err(e) => (BodyFault::NotJson, e.to_string()),
        };
        (
            BodyCheck::Invalid { fault, message },
            AnswerFacts::default(),
        )
    }

    fn error_body(&self, error: &ErrorReply<'_>) -> Bytes {
        let kind = error.code.or(error.provider_code);
        let kind = kind.unwrap_or(error.class.as_str());
        Bytes::from(json!({"fail": {"kind": kind, "msg": error.message}}).to_string())
    }
}

// ---- Through Failover ----------------------------------------------------

const LIMIT: Duration = Duration::from_secs(10);

fn event(data: Value) -> Step {
    Step::Data(frame(&data))
}

fn bytes_of(steps: &[Step]) -> Vec<u8> {
    let mut out = Vec::new();
    for step in steps {
        if let Step::Data(data) = step {
            out.extend_from_slice(data);
        }
    }
    out
}

fn json_reply(body: &str) -> Reply {
    Reply::Json {
        status: 200,
        headers: Vec::new(),
        body: Bytes::from(body.to_owned()),
    }
}

/// Serves one request through `Failover<FakeProvider, LineDialect>` and
/// reads the whole answer, within time.
async fn turn(
    primary: &FakeProvider,
    backup: &FakeProvider,
    stream: bool,
) -> (Response<()>, TurnRecord, String) {
    let failover = Failover::builder()
        .dialect(LineDialect)
        .target(Target::new("primary", primary.clone()))
        .target(Target::new("backup", backup.clone()).model("backup-model"))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let body = json!({"model": "m", "stream": stream, "prompt": "Say hi."});
    let request = Request::post("/v1/line")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = tokio::time::timeout(LIMIT, failover.oneshot(request))
        .await
        .expect("an answer in time")
        .unwrap();
    let record = response.extensions().get::<TurnRecord>().unwrap().clone();
    let (parts, body) = response.into_parts();
    let bytes = tokio::time::timeout(LIMIT, body.collect())
        .await
        .expect("the body ends in time")
        .unwrap()
        .to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    (Response::from_parts(parts, ()), record, text)
}

fn backup_stream() -> Vec<Step> {
    vec![
        event(json!({"hello": true})),
        event(json!({"text": "backup says"})),
        event(json!({"text": " hi"})),
        event(json!({"done": true, "reason": "stop"})),
    ]
}

#[tokio::test]
async fn an_in_band_fail_after_the_preamble_is_rerouted_invisibly() {
    let primary = FakeProvider::new("primary").always(Reply::Stream(vec![
        event(json!({"hello": true})),
        event(json!({"fail": {"kind": "overloaded", "msg": "busy"}})),
    ]));
    let backup = FakeProvider::new("backup").always(Reply::Stream(backup_stream()));
    let (head, record, body) = turn(&primary, &backup, true).await;

    // Only the backup's events, from the first byte, unchanged.
    assert_eq!(body.as_bytes(), bytes_of(&backup_stream()));
    assert_eq!(head.headers()["x-failover-attempts"], "2");
    assert_eq!(head.headers()["x-failover-target"], "backup");
    assert_eq!((primary.calls(), backup.calls()), (1, 1));
    let first = &record.attempts()[0];
    assert_eq!((first.bytes_flushed, first.output_events), (0, 0));
    // The dialect read its own error: an overload, not a broken stream.
    assert_eq!(first.class, Some(FailureClass::Overloaded));
    assert_eq!(first.message.as_deref(), Some("busy"));
    // The dialect built the backup's body, with the backup's model.
    let sent = json!({"model": "backup-model", "stream": true, "prompt": "Say hi."});
    assert_eq!(backup.seen()[0].body, sent);
}

#[tokio::test]
async fn a_reset_after_three_texts_ends_with_the_dialects_terminal_event() {
    let texts = vec![
        event(json!({"text": "one"})),
        event(json!({"text": "two"})),
        event(json!({"text": "three"})),
    ];
    let mut script = texts.clone();
    script.push(Step::Error("connection reset by peer".to_owned()));
    let primary = FakeProvider::new("primary").always(Reply::Stream(script));
    let backup = FakeProvider::new("backup").always(Reply::Stream(backup_stream()));
    let (head, record, body) = turn(&primary, &backup, true).await;

    let sent = bytes_of(&texts);
    assert!(body.as_bytes().starts_with(&sent), "{body}");
    let rest: Vec<&str> = body[sent.len()..].split_terminator("\n\n").collect();
    assert_eq!(rest.len(), 1, "exactly one terminal event: {body}");
    let terminal: Value = serde_json::from_str(rest[0].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(terminal["done"], true);
    assert_eq!(terminal["reason"], "error");
    assert!(terminal["fail"]["kind"].is_string(), "{terminal}");
    assert_eq!(head.headers()["x-failover-attempts"], "1");
    assert_eq!(backup.calls(), 0, "never a second voice after commit");
    assert_eq!(record.attempts()[0].output_events, 3);
}

#[tokio::test]
async fn an_invalid_whole_answer_is_rerouted_and_a_valid_one_released() {
    let answer = r#"{"text":"backup says hi","done":true,"reason":"stop"}"#;
    for invalid in [r#"{"text":"cut"#, r#"{"hello":true}"#, "42"] {
        let primary = FakeProvider::new("primary").always(json_reply(invalid));
        let backup = FakeProvider::new("backup").always(json_reply(answer));
        let (head, _, body) = turn(&primary, &backup, false).await;
        assert_eq!(body, answer, "after {invalid}");
        assert_eq!(head.headers()["x-failover-target"], "backup");
        assert_eq!((primary.calls(), backup.calls()), (1, 1));
        assert_eq!(backup.seen()[0].body["stream"], false);
    }

    // A fail on a 200 is read by the dialect: an overload, rerouted.
    let primary = FakeProvider::new("primary")
        .always(json_reply(r#"{"fail":{"kind":"overloaded","msg":"busy"}}"#));
    let backup = FakeProvider::new("backup").always(json_reply(answer));
    let (_, record, body) = turn(&primary, &backup, false).await;
    assert_eq!(body, answer);
    assert_eq!(record.attempts()[0].class, Some(FailureClass::Overloaded));
    assert_eq!(record.attempts()[0].message.as_deref(), Some("busy"));

    // Nobody answers validly: the client gets an error in the Line shape.
    let primary = FakeProvider::new("primary").always(json_reply(r#"{"hello":true}"#));
    let backup = FakeProvider::new("backup").always(json_reply(r#"{"text":"x"}"#));
    let (head, _, body) = turn(&primary, &backup, false).await;
    assert!(!head.status().is_success());
    let error: Value = serde_json::from_str(&body).unwrap();
    assert!(error["fail"]["kind"].is_string(), "{body}");
    assert!(error["fail"]["msg"].is_string(), "{body}");
}
