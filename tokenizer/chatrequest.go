package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ChatRequest holds the fields of an OpenAI-style chat request, besides
// its messages, that give a chat template variables in vLLM, as raw JSON
// (absent: nil).
type ChatRequest struct {
	Tools           json.RawMessage // the request's "tools" (validated and dumped by vLLM's request model)
	Documents       json.RawMessage // "documents"
	ReasoningEffort json.RawMessage // "reasoning_effort"
	ChatTemplate    json.RawMessage // "chat_template", a template of the client's own
	// Kwargs is "chat_template_kwargs".
	Kwargs map[string]json.RawMessage
}

// ErrRequestChatTemplate is a chat request that brings its own chat
// template (its chat_template, or chat_template_kwargs' chat_template, not
// null), which a vLLM server refuses (400: "Chat template is passed with
// request, but --trust-request-chat-template is not set") unless started
// with that flag, and then renders with that template, not the model's.
var ErrRequestChatTemplate = errors.New("tokenizer: the request brings its own chat template, which vLLM refuses without --trust-request-chat-template")

// ErrKwargsArgument is a chat request whose chat_template_kwargs name an
// argument transformers' apply_chat_template or its template rendering
// already takes from vLLM ("messages", "conversation"): Python's "got
// multiple values for keyword argument", which vLLM answers with a 400.
var ErrKwargsArgument = errors.New("tokenizer: chat_template_kwargs names an argument vLLM passes itself")

// ErrAssistantTokensMask is a chat request whose chat_template_kwargs'
// return_assistant_tokens_mask is true (in Python's sense: not false, 0,
// "", [] or {}): vLLM passes it to transformers' apply_chat_template with
// return_dict=False (ChatParams.get_apply_chat_template_kwargs,
// vllm/renderers/params.py, merges return_dict=False over the kwargs), which
// raises "`return_assistant_tokens_mask=True` is incompatible with
// `return_dict=False`" before it renders; vLLM answers a 400.
var ErrAssistantTokensMask = errors.New("tokenizer: chat_template_kwargs' return_assistant_tokens_mask is refused by transformers with vLLM's return_dict=False")

// ErrEncodingKwargs is a chat request whose chat_template_kwargs have
// transformers encode the rendering itself (tokenize true) with encoding
// arguments (padding, truncation, max_length, return_tensors,
// tokenizer_kwargs) that may change the ids: that encoding is not
// followed (ChatRequest.TransformersEncodes).
var ErrEncodingKwargs = errors.New("tokenizer: chat_template_kwargs' tokenize with encoding arguments is not followed")

// applyChatTemplateArgs are the parameters of transformers'
// PreTrainedTokenizerBase.apply_chat_template besides conversation,
// tools, documents, chat_template and tokenize (src/transformers/
// tokenization_utils_base.py: add_generation_prompt,
// continue_final_message, padding, truncation, max_length,
// return_tensors, return_dict, return_assistant_tokens_mask and
// tokenizer_kwargs, then **kwargs). vLLM's resolve_chat_template_kwargs
// (vllm/renderers/hf.py) keeps every named parameter of that signature
// (its _get_hf_base_chat_template_params reads them with
// inspect.signature) and safe_apply_chat_template passes the kwargs as
// keyword arguments, so these bind to the parameters and only the rest
// reach the template, through apply_chat_template's **kwargs
// (template_kwargs = {**self.special_tokens_map, **kwargs}). The
// generation options are the request's own (vLLM merges them over the
// kwargs); the others only steer transformers' own encoding, which runs
// when tokenize is true (self(rendered_chat, padding=..., truncation=...,
// max_length=..., add_special_tokens=False, return_tensors=...,
// **tokenizer_kwargs)), and return_dict vLLM sets false itself.
var applyChatTemplateArgs = map[string]bool{
	"add_generation_prompt": true, "continue_final_message": true, "tokenize": true,
	"padding": true, "truncation": true, "max_length": true, "return_tensors": true, "return_dict": true,
	"return_assistant_tokens_mask": true, "tokenizer_kwargs": true,
}

