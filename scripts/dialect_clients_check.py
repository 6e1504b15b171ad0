"""Drives a llaisys server with the official Python clients of the other dialects: OpenAI's
Responses API (`openai`), Anthropic's Messages API (`anthropic`) and Ollama's API (`ollama`).
Prints one JSON line per check; tests/tests/official_clients.rs asserts on them.

Usage: python dialect_clients_check.py HOST_URL MODEL TOOLS_HOST_URL TOOLS_MODEL
(HOST_URL without /v1: each client adds its own paths; the tools server has a chat template
with tool-call tags.)
"""
import json
import sys

import anthropic
import ollama
import openai
import pydantic

host, model, tools_host, tools_model = sys.argv[1:5]


def report(name, **fields):
    print(json.dumps({"check": name, **fields}), flush=True)


oa = openai.OpenAI(base_url=f"{host}/v1", api_key="unused")
reference = oa.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0
).choices[0].message.content
report("reference", text=reference)

# --- OpenAI Responses ---
first = oa.responses.create(model=model, input="Hello", max_output_tokens=8, temperature=0)
report("responses", text=first.output_text, status=first.status, output_tokens=first.usage.output_tokens)

deltas, final_type = [], None
for event in oa.responses.create(model=model, input="Hello", max_output_tokens=8, temperature=0, stream=True):
    if event.type == "response.output_text.delta":
        deltas.append(event.delta)
    final_type = event.type
# The SDK's stream helper (its final response needs `response.completed`, which an answer cut
# by max_output_tokens does not get: it ends `response.incomplete`, as OpenAI's do).
helper_text = ""
with oa.responses.stream(model=model, input="Hello", max_output_tokens=8, temperature=0) as stream:
    for event in stream:
        if event.type == "response.output_text.delta":
            helper_text = event.snapshot
report("responses_stream", text="".join(deltas), last=final_type, helper_text=helper_text)

second = oa.responses.create(
    model=model, input="And again", previous_response_id=first.id, max_output_tokens=4, temperature=0
)
report(
    "responses_previous",
    cached=second.usage.input_tokens_details.cached_tokens,
    first_total=first.usage.total_tokens,
    previous=second.previous_response_id,
)
report("responses_retrieve", same=oa.responses.retrieve(first.id).output_text == first.output_text)
oa.responses.delete(first.id)
try:
    oa.responses.retrieve(first.id)
    report("responses_deleted", raised=None)
except openai.NotFoundError as e:
    report("responses_deleted", raised=type(e).__name__)

tools_oa = openai.OpenAI(base_url=f"{tools_host}/v1", api_key="unused")
weather = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
asked = tools_oa.responses.create(
    model=tools_model,
    input="Weather in Paris?",
    tools=[weather],
    tool_choice="required",
    parallel_tool_calls=False,
    max_output_tokens=60,
    temperature=0,
)
calls = [item for item in asked.output if item.type == "function_call"]
answered = tools_oa.responses.create(
    model=tools_model,
    input=[
        {"role": "user", "content": "Weather in Paris?"},
        *[c.model_dump(exclude_none=True) for c in calls],
        *[{"type": "function_call_output", "call_id": c.call_id, "output": "18 C"} for c in calls],
    ],
    tools=[weather],
    tool_choice="none",
    max_output_tokens=4,
    temperature=0,
)
report(
    "responses_tools",
    names=[c.name for c in calls],
    arguments=[json.loads(c.arguments) for c in calls],
    answered=answered.status,
)


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=8)
    celsius: int = pydantic.Field(ge=-50, le=60)


parsed = tools_oa.responses.parse(
    model=tools_model, input="Weather in Paris as JSON", text_format=Weather, max_output_tokens=80, temperature=0
)
report("responses_parse", parsed=parsed.output_parsed.model_dump() if parsed.output_parsed else None)

# Embeddings: the SDK asks for base64 and decodes it itself.
embedded = oa.embeddings.create(model=model, input=["Hello", "A cat sat on the mat"])
floats = oa.embeddings.create(model=model, input="Hello", encoding_format="float")
report(
    "embeddings",
    count=len(embedded.data),
    dims=len(embedded.data[0].embedding),
    same=max(abs(a - b) for a, b in zip(embedded.data[0].embedding, floats.data[0].embedding)),
    norm=sum(x * x for x in embedded.data[1].embedding),
    tokens=embedded.usage.prompt_tokens,
)

# --- Anthropic Messages ---
an = anthropic.Anthropic(base_url=host, api_key="unused")
message = an.messages.create(
    model=model, max_tokens=8, temperature=0, messages=[{"role": "user", "content": "Hello"}]
)
text = "".join(b.text for b in message.content if b.type == "text")
report("anthropic", text=text, stop_reason=message.stop_reason, output_tokens=message.usage.output_tokens)
with an.messages.stream(
    model=model, max_tokens=8, temperature=0, messages=[{"role": "user", "content": "Hello"}]
) as stream:
    streamed = "".join(stream.text_stream)
    final = stream.get_final_message()
