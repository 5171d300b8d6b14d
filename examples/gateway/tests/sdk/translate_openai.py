"""Drives a gateway route that may translate, with the official `openai` Python package.

Usage: python translate_openai.py BASE_URL MODEL MODE [MODEL2]
MODE: stream | once | tools-stream | tools-once | agent | n2
  stream, once       a text answer (streamed or not)
  tools-stream/once  a request with one function tool; the tool calls
  agent              turn 1 on MODEL with the tool (streamed), turn 2 on
                     MODEL2: the history, the tool call's result (role tool)
                     and the tool again (not streamed)
  n2                 n=2, not streamed
Prints one JSON object: what the SDK returned or raised.
"""
import json
import sys

from openai import APIError, APIStatusError, OpenAI

base_url, model, mode = sys.argv[1], sys.argv[2], sys.argv[3]
model2 = sys.argv[4] if len(sys.argv) > 4 else model
# No SDK retries: the gateway's own attempts are what is measured.
client = OpenAI(base_url=base_url, api_key="client-key", max_retries=0, timeout=20)
QUESTION = [{"role": "user", "content": "Tell me about caching."}]
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}]
USAGE = {"include_usage": True}


def usage_of(usage):
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def calls_of(tool_calls):
    calls = []
    for call in tool_calls or []:
        text = call.function.arguments
        try:
            arguments = json.loads(text)
        except (TypeError, ValueError):
            arguments = None
        calls.append({
            "id": call.id,
            "type": call.type,
            "name": call.function.name,
            "arguments": arguments,
            "arguments_text": text,
        })
    return calls


def error_of(e):
    if isinstance(e, APIError):
        return {
            "class": type(e).__name__,
            "status": e.status_code if isinstance(e, APIStatusError) else None,
            "message": e.message,
            "code": e.code,
            "type": e.type,
        }
    return {"class": type(e).__name__, "status": None, "message": str(e), "code": None, "type": None}


def completion_of(out, completion):
    """A whole completion into `out`."""
    out["id"] = completion.id
    out["ids"] = [completion.id]
    out["object"] = completion.object
    out["model"] = completion.model
    out["choices"] = len(completion.choices)
    choice = completion.choices[0]
    out["text"] = choice.message.content or ""
    out["content"] = choice.message.content
    out["finish_reason"] = choice.finish_reason
    out["tool_calls"] = calls_of(choice.message.tool_calls)
    out["usage"] = usage_of(completion.usage)


def text_stream(out, **args):
    """A raw stream: every chunk's id, the text as it came."""
    out["deltas"] = 0
    stream = client.chat.completions.create(stream=True, stream_options=USAGE, **args)
    for chunk in stream:
        out["chunks"] += 1
        if chunk.id not in out["ids"]:
            out["ids"].append(chunk.id)
        out["id"] = out["ids"][0]
        out["object"] = chunk.object
        out["model"] = chunk.model
        if chunk.usage is not None:
            out["usage"] = usage_of(chunk.usage)
        for choice in chunk.choices:
            if choice.delta and choice.delta.content:
                out["deltas"] += 1
                out["text"] += choice.delta.content
            if choice.finish_reason:
                out["finish_reason"] = choice.finish_reason


def tools_stream(out, **args):
    """The SDK's stream helper: it joins the tool calls' argument pieces."""
    with client.chat.completions.stream(stream_options=USAGE, **args) as stream:
        for event in stream:
            if event.type == "chunk":
                out["chunks"] += 1
                if event.chunk.id not in out["ids"]:
                    out["ids"].append(event.chunk.id)
            elif event.type == "content.delta":
                out["text"] += event.delta
            elif event.type == "tool_calls.function.arguments.delta":
                out["argument_deltas"] = out.get("argument_deltas", 0) + 1
        final = stream.get_final_completion()
    ids = out["ids"]
    completion_of(out, final)
    out["ids"] = ids


def turn(model, messages, stream, tools, n=None):
    out = {"text": "", "chunks": 0, "ids": [], "tool_calls": [], "ok": False}
    args = {"model": model, "messages": messages}
    if tools:
        args["tools"] = TOOLS
    if n is not None:
        args["n"] = n
    try:
        if stream and tools:
            tools_stream(out, **args)
        elif stream:
            text_stream(out, **args)
        else:
            completion_of(out, client.chat.completions.create(**args))
        out["ok"] = True
    except Exception as e:  # noqa: BLE001 - every failure is reported
        out["error"] = error_of(e)
    return out


if mode in ("stream", "once"):
    out = turn(model, QUESTION, stream=mode == "stream", tools=False)
elif mode in ("tools-stream", "tools-once"):
    out = turn(model, QUESTION, stream=mode == "tools-stream", tools=True)
elif mode == "n2":
    out = turn(model, QUESTION, stream=False, tools=False, n=2)
elif mode == "agent":
    first = turn(model, QUESTION, stream=True, tools=True)
    out = {"turn1": first, "ok": False}
    if first["ok"] and first["tool_calls"]:
        call = first["tool_calls"][0]
        history = QUESTION + [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments_text"]},
                }],
            },
            {"role": "tool", "tool_call_id": call["id"], "content": "Sunny, 21 degrees."},
        ]
        second = turn(model2, history, stream=False, tools=True)
        out["turn2"] = second
        out["ok"] = second["ok"]
else:
    raise SystemExit(f"unknown mode {mode}")
print(json.dumps(out))
