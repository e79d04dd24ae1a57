// Package openai holds the OpenAI-compatible wire formats kvroute speaks,
// shared by the router (package proxy), the emulated engine and the load
// generator:
//
//   - ParseRequest, the one-pass scanner that pulls what routing needs (model,
//     canonical prompt, stream, max tokens, user, lora_path) out of a completion or chat
//     request body without decoding it into a document tree;
//   - the OpenAI-style error body and WriteError, the one place an
//     HTTP-facing *kvroute.Error becomes a response, and AppendErrorEvent,
//     the SSE error event vLLM ends a failed stream with;
//   - response and streaming-chunk types and the SSE reader and writer;
//   - the forms a request names a LoRA adapter in (AdapterForm: vLLM's
//     "model", which TGI reads too, SGLang's "<base>:<adapter>" and
//     "lora_path", llama.cpp's "lora" list of adapter ids and scales), what
//     an engine reads from a body (AdapterRead), and NameAdapter, which
//     rewrites a body's top level for an engine of another form, and
//     NameLlamaAdapter for a llama.cpp server (DecodeObject, EncodeObject:
//     the body rewriter the P/D handoff shares);
//   - UsageTail and ParseUsage, which read the usage an engine reports at
//     the end of an answer from its last bytes, for the router's prefix
//     cache feedback (package proxy, and package disagg for a request run
//     whole on one node).
//
// Functions are safe for concurrent use; an SSEReader, SSEWriter or
// UsageTail belongs to one goroutine, and so does a ChunkHeader (the chunk
// writers keep its JSON in it).
package openai
