package emulator

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/kvroute/kvroute/tokenizer"
)

// textID maps an engine output token id to a regular id of the built-in
// tokenizer, so that every generated token renders to a pseudo-word (the
// engine's vocabulary differs from the tokenizer's, and its low ids are the
// tokenizer's special tokens).
func textID(t uint32) uint32 {
	const n = tokenizer.BuiltinVocabSize - tokenizer.BuiltinFirstRegular
	return tokenizer.BuiltinFirstRegular + t%n
}

// builtinWords renders the regular ids of the built-in tokenizer from a
// table of 85 syllables, so that rendering a generated token is a few
// multiplications and loads from a table that stays in the L1 cache (a
// table of every id, 1 MiB, costs a cache miss per token in a busy fleet).
// The built-in Decode renders regular id 16+r as a full stop when r%61 ==
// 0, a comma when r%53 == 0, and otherwise as a space and two syllables:
// r's two low base-85 digits, each a consonant and a vowel (17 x 5). Decode
// has no state across ids, so the concatenation equals Decode of the
// sequence. The table is built from Decode and checked against it for
// every regular id on first use (a few milliseconds); ok is false
// (renderTokens then calls Decode) if that layout ever changes, or if a
// word has a byte a JSON string escapes (appendText copies rendered words
// into a response body as they are). A word is
// packed in one uint64, its bytes from the low end and its length in the top
// byte: one 8-byte store per token.
var builtinWords = sync.OnceValues(func() (*wordTables, bool) {
	tok := tokenizer.Builtin()
	id := []uint32{0}
	word := func(r uint32) (uint64, bool) {
		id[0] = tokenizer.BuiltinFirstRegular + r
		w := tok.Decode(id)
		if len(w) > 7 || !jsonPlain(w) {
			return 0, false
		}
		var b [8]byte
		copy(b[:], w)
		b[7] = byte(len(w))
		return binary.LittleEndian.Uint64(b[:]), true
	}
	wt := new(wordTables)
	var ok1, ok2 bool
	wt.stop, ok1 = word(0)
	wt.comma, ok2 = word(53)
	if !ok1 || !ok2 {
		return nil, false
	}
	for a := range uint32(syllables) {
		// The word of an r = a + 85k that is neither a multiple of 61 nor
		// of 53: its first syllable is a's.
		r := a + syllables
		for r%61 == 0 || r%53 == 0 {
			r += syllables
		}
		w, ok := word(r)
		if !ok || w>>56 != 5 {
			return nil, false
		}
		wt.syl[a] = uint16(w >> 8)
	}
	const n = tokenizer.BuiltinVocabSize - tokenizer.BuiltinFirstRegular
	for r := uint32(0); r < n; r++ {
		if w, ok := word(r); !ok || w != wt.word(r) {
			return nil, false
		}
	}
	return wt, true
})

// jsonPlain reports whether openai.AppendJSONString leaves s's bytes as
// they are: printable ASCII other than " \ < > &.
func jsonPlain(s string) bool {
	for _, c := range []byte(s) {
		if c < 0x20 || c >= 0x7f || strings.IndexByte(`"\<>&`, c) >= 0 {
			return false
		}
	}
	return true
}

// syllables is the number of syllables: 17 consonants x 5 vowels.
const syllables = 85

// wordTables are builtinWords' tables.
type wordTables struct {
	stop, comma uint64
	syl         [syllables]uint16 // two bytes each
}

// word returns the packed text of regular id 16+r.
func (wt *wordTables) word(r uint32) uint64 {
	switch {
	case r%61 == 0:
		return wt.stop
	case r%53 == 0:
		return wt.comma
	}
	return 5<<56 | uint64(wt.syl[r/syllables%syllables])<<24 | uint64(wt.syl[r%syllables])<<8 | ' '
}