// Vars sets opts.JSONVars and opts.ToolsAsGiven to the template variables
// vLLM gives a chat template for r (vLLM's OnlineRenderer.preprocess_chat,
// ChatCompletionRequest.build_chat_params, ChatParams.with_defaults and
// merge_kwargs, in vLLM sources read on 2026-12-05), in order of precedence:
//
//   - chat_template_kwargs, less the keys whose value is null or "auto"
//     (merge_kwargs drops those as unset), add_generation_prompt and
//     continue_final_message (the request's own fields win; the caller
//     sets opts.AddGenerationPrompt) and tokenize, which no template sees:
//     preprocess_chat's defaults set it (false for a HuggingFace tokenizer
//     without prompt embeds), the kwargs' value wins, and it binds to
//     safe_apply_chat_template's tokenize parameter, which tells
//     transformers whether to encode the rendering itself (true: without
//     special tokens, whatever the request's add_special_tokens says),
//     not to a template variable, and so is never refused either
//     (resolve_chat_template_kwargs' check for it does not see it), and
//     the other arguments of transformers' apply_chat_template, which
//     bind to its parameters (applyChatTemplateArgs): padding,
//     truncation, max_length, return_tensors, return_dict,
//     return_assistant_tokens_mask and tokenizer_kwargs;
//   - over them, the request's documents and reasoning_effort when not
//     null (ReasoningEffortVars);
//   - under them, the request's tools: chat_template_kwargs' own "tools"
//     win, and the template sees those as the client wrote them
//     (opts.ToolsAsGiven), where it sees the request's as vLLM's request
//     model dumps them (RenderJSON).
//
// A request with its own chat template is ErrRequestChatTemplate; kwargs
// naming "messages" or "conversation" are ErrKwargsArgument and a true
// return_assistant_tokens_mask ErrAssistantTokensMask (vLLM's 400s).
// Other kwargs a template does not read vLLM drops
// (resolve_chat_template_kwargs), which changes nothing in the rendering:
// they are passed here and unread. opts.JSONVars stays nil when there are
// no variables.
func (r *ChatRequest) Vars(opts *ChatOptions) error {
	if !jsonNull(r.ChatTemplate) || !jsonNull(r.Kwargs["chat_template"]) {
		return ErrRequestChatTemplate
	}
	vars := make(map[string]json.RawMessage, len(r.Kwargs)+3)
	var clash []string
	for k, v := range r.Kwargs {
		if jsonUnset(v) {
			continue
		}
		switch {
		case k == "return_assistant_tokens_mask" && jsonTruthy(v):
			return ErrAssistantTokensMask
		case applyChatTemplateArgs[k]:
			continue
		case k == "messages", k == "conversation":
			clash = append(clash, k)
		}
		vars[k] = v
	}
	if len(clash) > 0 {
		slices.Sort(clash)
		return fmt.Errorf("%w: %s", ErrKwargsArgument, strings.Join(clash, ", "))
	}
	_, opts.ToolsAsGiven = vars["tools"]
	if !opts.ToolsAsGiven && !jsonNull(r.Tools) {
		vars["tools"] = r.Tools
	}
	if !jsonNull(r.Documents) {
		vars["documents"] = r.Documents
	}
	ReasoningEffortVars(vars, r.ReasoningEffort, r.Kwargs)
	if len(vars) > 0 {
		opts.JSONVars = vars
	} else {
		opts.JSONVars = nil
	}
	return nil
}

// TransformersEncodes reports whether vLLM has transformers encode r's
// rendered chat itself: chat_template_kwargs' tokenize is true in Python's
// sense (see Vars: vLLM passes it as apply_chat_template's tokenize
// argument, its default false for a HuggingFace tokenizer without prompt
// embeds). transformers then encodes the rendering with
// add_special_tokens=False, whatever the request's add_special_tokens
// says, and vLLM takes those ids as a tokens prompt, which it encodes no
// more: the caller encodes the rendering without special tokens. The
// encoding arguments that then apply are ErrEncodingKwargs unless they
// cannot change the ids (padding and truncation false, "do_not_pad" or
// "do_not_truncate", max_length with neither, return_tensors null,
// tokenizer_kwargs null or {}); padding true needs a pad token, which
// some tokenizers lack (transformers raises).
func (r *ChatRequest) TransformersEncodes() (bool, error) {
	tok, ok := r.Kwargs["tokenize"]
	if !ok || jsonUnset(tok) || !jsonTruthy(tok) {
		return false, nil
	}
	for _, k := range []string{"padding", "truncation", "return_tensors", "tokenizer_kwargs"} {
		v, ok := r.Kwargs[k]
		if !ok || jsonUnset(v) {
			continue
		}
		var s string
		switch k {
		case "padding":
			if json.Unmarshal(v, &s) == nil && s == "do_not_pad" || string(bytes.TrimSpace(v)) == "false" {
				continue
			}
		case "truncation":
			if json.Unmarshal(v, &s) == nil && s == "do_not_truncate" || string(bytes.TrimSpace(v)) == "false" {
				continue
			}
		case "tokenizer_kwargs":
			var m map[string]json.RawMessage
			if json.Unmarshal(v, &m) == nil && len(m) == 0 {
				continue
			}
		}
		return true, fmt.Errorf("%w: %s", ErrEncodingKwargs, k)
	}
	return true, nil
}

// jsonTruthy reports whether the JSON value raw, decoded by Python's json,
// is true in Python's sense: not null, false, 0, 0.0, "", [] or {}.
func jsonTruthy(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return false
	}
	switch raw[0] {
	case 'n', 'f':
		return false
	case 't':
		return true
	case '"':
		var s string
		return json.Unmarshal(raw, &s) != nil || s != ""
	case '[':
		var l []json.RawMessage
		return json.Unmarshal(raw, &l) != nil || len(l) > 0
	case '{':
		var m map[string]json.RawMessage
		return json.Unmarshal(raw, &m) != nil || len(m) > 0
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	return err != nil || f != 0 // -0.0 and 0e5 are 0
}

// jsonNull reports whether raw is absent or JSON null.
func jsonNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// jsonUnset reports whether raw is a value vLLM's merge_kwargs treats as
// unset: null or the string "auto".
func jsonUnset(raw json.RawMessage) bool {
	if jsonNull(raw) {
		return true
	}
	var s string
	return bytes.TrimSpace(raw)[0] == '"' && json.Unmarshal(raw, &s) == nil && s == "auto"
}
