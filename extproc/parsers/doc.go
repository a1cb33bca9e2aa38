// Package parsers is the picker's request handler: it resolves each
// request's path to one of the configured request parsers (llm-d's
// requestHandler.parsers) and has it turn the body into the routing view
// (internal/openai's Request) the plugins read.
//
// Resolution is llm-d's: each parser claims path suffixes; the longest
// claimed suffix of the path (query and trailing "/" removed) wins; a
// parser claiming none is the fallback for every other path and must come
// last; without a fallback an unclaimed path is refused (400). Unlike
// llm-d, which logs and skips them, a parser listed after the fallback or
// a second parser of one type is a configuration error: kvgate does not
// accept configuration it would ignore.
package parsers