// renderTokens appends the text of generated tokens to dst.
func renderTokens(tok tokenizer.Tokenizer, dst []byte, ids []uint32, scratch []uint32) ([]byte, []uint32) {
	if tok == tokenizer.Builtin() {
		if wt, ok := builtinWords(); ok {
			const n = tokenizer.BuiltinVocabSize - tokenizer.BuiltinFirstRegular
			dst = slices.Grow(dst, 7*len(ids)+8) // room for each 8-byte store
			k := len(dst)
			buf := dst[:cap(dst)]
			for _, t := range ids {
				if t >= n { // rare: the engine's ids are below its vocabulary, mostly smaller than n
					t %= n
				}
				w := wt.word(t) // textID(t) - BuiltinFirstRegular
				binary.LittleEndian.PutUint64(buf[k:], w)
				k += int(w >> 56)
			}
			return dst[:k], scratch
		}
	}
	scratch = scratch[:0]
	for _, t := range ids {
		scratch = append(scratch, textID(t))
	}
	return append(dst, tok.Decode(scratch)...), scratch
}

// appendEncoder is the built-in tokenizer's Encode into a caller's slice.
type appendEncoder interface {
	AppendEncode(dst []uint32, text string) []uint32
}

// specialEncoder is a HuggingFace tokenizer's Encode with the special
// tokens its post-processor adds (Llama's BOS): what vLLM encodes a
// completion prompt with (add_special_tokens=True).
type specialEncoder interface {
	EncodeAddSpecial(text string) []uint32
}

// textCodec is how a server turns prompts into ids and generated ids into
// text with a tokenizer other than the built-in one (Config.Tokenizer, a
// HuggingFace tokenizer): chat messages go through its chat template
// (ChatML when it has none), a completion prompt gets its special tokens,
// and generated ids are decoded as they are, special tokens skipped (vLLM's
// default skip_special_tokens). It is nil for the built-in tokenizer, whose
// paths are faster (encode, encodeChat, renderTokens).
type textCodec struct {
	tok  tokenizer.Tokenizer
	enc  tokenizer.Tokenizer     // tok, behind a tokenizer.Cache when it is a *tokenizer.HF
	tmpl *tokenizer.ChatTemplate // nil: ChatML
	skip []uint64                // bit id: a special token, rendered as nothing
}

// newTextCodec returns tok's codec (nil for the built-in tokenizer). It
// fails when tok's chat template does not compile, or when tok's ids do not
// fit the model's vocabulary of vocab ids.
func newTextCodec(tok tokenizer.Tokenizer, vocab int) (*textCodec, error) {
	if tok == tokenizer.Builtin() {
		return nil, nil
	}
	c := &textCodec{tok: tok, enc: tok}
	if hf, ok := tok.(*tokenizer.HF); ok {
		c.enc = tokenizer.NewCache(hf, tokenizer.CacheConfig{MaxTokens: cacheTokens})
	}
	var err error
	if c.tmpl, err = tokenizer.TemplateOf(tok); err != nil {
		return nil, fmt.Errorf("emulator: tokenizer: %w", err)
	}
	if v, ok := tok.(tokenizer.Vocab); ok && vocab > 0 && v.VocabSize() > vocab {
		return nil, fmt.Errorf("emulator: the tokenizer has %d token ids, more than the model's vocabulary (%d): not this model's tokenizer?", v.VocabSize(), vocab)
	}
	type specials interface {
		SpecialTokens() []string
		TokenID(string) (uint32, bool)
	}
	if sp, ok := tok.(specials); ok {
		for _, text := range sp.SpecialTokens() {
			if id, ok := sp.TokenID(text); ok {
				if w := int(id / 64); w >= len(c.skip) {
					c.skip = append(c.skip, make([]uint64, w+1-len(c.skip))...)
				}
				c.skip[id/64] |= 1 << (id % 64)
			}
		}
	}
	return c, nil
}

// chat renders msgs with the chat template and the request's options o
// (nil: vLLM's defaults, the generation prompt and nothing else) and
// encodes the result as vLLM does a chat prompt: the template writes the
// special tokens, so none are added unless the request's
// add_special_tokens asks for them.
func (c *textCodec) chat(msgs []tokenizer.Message, msgsJSON []byte, o *chatOpts) ([]uint32, *apiError) {
	addGen := o == nil || o.addGen
	text := ""
	if c.tmpl == nil {
		text = tokenizer.RenderChatML(msgs, addGen)
	} else {
		opts := tokenizer.ChatOptions{AddGenerationPrompt: addGen}
		if o != nil {
			opts.JSONVars, opts.ToolsAsGiven = o.vars, o.toolsAsGiven
		}
		var err error
		// The messages as vLLM gives them to the template (tool calls,
		// names, content parts, ...).
		if msgsJSON != nil {
			text, err = c.tmpl.RenderJSON(msgsJSON, opts)
		} else {
			text, err = c.tmpl.Render(msgs, opts)
		}
		if err != nil {
			return nil, badRequest("chat template: %v", err)
		}
	}
	if o != nil && o.cont {
		var aerr *apiError
		if text, aerr = continueFinal(text, msgs); aerr != nil {
			return nil, aerr
		}
	}
	return c.prompt(text, o != nil && o.addSpecial), nil
}

