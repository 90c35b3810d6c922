#!/usr/bin/env python3
"""Reference renderer for the chat-template tests: renders templates with python3-jinja2
configured exactly as Hugging Face transformers does for apply_chat_template
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the `generation`
block, tojson with ensure_ascii=False, raise_exception, strftime_now).

Input (stdin): a JSON list of cases, each either
  {"kind": "raw", "template": str, "context": {...}}      -> template.render(**context)
  {"kind": "chat", "template": str, "messages": [...], "tools": [...] | null,
   "add_generation_prompt": bool, "kwargs": {...}, "special_tokens": {...}}
     -> rendered like transformers' apply_chat_template(tokenize=False), after turning
        tool_calls[].function.arguments JSON strings into dicts (as vLLM does).
Output (stdout): a JSON list with one {"ok": true, "text": str} or {"ok": false,
"raised": bool, "error": str} per case, in order ("raised": the template called
raise_exception, and "error" is its message). Exit status 3 when jinja2 cannot be imported.
"""
import json
import sys
from datetime import datetime

try:
    import jinja2
    from jinja2 import nodes
    from jinja2.exceptions import TemplateError
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:  # the C++ test turns this into a clear failure
    print(f"jinja2 is not importable by {sys.executable}: {e}", file=sys.stderr)
    sys.exit(3)


class GenerationBlock(Extension):
    """{% generation %}...{% endgeneration %} renders its body (transformers' AssistantTracker
    without the mask bookkeeping)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class RaisedException(TemplateError):
    """What the template's raise_exception(message) raises."""


def raise_exception(message):
    raise RaisedException(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def chat_context(case):
    messages = case["messages"]
    for m in messages:
        for call in (m.get("tool_calls") or []) if isinstance(m, dict) else []:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    parsed = json.loads(fn["arguments"])
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    fn["arguments"] = parsed
    context = dict(case.get("special_tokens") or {})
    context.update(case.get("kwargs") or {})
    context["messages"] = messages
    context["tools"] = case.get("tools")
    context["add_generation_prompt"] = case["add_generation_prompt"]
    return context


def main():
    cases = json.load(sys.stdin)
    env = make_env()
    compiled = {}
    results = []
    for case in cases:
        try:
            src = case["template"]
            if src not in compiled:
                compiled[src] = env.from_string(src)
            context = case["context"] if case["kind"] == "raw" else chat_context(case)
            results.append({"ok": True, "text": compiled[src].render(**context)})
        except RaisedException as e:
            results.append({"ok": False, "raised": True, "error": str(e)})
        except Exception as e:  # noqa: BLE001 - every failure is reported to the test
            results.append({"ok": False, "raised": False, "error": f"{type(e).__name__}: {e}"})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
