#!/usr/bin/python3
"""Renders every chat template fixture over conversations.json with Python's
jinja2, set up the way Hugging Face's apply_chat_template sets it up
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
a {% generation %} tag, HF's tojson, raise_exception, strftime_now), and
writes expected.json: {template: {conversation: text or null (error)}}.

Usage: gen_expected.py TEMPLATE_DIR CONVERSATIONS_JSON OUT_JSON [TOKENIZER_CONFIG...]
A tokenizer_config.json's chat_template is stored under the key
"<model dir name>/tokenizer_config.json" (the default model's template).
Run it again (Debian's python3-jinja2) after changing the fixtures or the
conversations; test_chat.py compares the C renderer against its output.
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTag(Extension):
    """HF's AssistantTracker without the tracking: renders the body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    tdir, conv_path, out_path = sys.argv[1:4]
    configs = sys.argv[4:]
    with open(conv_path, encoding="utf-8") as f:
        conv = json.load(f)
    env = make_env(conv["now"])
    result = {}
    sources = []
    for name in sorted(os.listdir(tdir)):
        if name.endswith(".jinja"):
            with open(os.path.join(tdir, name), encoding="utf-8") as f:
                sources.append((name, f.read()))
    for cfg in configs:
        with open(cfg, encoding="utf-8") as f:
            key = os.path.basename(os.path.dirname(os.path.abspath(cfg))) + "/tokenizer_config.json"
            sources.append((key, json.load(f)["chat_template"]))
    for name, src in sources:
        per = {}
        try:
            tmpl = env.from_string(src)
        except Exception as e:  # noqa: BLE001 - any compile error
            tmpl = None
            err = "compile: %s" % e
        for c in conv["conversations"]:
            if tmpl is None:
                per[c["name"]] = None
                continue
            try:
                per[c["name"]] = tmpl.render(messages=c["messages"],
                                             bos_token=conv["bos_token"],
                                             eos_token=conv["eos_token"],
                                             add_generation_prompt=c["add_generation_prompt"],
                                             **c.get("extra", {}))
            except Exception as e:  # noqa: BLE001 - the template raised
                per[c["name"]] = None
                err = "%s: %s" % (type(e).__name__, e)
        if all(v is None for v in per.values()):
            print("%-55s all conversations fail: %s" % (name, err), file=sys.stderr)
        result[name] = per
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