// prompt encodes a prompt, with the tokenizer's special tokens (BOS) when
// special is set (a completion prompt's default).
func (c *textCodec) prompt(text string, special bool) []uint32 {
	if se, ok := c.enc.(specialEncoder); ok && special {
		return se.EncodeAddSpecial(text)
	}
	return c.enc.Encode(text)
}

// chatOpts are the options of a chat request that change its prompt, as
// vLLM applies them: its add_generation_prompt (default true) and
// continue_final_message (the same keys in chat_template_kwargs have no
// effect: vLLM's build_chat_params merges the request's own over them);
// add_special_tokens (default false for chat, and without effect when
// chat_template_kwargs' tokenize has transformers encode the rendering:
// tokenizer.ChatRequest.TransformersEncodes); and the template variables
// vars as tokenizer.ChatRequest.Vars resolves them (chat_template_kwargs
// but their null and "auto" values, their tools over the request's,
// given as they are when toolsAsGiven, the request's documents and
// reasoning_effort over theirs).
type chatOpts struct {
	addGen, cont, addSpecial, toolsAsGiven bool
	vars                                   map[string]json.RawMessage
}

// chatOptions returns a chat request's options, nil when they are all
// vLLM's defaults (the common case, which allocates nothing), or vLLM's
// error for them: a chat template of the request's own (vLLM's 400
// without --trust-request-chat-template), kwargs naming an argument vLLM
// passes itself ("messages", "conversation": Python's TypeError), and
// continue_final_message with the generation prompt (transformers'
// apply_chat_template's error). excludeNone is vLLM's
// --exclude-tools-when-tool-choice-none: the request's tools are not
// rendered when its tool_choice is "none".
func (r *apiRequest) chatOptions(excludeNone bool) (*chatOpts, *apiError) {
	tools := r.Tools
	if excludeNone && r.toolChoiceNone() {
		tools = nil
	}
	if (r.AddGenerationPrompt == nil || *r.AddGenerationPrompt) && !r.ContinueFinalMessage &&
		(r.AddSpecialTokens == nil || !*r.AddSpecialTokens) && len(r.ChatTemplateKwargs) == 0 && !hasJSON(tools) && !hasJSON(r.Documents) &&
		!hasJSON(r.ReasoningEffort) && !hasJSON(r.ChatTemplate) {
		return nil, nil
	}
	o := &chatOpts{addGen: r.AddGenerationPrompt == nil || *r.AddGenerationPrompt, cont: r.ContinueFinalMessage,
		addSpecial: r.AddSpecialTokens != nil && *r.AddSpecialTokens}
	req := tokenizer.ChatRequest{Tools: tools, Documents: r.Documents, ReasoningEffort: r.ReasoningEffort,
		ChatTemplate: r.ChatTemplate, Kwargs: r.ChatTemplateKwargs}
	var opts tokenizer.ChatOptions
	switch err := req.Vars(&opts); {
	case errors.Is(err, tokenizer.ErrRequestChatTemplate):
		return nil, badRequest("Chat template is passed with request, but --trust-request-chat-template is not set. " +
			"Refused request with untrusted chat template.")
	case errors.Is(err, tokenizer.ErrKwargsArgument):
		for _, k := range []string{"conversation", "messages"} {
			if hasJSON(r.ChatTemplateKwargs[k]) {
				return nil, badRequest("got multiple values for keyword argument '%s'", k)
			}
		}
		return nil, badRequest("%v", err)
	case err != nil:
		return nil, badRequest("%v", err)
	}
	o.vars, o.toolsAsGiven = opts.JSONVars, opts.ToolsAsGiven
	if self, _ := req.TransformersEncodes(); self {
		// vLLM has transformers encode the rendering, without special
		// tokens (its encoding arguments, which may pad or truncate, are
		// not followed)
		o.addSpecial = false
	}
	if o.cont && o.addGen {
		return nil, badRequest("continue_final_message and add_generation_prompt are not compatible. " +
			"Use continue_final_message when you want the model to continue the final message, " +
			"and add_generation_prompt when you want to add a header that will prompt it to start a new assistant message instead.")
	}
	return o, nil
}

