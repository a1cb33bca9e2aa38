// Package jinja renders the subset of Jinja2 that Hugging Face chat
// templates use, with the environment settings transformers applies to them
// (trim_blocks, lstrip_blocks, loop controls, the tojson and raise_exception
// helpers), so that a prompt rendered here is byte-identical to the one vLLM
// renders before tokenizing.
//
// Supported: {{ }}, {% if/elif/else %}, {% for %} (with else, inline if,
// tuple targets, loop.*), {% set %} (including namespace attributes and block
// set), {% macro %}, {% break %}/{% continue %}, {% generation %}, whitespace
// control, Python-style expressions, string/dict methods, and the common
// filters and tests. Anything else is a *SyntaxError naming the construct.
//
// Rendering is bounded (output size, loop iterations, call depth), so a
// hostile template yields an error instead of exhausting memory.
package jinja
