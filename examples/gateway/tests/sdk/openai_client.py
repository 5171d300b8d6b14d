"""Drives the gateway with the official `openai` Python package.

Usage: python openai_client.py BASE_URL MODEL stream|once
Prints one JSON object: what the SDK returned or raised.
"""
import json
import sys

from openai import APIError, APIStatusError, OpenAI

base_url, model, mode = sys.argv[1], sys.argv[2], sys.argv[3]
# No SDK retries: the gateway's own attempts are what is measured.
client = OpenAI(base_url=base_url, api_key="client-key", max_retries=0, timeout=20)
messages = [{"role": "user", "content": "Tell me about caching."}]
out = {"text": "", "chunks": 0, "ok": False}
try:
    if mode == "stream":
        stream = client.chat.completions.create(model=model, messages=messages, stream=True)
        for chunk in stream:
            out["chunks"] += 1
            out["model"] = chunk.model
            for choice in chunk.choices:
                if choice.delta and choice.delta.content:
                    out["text"] += choice.delta.content
                if choice.finish_reason:
                    out["finish_reason"] = choice.finish_reason
    else:
        completion = client.chat.completions.create(model=model, messages=messages)
        out["text"] = completion.choices[0].message.content
        out["model"] = completion.model
        out["finish_reason"] = completion.choices[0].finish_reason
    out["ok"] = True
except APIError as e:
    out["error"] = {
        "class": type(e).__name__,
        "status": e.status_code if isinstance(e, APIStatusError) else None,
        "message": e.message,
        "code": e.code,
        "type": e.type,
    }
print(json.dumps(out))
