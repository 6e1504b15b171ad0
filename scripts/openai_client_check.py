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

# The Batch API: a file of requests uploaded, run as a batch, its answers read back.
import time

requests = [
    {"custom_id": "hello", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0}},
    {"custom_id": "missing", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}},
]
upload = client.files.create(file=("requests.jsonl", "\n".join(json.dumps(r) for r in requests).encode()), purpose="batch")
batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                              metadata={"job": "check"})
while batch.status not in ("completed", "failed", "cancelled", "expired"):
    time.sleep(0.05)
    batch = client.batches.retrieve(batch.id)
answers = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
errors = [json.loads(line) for line in client.files.content(batch.error_file_id).text.splitlines()]
listed = [b.id for b in client.batches.list(limit=10)]
cancelled = client.batches.cancel(batch.id)
deleted = client.files.delete(upload.id)
report(
    "batch",
    status=batch.status,
    counts=[batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed],
    metadata=batch.metadata,
    answers=[(a["custom_id"], a["response"]["status_code"]) for a in answers],
    text=answers[0]["response"]["body"]["choices"][0]["message"]["content"],
    errors=[(e["custom_id"], e["response"]["status_code"]) for e in errors],
    listed=batch.id in listed,
    status_after_cancel=cancelled.status,
    deleted=deleted.deleted,
    upload_bytes=upload.bytes,
)

# Tools and structured outputs (T2, T3), against a second server (a fixture with Qwen2.5's chat
# template and tool-call tags) when its base URL is given.
if len(sys.argv) > 4:
    tools_client = openai.OpenAI(base_url=sys.argv[3], api_key="unused")
    tools_model = sys.argv[4]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather of a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                    "required": ["city", "unit"],
                    "additionalProperties": False,
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": "get_time",
                "description": "Current time in a zone",
                "parameters": {
                    "type": "object",
                    "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
                    "required": ["zone"],
                    "additionalProperties": False,
                },
            },
        },
    ]
    question = [{"role": "user", "content": "What's the weather in Paris?"}]

    def calls_of(message):
        return [
            {"id": c.id, "type": c.type, "name": c.function.name, "arguments": json.loads(c.function.arguments), "raw": c.function.arguments}
            for c in (message.tool_calls or [])
        ]

    def ask(**kwargs):
        args = dict(model=tools_model, messages=question, tools=tools, temperature=1.0, seed=7, max_tokens=120)
        args.update(kwargs)
        return tools_client.chat.completions.create(**args)

    # One call each (a random model would chain parallel calls up to max_tokens).
    whole = ask(tool_choice="required", parallel_tool_calls=False)
    report("tools_required", finish=whole.choices[0].finish_reason, content=whole.choices[0].message.content, calls=calls_of(whole.choices[0].message))

    # Streamed: accumulate delta.tool_calls the way SDK users do (strings concatenated per index).
    acc, finishes = {}, []
    for chunk in ask(tool_choice="required", parallel_tool_calls=False, stream=True):
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                entry = acc.setdefault(d.index, {"id": "", "type": "", "name": "", "raw": ""})
                entry["id"] += d.id or ""
                entry["type"] += d.type or ""
                if d.function is not None:
                    entry["name"] += d.function.name or ""
                    entry["raw"] += d.function.arguments or ""
            if choice.finish_reason is not None:
                finishes.append(choice.finish_reason)
    streamed = [acc[i] for i in sorted(acc)]
    report("tools_stream", finishes=finishes, calls=streamed)

    named = ask(tool_choice={"type": "function", "function": {"name": "get_time"}})
    report("tools_named", finish=named.choices[0].finish_reason, calls=calls_of(named.choices[0].message))
    none = ask(tool_choice="none", max_tokens=16)
    report("tools_none", finish=none.choices[0].finish_reason, calls=calls_of(none.choices[0].message))
    single = ask(tool_choice="required", parallel_tool_calls=False, n=3)
    report("tools_single", counts=[len(c.message.tool_calls or []) for c in single.choices], finishes=[c.finish_reason for c in single.choices])

    first = calls_of(whole.choices[0].message)[0]
    history = question + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": first["id"], "type": "function", "function": {"name": first["name"], "arguments": first["raw"]}}]},
        {"role": "tool", "tool_call_id": first["id"], "content": "22 degrees and sunny"},
    ]
    turn = ask(messages=history, max_tokens=8)
    report("tools_multi_turn", finish=turn.choices[0].finish_reason, prompt_tokens=turn.usage.prompt_tokens)

    # Structured outputs with a pydantic model, and its length error.
    import pydantic

    class Weather(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        city: pydantic.constr(max_length=8)
        celsius: pydantic.conint(ge=-50, le=60)

    chat_api = tools_client.chat.completions if hasattr(tools_client.chat.completions, "parse") else tools_client.beta.chat.completions
    parsed = chat_api.parse(model=tools_model, messages=question, response_format=Weather, temperature=1.0, seed=3, max_tokens=100)
    report("parse", parsed=parsed.choices[0].message.parsed.model_dump(), finish=parsed.choices[0].finish_reason)
    try:
        chat_api.parse(model=tools_model, messages=question, response_format=Weather, max_tokens=2)
        report("parse_length", raised=None)
    except openai.LengthFinishReasonError as e:
        report("parse_length", raised=type(e).__name__)
