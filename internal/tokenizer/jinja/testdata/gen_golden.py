#!/usr/bin/env python3
"""Regenerates golden.json: expected renderings by Python Jinja2 configured
the way transformers configures it for chat templates.

Usage: gen_golden.py QWEN3_TOKENIZER_CONFIG_JSON > golden.json
"""
import json
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

qwen3 = json.load(open(sys.argv[1]))["chat_template"]

SMALL = [
    ("{{ 'a' ~ 1 ~ none ~ true }}", {}),
    ("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 3 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 1.5e-7 }} {{ 0.1 + 0.2 }}", {}),
    ("{{ [1, 'x', none, true, 2.5] }} {{ {'a': 1, 'b': 'q\"'} }}", {}),
    ("{{ 'abc'[::-1] }}{{ 'abcdef'[1:4] }}{{ [1,2,3,4][-2:] }}{{ [1,2,3,4][::2] }}{{ 'héllo'[1] }}", {}),
    ("{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }} {% endfor %}", {"xs": ["a", "b", "c"]}),
    ("{% for x in xs if x > 1 %}{{ x }}{% if loop.last %}!{% endif %}{% else %}empty{% endfor %}", {"xs": [1, 2, 3]}),
    ("{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", {"xs": []}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"a": 1, "b": 2}}),
    ("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("{% set ns = namespace(n=0) %}{% for x in [1,2,3] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}", {}),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c %}block {{ a }}{% endset %}[{{ c }}]", {}),
    ("{% if x is defined %}d{% elif y is not none %}y{% else %}e{% endif %}{{ z is undefined }}{{ 3 is odd }}{{ 'A' is upper }}", {"y": None}),
    ("{{ '  pad  '|trim }}|{{ 'xxhixx'.strip('x') }}|{{ ' a b '.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ '\\n\\nq\\n'.lstrip('\\n') }}", {}),
    ("{{ 'Hello'.startswith('He') }}{{ 'Hello'.endswith(('x', 'lo')) }}{{ 'hello world'.title() }}{{ 'hello'.upper() }}{{ 'HeLLo'|lower }}{{ 'abc'.replace('b', 'B') }}", {}),
    ("{{ xs|length }}{{ xs|first }}{{ xs|last }}{{ xs|join('-') }}{{ xs|reverse|list }}{{ 'abc'|length }}{{ none|default('dflt') }}{{ undefined_var|default('u') }}", {"xs": [1, 2, 3]}),
    ("{{ d|tojson }} {{ d|tojson(indent=2) }} {{ 'é\"\\n<>&'|tojson }} {{ [1.0, none, true]|tojson }}", {"d": {"name": "f", "args": {"x": [1, 2], "y": "z"}}}),
    ("{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}|{{ msgs|rejectattr('role', 'equalto', 'user')|list|length }}", {"msgs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}),
    ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', punct='?') }}", {}),
    ("{{ 'yes' if x else 'no' }}{{ 'a' if not x }}|{{ x or 'fallback' }}|{{ x and 'both' }}|{{ 1 in [1,2] }}{{ 'b' in 'abc' }}{{ 'k' in {'k': 1} }}{{ 3 not in [1] }}", {"x": 0}),
    ("  {% if true %}\n    line\n  {% endif %}\nafter\n{# comment #}\n  {%- if true -%}  trimmed  {%- endif %}\n{{ 'x' }}  \n", {}),
    ("{%+ if true %}keep{% endif %}\n  {{- ' dash' -}}  \n  end", {}),
    ("{{ \"'single'\" }}{{ 'it\\'s' }}{{ \"}}\" }}{{ '{% raw %}' }}", {}),
    ("{{ range(0, 10, 3)|list }}{{ range(10, 0, -3)|list }}{{ range(3, 1)|list }}{{ range(4)|sum }}{{ [3, 1, 3]|unique|list }}", {}),
    ("{{ messages[0]['role'] }}{{ messages[0].content }}{{ messages[-1].role }}{{ messages[5] is defined }}", {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}),
]

QWEN3_CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>\nreasoning here\n</think>\n\nHello there."}, {"role": "user", "content": "again"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "plain answer"}, {"role": "user", "content": "<tool_response>x</tool_response>"}],
    [{"role": "system", "content": "sys"}, {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}, {"role": "assistant", "content": "<think>t</think>a2"}],
    [{"role": "user", "content": "use the tool"}, {"role": "tool", "content": "result 1"}, {"role": "tool", "content": "result 2"}, {"role": "user", "content": "thanks"}],
    [{"role": "user", "content": "Unicode: 你好 🤖 e\u0301"}, {"role": "system", "content": "late system"}],
]

cases = []
for tpl, vars_ in SMALL:
    cases.append({"template": tpl, "vars": vars_, "want": env.from_string(tpl).render(**vars_)})
for conv in QWEN3_CONVERSATIONS:
    for agp in (True, False):
        vars_ = {"messages": conv, "add_generation_prompt": agp, "tools": None, "documents": None,
                 "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
        cases.append({"template": "qwen3", "vars": vars_, "want": env.from_string(qwen3).render(**vars_)})
vars_ = {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": True, "enable_thinking": False}
cases.append({"template": "qwen3", "vars": vars_, "want": env.from_string(qwen3).render(**vars_)})

json.dump({"qwen3": qwen3, "cases": cases}, sys.stdout, ensure_ascii=False, indent=1)
print()
