package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenizer"
)

// precise is a model's token-level prefix matching (config precise): the
// tokenizer and chat template its engines use, the KV block size, and the
// precise index its endpoints' KV events feed. It is immutable after
// newPrecise and safe for concurrent use (the tokenizer cache and the index
// are).
type precise struct {
	blockSize int
	builtin   tokenizer.Tokenizer     // the built-in tokenizer, or nil
	cache     *tokenizer.Cache        // a HuggingFace tokenizer behind its prefix cache, or nil
	tmpl      *tokenizer.ChatTemplate // the HuggingFace chat template; nil renders ChatML
	index     *kvindex.Index          // fed by KV events; nil when no endpoint publishes them
	endpoints []string                // the endpoints whose KV events feed index
	// now is the clock of the chat template's strftime_now (Llama 3.1 to
	// 3.3's "Today Date"); nil: the time of the render, as vLLM's
	// (tokenizer.ChatOptions.Now). Tests fix it.
	now func() time.Time
}

// newPrecise builds a model's precise mode, or returns nil when it is off.
func newPrecise(m *config.Model) (*precise, error) {
	pr := m.Precise
	if !pr.Enabled() {
		return nil, nil
	}
	pc := &precise{blockSize: pr.BlockSize}
	if pr.Tokenizer == config.BuiltinTokenizer {
		pc.builtin = tokenizer.Builtin()
	} else {
		hf, err := tokenizer.LoadDir(pr.Tokenizer)
		if err != nil {
			return nil, fmt.Errorf("precise.tokenizer: %w", err)
		}
		pc.cache = tokenizer.NewCache(hf, tokenizer.CacheConfig{MaxTokens: pr.CacheTokens})
		if pc.tmpl, err = tokenizer.TemplateOf(hf); err != nil {
			return nil, fmt.Errorf("precise.tokenizer: chat template: %w", err)
		}
	}
	for _, e := range m.Endpoints {
		switch {
		case e.KVEvents.Address == "":
		case e.DataParallelSize > 1: // each rank its own events
			for i := range e.DataParallelSize {
				pc.endpoints = append(pc.endpoints, e.RankID(i))
			}
		default:
			pc.endpoints = append(pc.endpoints, e.ID)
		}
	}
	if len(pc.endpoints) > 0 {
		pc.index = kvindex.NewIndex(kvindex.IndexConfig{BlockSize: pr.BlockSize, Capacity: pr.IndexCapacity})
	}
	return pc, nil
}

// kvSink is what a model's KV-event subscribers write to: the precise
// index, and, when an endpoint's event history is reset (Clear: the engine
// restarted, or a gap could not be filled; Remove: its subscription ended),
// the router forgets its own recent dispatches there too, which stand in
// for the events not yet come (router.Config.EventGap) and would otherwise
// claim blocks the engine no longer has.
type kvSink struct {
	*kvindex.Index
	router *router.Router
}

func (s *kvSink) Clear(endpoint string) {
	s.Index.Clear(endpoint)
	s.router.ForgetDispatches(endpoint)
}

func (s *kvSink) Remove(endpoint string) {
	s.Index.Remove(endpoint)
	s.router.ForgetDispatches(endpoint)
}

// errNotTokenized says a request's prompt has no single token sequence to
// match (a batch of prompts); it is routed on characters instead.
var errNotTokenized = errors.New("a batch of prompts is matched on characters")

// preciseBody holds the request fields a chat template or a completion
// prompt's tokenization depends on.
type preciseBody struct {
	Prompt              json.RawMessage            `json:"prompt"`
	Messages            json.RawMessage            `json:"messages"`
	Tools               json.RawMessage            `json:"tools"`
	Documents           json.RawMessage            `json:"documents"`
	ReasoningEffort     json.RawMessage            `json:"reasoning_effort"`
	ChatTemplate        json.RawMessage            `json:"chat_template"`
	ChatTemplateKwargs  map[string]json.RawMessage `json:"chat_template_kwargs"`
	AddGenerationPrompt *bool                      `json:"add_generation_prompt"`
	AddSpecialTokens    *bool                      `json:"add_special_tokens"`
	ContinueFinal       bool                       `json:"continue_final_message"`
}

// errBothGenerationOptions is a chat request with both
// add_generation_prompt and continue_final_message, which vLLM refuses
// (400); it is routed on characters.
var errBothGenerationOptions = errors.New("precise: continue_final_message and add_generation_prompt are not compatible")

// errFinalNotRendered is a continue_final_message request whose final
// message's content the chat template did not write as it is (vLLM's 400);
// it is routed on characters.
var errFinalNotRendered = errors.New("precise: continue_final_message: the final message does not appear in the rendered chat")

// errEmptyTools is a chat request whose tools are an empty list, which
// vLLM refuses (400, "`tools` must not be an empty array", its
// check_tool_usage); it is routed on characters and the engine answers
// it. (Before that check vLLM rendered it with an empty tools list: Llama
// 3.1's template then writes its tool header.)
var errEmptyTools = errors.New("precise: tools is an empty list, which vLLM refuses")

