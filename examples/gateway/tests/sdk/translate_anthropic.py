"""Drives a gateway route that may translate, with the official `anthropic` Python package.

Usage: python translate_anthropic.py BASE_URL MODEL MODE [MODEL2]
MODE: stream | once | tools-stream | tools-once | agent
  stream, once       a text answer (streamed or not)
  tools-stream/once  a request with one tool; the tool_use blocks
  agent              turn 1 on MODEL with the tool (streamed), turn 2 on
                     MODEL2: the history, a tool_result block and the tool
                     again (not streamed)
Prints one JSON object: what the SDK returned or raised.
"""
import json
import sys

from anthropic import Anthropic, APIError, APIStatusError

base_url, model, mode = sys.argv[1], sys.argv[2], sys.argv[3]
model2 = sys.argv[4] if len(sys.argv) > 4 else model
# No SDK retries: the gateway's own attempts are what is measured.
client = Anthropic(base_url=base_url, api_key="client-key", max_retries=0, timeout=20)
QUESTION = [{"role": "user", "content": "Tell me about caching."}]
TOOLS = [{
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
}]


# The content of the last whole message read.
LAST = {}


def usage_of(usage):
    if usage is None:
        return None
    return {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}


def error_of(e):
    if isinstance(e, APIError):
        body = e.body if isinstance(e.body, dict) else {}
        error = body.get("error") if isinstance(body.get("error"), dict) else {}
        return {
            "class": type(e).__name__,
            "status": e.status_code if isinstance(e, APIStatusError) else None,
            "message": e.message,
            "type": error.get("type"),
        }
    return {"class": type(e).__name__, "status": None, "message": str(e), "type": None}


def message_of(out, message):
    """A whole message into `out`."""
    out["id"] = message.id
    out["type"] = message.type
    out["role"] = message.role
    out["model"] = message.model
    out["stop_reason"] = message.stop_reason
    out["usage"] = usage_of(message.usage)
    out["blocks"] = [block.type for block in message.content]
    out["text"] = "".join(b.text for b in message.content if b.type == "text")
    out["tool_calls"] = [
        {"id": b.id, "name": b.name, "arguments": b.input}
        for b in message.content
        if b.type == "tool_use"
    ]
    out["content"] = [block.model_dump(mode="json", exclude_none=True) for block in message.content]
    # Sent back as it came, as an agent loop does.
    LAST["content"] = message.content


def text_stream(out, **args):
    """The raw events: the text as it came, usage as the events carried it."""
    out["deltas"] = 0
    usage = {}
    for event in client.messages.create(stream=True, **args):
        out["events"] += 1
        if event.type == "message_start":
            out["id"] = event.message.id
            out["model"] = event.message.model
            usage["input_tokens"] = event.message.usage.input_tokens
            usage["output_tokens"] = event.message.usage.output_tokens
        elif event.type == "content_block_delta" and event.delta.type == "text_delta":
            out["deltas"] += 1
            out["text"] += event.delta.text
        elif event.type == "message_delta":
            out["stop_reason"] = event.delta.stop_reason
            usage["output_tokens"] = event.usage.output_tokens
            if event.usage.input_tokens is not None:
                usage["input_tokens"] = event.usage.input_tokens
        elif event.type == "message_stop":
            out["stopped"] = True
    out["usage"] = usage


def tools_stream(out, **args):
    """The SDK's stream helper: it joins the input_json_delta pieces."""
    with client.messages.stream(**args) as stream:
        for event in stream:
            out["events"] += 1
            if event.type == "text":
                out["text"] += event.text
            elif event.type == "input_json":
                out["argument_deltas"] = out.get("argument_deltas", 0) + 1
        final = stream.get_final_message()
    message_of(out, final)
    return final


def turn(model, messages, stream, tools):
    out = {"text": "", "events": 0, "tool_calls": [], "ok": False}
    args = {"model": model, "max_tokens": 256, "messages": messages}
    if tools:
        args["tools"] = TOOLS
    try:
        if stream and tools:
            tools_stream(out, **args)
        elif stream:
            text_stream(out, **args)
        else:
            message_of(out, client.messages.create(**args))
        out["ok"] = True
    except Exception as e:  # noqa: BLE001 - every failure is reported
        out["error"] = error_of(e)
    return out


if mode in ("stream", "once"):
    out = turn(model, QUESTION, stream=mode == "stream", tools=False)
elif mode in ("tools-stream", "tools-once"):
    out = turn(model, QUESTION, stream=mode == "tools-stream", tools=True)
elif mode == "agent":
    first = turn(model, QUESTION, stream=True, tools=True)
    out = {"turn1": first, "ok": False}
    if first["ok"] and first["tool_calls"]:
        call = first["tool_calls"][0]
        history = QUESTION + [
            {"role": "assistant", "content": LAST["content"]},
            {
                "role": "user",
                "content": [{
                    "type": "tool_result",
                    "tool_use_id": call["id"],
                    "content": "Sunny, 21 degrees.",
                }],
            },
        ]
        second = turn(model2, history, stream=False, tools=True)
        out["turn2"] = second
        out["ok"] = second["ok"]
else:
    raise SystemExit(f"unknown mode {mode}")
print(json.dumps(out))
