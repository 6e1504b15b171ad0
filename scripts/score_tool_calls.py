"""Scores tool calls with tool_choice auto on a labelled set, through any OpenAI-compatible
server (llaisys, llama-server --jinja, vLLM): precision and recall of calls, where a call counts
as right when it names the expected tool and its arguments are a JSON object with the tool's
required keys. Greedy, one request per prompt, the set's tools offered to each.

Usage: python scripts/score_tool_calls.py BASE_URL MODEL [--set tests/tool-calls/labelled.json] [--show]
(BASE_URL ends in /v1.) Prints one JSON line per prompt with --show, then the table.
Needs only the standard library.
"""
import argparse
import json
import urllib.request

parser = argparse.ArgumentParser()
parser.add_argument("base_url")
parser.add_argument("model")
parser.add_argument("--set", default="tests/tool-calls/labelled.json")
parser.add_argument("--show", action="store_true")
parser.add_argument("--max-tokens", type=int, default=128)
args = parser.parse_args()

labelled = json.load(open(args.set, encoding="utf-8"))
required = {t["function"]["name"]: t["function"]["parameters"].get("required", []) for t in labelled["tools"]}


def ask(prompt):
    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": prompt}],
        "tools": labelled["tools"],
        "tool_choice": "auto",
        "temperature": 0,
        "max_tokens": args.max_tokens,
    }
    request = urllib.request.Request(
        f"{args.base_url}/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as r:
        return json.load(r)["choices"][0]["message"]


def valid(call):
    name = call["function"]["name"]
    try:
        arguments = json.loads(call["function"]["arguments"])
    except (json.JSONDecodeError, TypeError):
        return False
    return isinstance(arguments, dict) and all(k in arguments for k in required.get(name, []))


calls = right = wanted = 0
rows = []
for item in labelled["prompts"]:
    message = ask(item["prompt"])
    made = message.get("tool_calls") or []
    first = made[0] if made else None
    called = first["function"]["name"] if first else None
    ok = first is not None and called == item["expected"] and valid(first)
    calls += first is not None
    right += ok
    wanted += item["expected"] is not None
    rows.append({"prompt": item["prompt"], "expected": item["expected"], "called": called, "right": ok,
                 "content": (message.get("content") or "")[:80]})
    if args.show:
        print(json.dumps(rows[-1], ensure_ascii=False), flush=True)

precision = right / calls if calls else 0.0
recall = right / wanted if wanted else 0.0
false_calls = sum(1 for r in rows if r["expected"] is None and r["called"])
print(json.dumps({"model": args.model, "prompts": len(rows), "need_a_call": wanted, "calls": calls, "right": right,
                  "false_calls": false_calls, "precision": round(precision, 3), "recall": round(recall, 3)}))
