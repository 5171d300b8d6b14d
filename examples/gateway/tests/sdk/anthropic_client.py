"""Drives the gateway's /v1/messages with the official `anthropic` Python package.

Usage: python anthropic_client.py BASE_URL MODEL stream|once [tools]
Prints one JSON object: what the SDK returned or raised.
"""
import json
import sys

from anthropic import Anthropic, APIError, APIStatusError

base_url, model, mode = sys.argv[1], sys.argv[2], sys.argv[3]
tools = len(sys.argv) > 4 and sys.argv[4] == "tools"
# No SDK retries: the gateway's own attempts are what is measured.
client = Anthropic(base_url=base_url, api_key="client-key", max_retries=0, timeout=20)
args = {
    "model": model,
    "max_tokens": 256,
    "messages": [{"role": "user", "content": "Tell me about caching."}],
}
if tools:
    args["tools"] = [{
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    }]
out = {"text": "", "partial_json": "", "deltas": 0, "tool_calls": 0, "ok": False}
try:
    if mode == "stream":
        for event in client.messages.create(stream=True, **args):
            if event.type == "message_start":
                out["model"] = event.message.model
            elif event.type == "content_block_start":
                if event.content_block.type == "tool_use":
                    out["tool_calls"] += 1
            elif event.type == "content_block_delta":
                out["deltas"] += 1
                if event.delta.type == "text_delta":
                    out["text"] += event.delta.text
                elif event.delta.type == "input_json_delta":
                    out["partial_json"] += event.delta.partial_json
            elif event.type == "message_delta":
                out["stop_reason"] = event.delta.stop_reason
                out["output_tokens"] = event.usage.output_tokens
    else:
        message = client.messages.create(**args)
        out["model"] = message.model
        out["stop_reason"] = message.stop_reason
        for block in message.content:
            if block.type == "text":
                out["text"] += block.text
            elif block.type == "tool_use":
                out["tool_calls"] += 1
    out["ok"] = True
except APIError as e:
    body = e.body if isinstance(e.body, dict) else {}
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    out["error"] = {
        "class": type(e).__name__,
        "status": e.status_code if isinstance(e, APIStatusError) else None,
        "message": e.message,
        "type": error.get("type"),
        "phase": error.get("phase"),
        "bytes_sent": error.get("bytes_sent"),
        "output_events": error.get("output_events"),
    }
print(json.dumps(out))