// chatOptions returns the chat template's options for b and whether the
// rendered chat is cut after its final message (continue_final_message),
// as vLLM resolves them: add_generation_prompt (default true) and
// continue_final_message, the request's own (the same keys in
// chat_template_kwargs have no effect: vLLM merges the request's over
// them); the template variables as tokenizer.ChatRequest.Vars resolves
// them: chat_template_kwargs' keys but those whose value is null or
// "auto", its tools over the request's (the kwargs' as the client wrote
// them, the request's as vLLM's request model dumps them), the request's
// documents and reasoning_effort over the kwargs' own. Tools that are an
// empty list are errEmptyTools; a request with its own chat template, or
// kwargs naming "messages" or "conversation", vLLM refuses too
// (tokenizer.ErrRequestChatTemplate, tokenizer.ErrKwargsArgument).
//
// A vLLM server started with --exclude-tools-when-tool-choice-none renders
// a request whose tool_choice is "none" without its tools; precise mode
// assumes the default (off), which renders them, as the emulated engine
// does unless emulator.Config.ExcludeToolsWhenToolChoiceNone is set.
func (b *preciseBody) chatOptions() (tokenizer.ChatOptions, bool, error) {
	addGen, cont, err := generationOptions(b.AddGenerationPrompt, b.ContinueFinal)
	if err != nil {
		return tokenizer.ChatOptions{}, false, err
	}
	if emptyList(b.Tools) {
		return tokenizer.ChatOptions{}, false, errEmptyTools
	}
	opts := tokenizer.ChatOptions{AddGenerationPrompt: addGen}
	req := tokenizer.ChatRequest{Tools: b.Tools, Documents: b.Documents, ReasoningEffort: b.ReasoningEffort,
		ChatTemplate: b.ChatTemplate, Kwargs: b.ChatTemplateKwargs}
	if err := req.Vars(&opts); err != nil {
		return tokenizer.ChatOptions{}, false, fmt.Errorf("precise: %w", err)
	}
	return opts, cont, nil
}

// emptyList reports whether raw is a JSON array with no elements.
func emptyList(raw json.RawMessage) bool {
	if len(raw) == 0 || raw[0] != '[' {
		return false
	}
	var list []json.RawMessage
	return json.Unmarshal(raw, &list) == nil && len(list) == 0
}

// generationOptions resolves a chat request's add_generation_prompt
// (addGen, default true) and continue_final_message (cont) as vLLM does:
// the request's own fields, whatever chat_template_kwargs says (vLLM's
// build_chat_params merges them over the kwargs: merge_kwargs(kwargs,
// {add_generation_prompt, continue_final_message, ...})); both set is
// vLLM's 400 (errBothGenerationOptions).
func generationOptions(addGen *bool, cont bool) (bool, bool, error) {
	gen := addGen == nil || *addGen
	if gen && cont {
		return false, false, errBothGenerationOptions
	}
	return gen, cont, nil
}

// finalContent is the text of a chat's final message, as
// continue_final_message cuts after it: its content as a string, or the
// text of its parts (tokenizer.StringContent).
func finalContent(messages json.RawMessage) (string, error) {
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(messages, &msgs); err != nil || len(msgs) == 0 {
		return "", errors.New("precise: continue_final_message without messages")
	}
	return tokenizer.StringContent(msgs[len(msgs)-1].Content)
}

// continueFinal cuts text, a chat rendered for messages, after the final
// message (tokenizer.ContinueFinal).
func continueFinal(text string, messages json.RawMessage) (string, error) {
	final, err := finalContent(messages)
	if err != nil {
		return "", err
	}
	cut, ok := tokenizer.ContinueFinal(text, final)
	if !ok {
		return "", errFinalNotRendered
	}
	return cut, nil
}

// prepare tokenizes req's prompt as the model's engines do and sets its
// token fields: PromptTokens, BlockSize and BlockHashes (chained
// kvindex.HashTokensKeyed of the full blocks, with req.Adapter and
// req.CacheSalt: the keys the precise index gives the blocks an engine
// stored for the same adapter and salt). ri is
// the routing parse of body. On error req is unchanged and the router
// matches on characters.
func (pc *precise) prepare(kind openai.Kind, body []byte, ri *openai.RequestInfo, req *kvroute.Request) error {
	ids, err := pc.tokens(kind, body, ri)
	if err != nil {
		return err
	}
	req.PromptTokens = len(ids)
	req.BlockSize = pc.blockSize
	req.BlockHashes = kvindex.HashTokensKeyed(ids, req.Adapter, req.CacheSalt, pc.blockSize, make([]uint64, 0, len(ids)/pc.blockSize))
	return nil
}

