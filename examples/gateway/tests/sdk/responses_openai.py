"""Drives a gateway's Responses route with the official `openai` Python package.

Usage: python responses_openai.py BASE_URL MODEL MODE [PREVIOUS_RESPONSE_ID]
MODE: create-stream | helper | once | tools-helper | previous
  create-stream  client.responses.create(stream=True), iterated raw
  helper         client.responses.stream(...), then get_final_response()
  once           client.responses.create() without streaming
  tools-helper   the stream helper with one function tool
  previous       create-stream with previous_response_id
Prints one JSON object: what the SDK yielded, returned or raised.
"""
import json
import sys

from openai import APIError, APIStatusError, OpenAI

base_url, model, mode = sys.argv[1], sys.argv[2], sys.argv[3]
previous = sys.argv[4] if len(sys.argv) > 4 else None
# No SDK retries: the gateway's own attempts are what is measured.
client = OpenAI(base_url=base_url, api_key="client-key", max_retries=0, timeout=20)
TOOLS = [{
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}]
# What agents send beside the public schema: never a reason to refuse.
EXTRA = {
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "agent-session-1",
    "extra_body": {"client_metadata": {"agent": "e2e"}},
}


def error_of(e):
    if isinstance(e, APIError):
        return {
            "class": type(e).__name__,
            "status": e.status_code if isinstance(e, APIStatusError) else None,
            "message": e.message,
            "code": e.code,
        }
    return {"class": type(e).__name__, "status": None, "message": str(e), "code": None}


def usage_of(usage):
    if usage is None:
        return None
    return {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}


def final_of(out, response):
    out["id"] = response.id
    out["status"] = response.status
    out["model"] = response.model
    out["text"] = response.output_text
    out["usage"] = usage_of(response.usage)
    out["calls"] = [
        {"call_id": item.call_id, "name": item.name, "arguments": item.arguments}
        for item in response.output
        if item.type == "function_call"
    ]


def seen(out, event):
    out["events"].append(event.type)
    out["sequence"].append(event.sequence_number)
    if event.type == "response.created":
        out["ids"].append(event.response.id)
    elif event.type == "response.output_text.delta":
        out["deltas"].append(event.delta)
    elif event.type == "response.function_call_arguments.delta":
        out["argument_deltas"] += 1
    elif event.type in ("response.completed", "response.failed", "response.incomplete"):
        out["status"] = event.response.status
        out["usage"] = usage_of(event.response.usage)


def run():
    out = {"ok": False, "events": [], "sequence": [], "ids": [], "deltas": [],
           "argument_deltas": 0, "text": "", "calls": []}
    args = {"model": model, "input": "Tell me about caching.", **EXTRA}
    if mode == "tools-helper":
        args["tools"] = TOOLS
        args["parallel_tool_calls"] = True
    if mode == "previous":
        args["previous_response_id"] = previous
    try:
        if mode in ("create-stream", "previous"):
            for event in client.responses.create(stream=True, **args):
                seen(out, event)
            out["text"] = "".join(out["deltas"])
        elif mode in ("helper", "tools-helper"):
            with client.responses.stream(**args) as stream:
                for event in stream:
                    seen(out, event)
                final_of(out, stream.get_final_response())
        elif mode == "once":
            final_of(out, client.responses.create(**args))
        else:
            raise SystemExit(f"unknown mode {mode}")
        out["ok"] = True
    except APIError as e:
        out["error"] = error_of(e)
    except Exception as e:  # noqa: BLE001 - every failure is reported
        out["error"] = error_of(e)
    return out


print(json.dumps(run()))
