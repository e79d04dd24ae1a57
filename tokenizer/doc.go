// Package tokenizer turns prompts into token ids for kvroute.
//
// Two tokenizers implement the Tokenizer interface:
//
//   - Builtin: a deterministic tokenizer that needs no files, the default of the
//     emulated engine (`kvroute engine`). Equal text prefixes give equal token
//     prefixes, and English text comes out at about 4 characters per token.
//     Its algorithm is documented on Builtin and fixed for good.
//   - HuggingFace tokenizers loaded from a tokenizer.json (see Load), used by
//     the router's precise prefix mode so that its block hashes match those of
//     the engines' KV-cache events.
//
// Chat messages are rendered to a prompt by a chat template before they are
// tokenized: RenderChatML is the built-in template.
//
// Everything in this package is safe for concurrent use.
package tokenizer