// tokens returns the prompt's token ids: for chat the messages rendered
// with the chat template (ChatML for the built-in tokenizer or a tokenizer
// without a template) with the generation prompt, encoded without added
// special tokens unless the request sets add_special_tokens (and its
// chat_template_kwargs do not set tokenize: then vLLM has transformers
// encode the rendering, which adds none whatever the request says;
// tokenizer.ChatRequest.TransformersEncodes); for a
// completion the prompt encoded with them unless it sets it false (as
// vLLM does), or the ids the request sent.
func (pc *precise) tokens(kind openai.Kind, body []byte, ri *openai.RequestInfo) ([]uint32, error) {
	body = openai.TrimBOM(body) // as ParseRequest and the engines read it
	if kind == openai.KindCompletion && ri.TokenIDs != nil {
		var b preciseBody
		if err := json.Unmarshal(body, &b); err != nil {
			return nil, err
		}
		var one []uint32
		if json.Unmarshal(b.Prompt, &one) != nil {
			return nil, errNotTokenized // a batch of token sequences
		}
		return one, nil
	}
	if kind == openai.KindChat && pc.tmpl == nil {
		return pc.chatMLTokens(body)
	}
	var b preciseBody
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, fmt.Errorf("precise: %w", err)
	}
	if kind == openai.KindCompletion {
		var text string
		if err := json.Unmarshal(b.Prompt, &text); err != nil {
			var batch []string
			if json.Unmarshal(b.Prompt, &batch) != nil || len(batch) != 1 {
				return nil, errNotTokenized
			}
			text = batch[0]
		}
		if pc.builtin != nil {
			return pc.builtin.Encode(text), nil
		}
		if b.AddSpecialTokens != nil && !*b.AddSpecialTokens {
			return pc.cache.Encode(text), nil
		}
		return pc.cache.EncodeAddSpecial(text), nil
	}
	opts, cont, err := b.chatOptions()
	if err != nil {
		return nil, err
	}
	if pc.now != nil {
		opts.Now = pc.now()
	}
	text, err := pc.tmpl.RenderJSON(b.Messages, opts)
	if err != nil {
		return nil, fmt.Errorf("precise: chat template: %w", err)
	}
	if cont {
		if text, err = continueFinal(text, b.Messages); err != nil {
			return nil, err
		}
	}
	req := tokenizer.ChatRequest{Kwargs: b.ChatTemplateKwargs}
	self, err := req.TransformersEncodes()
	if err != nil {
		return nil, fmt.Errorf("precise: %w", err)
	}
	if !self && b.AddSpecialTokens != nil && *b.AddSpecialTokens { // vLLM's chat default is false
		return pc.cache.EncodeAddSpecial(text), nil
	}
	return pc.cache.Encode(text), nil
}

// chatMLBody is a chat request as the ChatML rendering needs it, decoded
// in one pass.
type chatMLBody struct {
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	ContinueFinal       bool            `json:"continue_final_message"`
}

// chatMLTokens renders a chat request with ChatML (the built-in template,
// or a tokenizer without one) and encodes it. Content given as parts is
// read as vLLM and the emulated engine read it for a text-only model
// (tokenizer.StringContent): the parts read as text ("text", "input_text",
// "output_text", "refusal", "thinking", "tool_reference", plain strings)
// joined with "\n", those without text dropped. A part that is not text
// (an image) is an error, and the request is then matched on characters:
// its tokens depend on the model's placeholders, and a text-only engine
// refuses it with its own 400. So are tools that are an empty list
// (errEmptyTools), which the engine refuses too.
func (pc *precise) chatMLTokens(body []byte) ([]uint32, error) {
	var in chatMLBody
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, fmt.Errorf("precise: %w", err)
	}
	if emptyList(in.Tools) {
		return nil, errEmptyTools
	}
	out := make([]tokenizer.Message, len(in.Messages))
	for i, m := range in.Messages {
		out[i].Role = m.Role
		if len(m.Content) > 0 && m.Content[0] == '"' && json.Unmarshal(m.Content, &out[i].Content) == nil {
			continue // the common case, without the parts reader
		}
		text, err := tokenizer.StringContent(m.Content)
		if err != nil {
			return nil, fmt.Errorf("precise: messages[%d]: %w", i, err)
		}
		out[i].Content = text
	}
	addGen, cont, err := generationOptions(in.AddGenerationPrompt, in.ContinueFinal)
	if err != nil {
		return nil, err
	}
	text := tokenizer.RenderChatML(out, addGen)
	if cont {
		final := ""
		if len(out) > 0 {
			final = out[len(out)-1].Content
		}
		var ok bool
		if text, ok = tokenizer.ContinueFinal(text, final); !ok {
			return nil, errFinalNotRendered
		}
	}
	if pc.builtin != nil {
		return pc.builtin.Encode(text), nil
	}
	return pc.cache.Encode(text), nil
}

// PreciseIndex returns the precise prefix index of a model, fed by its
// endpoints' KV-cache events, or nil when the model has none (precise mode
// off, or no endpoint with kv_events).
func (p *Proxy) PreciseIndex(model string) *kvindex.Index {
	if pl := p.pools[model]; pl != nil && pl.precise != nil {
		return pl.precise.index
	}
	return nil
}