// toolChoiceNone reports whether the request's tool_choice is "none" (as
// given: vLLM's default "none", for a request without tools, has no tools
// to leave out).
func (r *apiRequest) toolChoiceNone() bool {
	if r.opts == nil || len(r.opts.ToolChoice) == 0 {
		return false
	}
	v, ok := tokenizer.PyValue(r.opts.ToolChoice)
	return ok && v == "none"
}

// hasJSON reports whether a raw field holds a value other than null.
func hasJSON(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// continueFinal cuts the rendered chat text after the final message's
// content, as transformers' apply_chat_template does for
// continue_final_message (the template's end of turn dropped, so that the
// model continues that message): at the content's last occurrence, with
// its trailing whitespace when the template kept it.
func continueFinal(text string, msgs []tokenizer.Message) (string, *apiError) {
	final := ""
	if len(msgs) > 0 {
		final = msgs[len(msgs)-1].Content
	}
	cut, ok := tokenizer.ContinueFinal(text, final)
	if !ok {
		return "", badRequest("continue_final_message is set but the final message does not appear in the chat after " +
			"applying the chat template! This can happen if the chat template deletes portions of the final message. " +
			"Please verify the chat template and final message in your chat to ensure they are compatible.")
	}
	return cut, nil
}

// render appends the text of generated ids to dst, special tokens skipped.
// A character's bytes may be split across calls (byte-level BPE); the
// stream holds an incomplete character back (completeText).
func (c *textCodec) render(dst []byte, ids, scratch []uint32) ([]byte, []uint32) {
	scratch = scratch[:0]
	for _, t := range ids {
		if w := int(t / 64); w < len(c.skip) && c.skip[w]&(1<<(t%64)) != 0 {
			continue
		}
		scratch = append(scratch, t)
	}
	return append(dst, c.tok.Decode(scratch)...), scratch
}

// completeText returns the longest length <= upto (and >= from) at which
// text[from:n] does not end inside a UTF-8 character whose bytes are all
// there or still to come: a streamed chunk must hold the first bytes of a
// character back until its last byte is generated. Invalid bytes are not
// held (a JSON encoder writes them as U+FFFD, as vLLM's detokenizer does).
func completeText(text []byte, from, upto int) int {
	for k := upto - 1; k >= from && k >= upto-utf8.UTFMax; k-- {
		if b := text[k]; utf8.RuneStart(b) {
			if b >= utf8.RuneSelf && !utf8.FullRune(text[k:upto]) {
				return k
			}
			return upto
		}
	}
	return upto
}

// eosOf returns tok's end-of-sequence id, when it has one.
func eosOf(tok tokenizer.Tokenizer) (uint32, bool) {
	if e, ok := tok.(tokenizer.EOSer); ok {
		return e.EOS()
	}
	return 0, false
}

// encodePrompt encodes a completion prompt's text, with the tokenizer's
// special tokens unless the request's add_special_tokens is false.
func (s *Server) encodePrompt(text string, r *apiRequest) []uint32 {
	if s.codec != nil {
		return s.codec.prompt(text, r.AddSpecialTokens == nil || *r.AddSpecialTokens)
	}
	return s.encode(text)
}

// encodeMessages encodes a chat request's messages (for a HuggingFace
// template, their JSON, with the keys vLLM gives a template besides role
// and content) through the chat template with the request's options o (chatOptions; nil for vLLM's
// defaults); a template that fails is the client's error. The built-in
// tokenizer's ChatML template has no variables but add_generation_prompt,
// and the tokenizer no special tokens to add.
func (s *Server) encodeMessages(r *apiRequest, o *chatOpts) ([]uint32, *apiError) {
	msgs := r.chatMessages
	if s.codec != nil {
		return s.codec.chat(msgs, r.messagesJSON, o)
	}
	if o == nil || o.addGen && !o.cont {
		return s.encodeChat(msgs), nil
	}
	text := tokenizer.RenderChatML(msgs, o.addGen)
	if o.cont {
		var aerr *apiError
		if text, aerr = continueFinal(text, msgs); aerr != nil {
			return nil, aerr
		}
	}
	return s.encode(text), nil
}

// render appends the text of generated ids to dst.
func (s *Server) render(dst []byte, ids, scratch []uint32) ([]byte, []uint32) {
	if s.codec != nil {
		return s.codec.render(dst, ids, scratch)
	}
	return renderTokens(s.cfg.Tokenizer, dst, ids, scratch)
}

// cacheTokens bounds a server's tokenizer cache (tokenizer.Cache: the ids
// of the text between special tokens, such as a chat's system prompt and
// earlier turns, are looked up instead of encoded again): 4 bytes a token,
// and about 44 tokens' worth per cached segment (tokenizer.CacheConfig).
const cacheTokens = 1 << 16

// encode is Tokenizer.Encode; for the built-in tokenizer (through the
// server's cache, tokCache, when it has one) the ids go into a slice sized
// for English text (about 3.6 bytes a token) up front, so that it does not
// grow (Encode's starts at one id per 4 bytes).
func (s *Server) encode(text string) []uint32 {
	if s.cfg.Tokenizer == tokenizer.Builtin() {
		var ae appendEncoder = s.tokCache
		if s.tokCache == nil {
			ae, _ = s.cfg.Tokenizer.(appendEncoder)
		}
		if ae != nil {
			return ae.AppendEncode(make([]uint32, 0, len(text)/3+8), text)
		}
	}
	return s.cfg.Tokenizer.Encode(text)
}

// encodeChat is encode(tokenizer.RenderChatML(msgs, true)) with the prompt
// rendered into a recycled buffer (the ids are all that is kept): the
// built-in tokenizer's chat prompt.
func (s *Server) encodeChat(msgs []tokenizer.Message) []uint32 {
	buf := getBody()
	*buf = appendChatML((*buf)[:0], msgs)
	ids := s.encode(bytesString(*buf))
	putBody(buf)
	return ids
}

// appendChatML appends tokenizer.RenderChatML(msgs, true) to dst (a test
// compares the two).
func appendChatML(dst []byte, msgs []tokenizer.Message) []byte {
	n := len(tokenizer.ChatMLStart) + len("assistant\n")
	for _, m := range msgs {
		n += len(tokenizer.ChatMLStart) + len(m.Role) + 1 + len(m.Content) + len(tokenizer.ChatMLEnd) + 1
	}
	dst = slices.Grow(dst, n)
	for _, m := range msgs {
		dst = append(dst, tokenizer.ChatMLStart...)
		dst = append(dst, m.Role...)
		dst = append(dst, '\n')
		dst = append(dst, m.Content...)
		dst = append(dst, tokenizer.ChatMLEnd...)
		dst = append(dst, '\n')
	}
	dst = append(dst, tokenizer.ChatMLStart...)
	return append(dst, "assistant\n"...)
}

// stopMatch finds a stop string in text that ends at or after from (the
// first byte not checked before), as vLLM's check_stop_strings does: the
// first of stops, in the request's order, that occurs there (at its first
// occurrence). It returns the index where the match starts and the stop
// string, or -1.
func stopMatch(text []byte, from int, stops []string) (int, string) {
	for _, s := range stops {
		if s == "" {
			continue
		}
		start := max(0, from-len(s)+1)
		if i := strings.Index(string(text[start:]), s); i >= 0 {
			return start + i, s
		}
	}
	return -1, ""
}

// mix64 is SplitMix64's finaliser: a cheap, well-spread hash of x.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// eosAt draws the position of the model's EOS token for a request with the
// given seed: geometric with the given mean, at least 1. mean <= 0 means the
// model never emits EOS (0).
func eosAt(seed uint64, mean float64) int {
	if mean <= 0 {
		return 0
	}
	u := (float64(mix64(seed^0x656f73)>>11) + 0.5) / (1 << 53) // (0,1)
	n := 1 + int(math.Floor(math.Log(u)/math.Log1p(-1/math.Max(mean, 1.0000001))))
	return max(1, n)
}
