package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
//     (resolve_chat_template_kwargs' check for it does not see it);
//   - over them, the request's documents and reasoning_effort when not
//     null (ReasoningEffortVars);
//   - under them, the request's tools: chat_template_kwargs' own "tools"
//     win, and the template sees those as the client wrote them
//     (opts.ToolsAsGiven), where it sees the request's as vLLM's request
//     model dumps them (RenderJSON).
//
// A request with its own chat template is ErrRequestChatTemplate; kwargs
// naming "messages" or "conversation" are ErrKwargsArgument (vLLM's 400s).
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
		switch k {
		case "add_generation_prompt", "continue_final_message", "tokenize":
			continue
		case "messages", "conversation":
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
