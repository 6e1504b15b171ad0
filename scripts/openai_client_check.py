"""Drives a llaisys server with the official OpenAI Python client; prints one JSON line per check.

Usage: python openai_client_check.py BASE_URL MODEL
"""
import json
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused")


def report(name, **fields):
    print(json.dumps({"check": name, **fields}), flush=True)


models = client.models.list()
report("models", ids=[m.id for m in models.data])

chat = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0
)
report(
    "chat",
    text=chat.choices[0].message.content,
    finish=chat.choices[0].finish_reason,
    completion_tokens=chat.usage.completion_tokens,
)

stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Hello"}],
    max_tokens=8,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
parts, finishes, usage = [], [], None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage.completion_tokens
    for choice in chunk.choices:
        parts.append(choice.delta.content or "")
        if choice.finish_reason is not None:
            finishes.append(choice.finish_reason)
report("chat_stream", text="".join(parts), finishes=finishes, completion_tokens=usage)

completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=5, temperature=0)
report("completion", text=completion.choices[0].text, completion_tokens=completion.usage.completion_tokens)

try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    report("error", raised=None)
except openai.NotFoundError as e:
    report("error", raised=type(e).__name__, status=e.status_code, message=str(e.body.get("message", "")))