report("anthropic_stream", text=streamed, final="".join(b.text for b in final.content if b.type == "text"))
counted = an.messages.count_tokens(model=model, messages=[{"role": "user", "content": "Hello"}])
report("anthropic_count", input_tokens=counted.input_tokens, used=message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0))

tools_an = anthropic.Anthropic(base_url=tools_host, api_key="unused")
tool = {"name": "get_weather", "description": "The weather of a city", "input_schema": weather["parameters"]}
asked = tools_an.messages.create(
    model=tools_model,
    max_tokens=60,
    temperature=0,
    tools=[tool],
    tool_choice={"type": "any", "disable_parallel_tool_use": True},
    messages=[{"role": "user", "content": "Weather in Paris?"}],
)
uses = [b for b in asked.content if b.type == "tool_use"]
answered = tools_an.messages.create(
    model=tools_model,
    max_tokens=4,
    temperature=0,
    tools=[tool],
    tool_choice={"type": "none"},
    messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in asked.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "18 C"} for b in uses]},
    ],
)
report(
    "anthropic_tools",
    stop_reason=asked.stop_reason,
    names=[b.name for b in uses],
    inputs=[b.input for b in uses],
    answered=answered.stop_reason,
)
try:
    an.messages.create(model="claude-nope", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    report("anthropic_error", raised=None)
except anthropic.NotFoundError as e:
    report("anthropic_error", raised=type(e).__name__, status=e.status_code)

# Message Batches: the same request in a batch, and one for a model not served.
import time

batch = an.messages.batches.create(requests=[
    {"custom_id": "hello", "params": {"model": model, "max_tokens": 8, "temperature": 0,
                                      "messages": [{"role": "user", "content": "Hello"}]}},
    {"custom_id": "nope", "params": {"model": "claude-nope", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}},
])
created = [batch.processing_status, batch.request_counts.processing]
while batch.processing_status != "ended":
    time.sleep(0.05)
    batch = an.messages.batches.retrieve(batch.id)
results = {r.custom_id: r.result for r in an.messages.batches.results(batch.id)}
hello = results["hello"]
listed = [b.id for b in an.messages.batches.list(limit=5)]
deleted = an.messages.batches.delete(batch.id)
report(
    "anthropic_batch",
    created=created,
    counts=[batch.request_counts.succeeded, batch.request_counts.errored, batch.request_counts.canceled],
    types={k: r.type for k, r in results.items()},
    text="".join(b.text for b in hello.message.content if b.type == "text") if hello.type == "succeeded" else None,
    error=results["nope"].error.error.type if results["nope"].type == "errored" else None,
    listed=batch.id in listed,
    deleted=deleted.type,
)

# --- Ollama ---
ol = ollama.Client(host=host)
options = {"temperature": 0, "num_predict": 8}
chat = ol.chat(model=model, messages=[{"role": "user", "content": "Hello"}], options=options)
streamed = "".join(
    part.message.content
    for part in ol.chat(model=model, messages=[{"role": "user", "content": "Hello"}], options=options, stream=True)
)
report("ollama_chat", text=chat.message.content, streamed=streamed, done=chat.done, eval_count=chat.eval_count)
generated = ol.generate(model=model, prompt="Hello", options=options)
streamed = "".join(part.response for part in ol.generate(model=model, prompt="Hello", options=options, stream=True))
report("ollama_generate", text=generated.response, streamed=streamed)
# Fill in the middle: OpenAI's completions and Ollama's generate with a suffix.
before, after = "def add(a, b):\n    ", "\n    return c\n"
fim = oa.completions.create(model=model, prompt=before, suffix=after, max_tokens=8, temperature=0)
ol_fim = ol.generate(model=model, prompt=before, suffix=after, options=options)
report(
    "fill_in_the_middle",
    openai=fim.choices[0].text,
    ollama=ol_fim.response,
    prompt_tokens=fim.usage.prompt_tokens,
    ollama_prompt_tokens=ol_fim.prompt_eval_count,
)
embedded = ol.embed(model=model, input=["Hello", "A cat sat on the mat"])
report(
    "ollama_embed",
    count=len(embedded.embeddings),
    same=max(abs(a - b) for a, b in zip(embedded.embeddings[0], floats.data[0].embedding)),
)
report("ollama_list", names=[m.model for m in ol.list().models])
shown = ol.show(model)
report("ollama_show", capabilities=shown.capabilities, architecture=shown.modelinfo["general.architecture"])
report("ollama_ps", names=[m.model for m in ol.ps().models])
try:
    ol.chat(model="llama-nope", messages=[{"role": "user", "content": "x"}])
    report("ollama_error", raised=None)
except ollama.ResponseError as e:
    report("ollama_error", raised=type(e).__name__, status=e.status_code)
