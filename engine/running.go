package engine

import "slices"

// SeqInfo is one running request's state, as a server that reports its
// batch request by request (llama.cpp's /slots) shows it.
type SeqInfo struct {
	// ID is the request's ID (Request.ID).
	ID string
	// PromptTokens is the prompt's length in tokens.
	PromptTokens int
	// CachedTokens are the prompt tokens found in the prefix cache (or
	// that arrived from outside) when the request was scheduled: not
	// computed by it.
	CachedTokens int
	// Tokens is how many tokens' KV the request holds: its prompt and
	// outputs computed so far, cached ones included.
	Tokens int
	// Outputs counts the tokens generated so far.
	Outputs int
	// MaxTokens is the request's output limit.
	MaxTokens int
}

// AppendRunning appends the running requests, in the order of the batch,
// to dst and returns it. Requests waiting (queued, preempted, or holding
// blocks for KV that has not arrived) are not running.
func (e *Engine) AppendRunning(dst []SeqInfo) []SeqInfo {
	for _, s := range e.running {
		dst = append(dst, SeqInfo{
			ID: s.id, PromptTokens: int(s.promptLen), CachedTokens: int(s.cachedTokens),
			Tokens: s.computed, Outputs: s.outputs, MaxTokens: int(s.maxTokens),
		})
	}
	return dst
}

// AppendLoRAs appends to running the LoRA adapters of the running
// requests, and to waiting those of the waiting ones (queued, preempted,
// or whose KV arrived and who wait for a seat), each once, in the order of
// the batch and of the queue, and returns them: vLLM's
// running_lora_adapters and waiting_lora_adapters (vllm:lora_requests_info).
// An adapter may be in both. The RemoteKV requests whose KV has not
// arrived are not counted.
func (e *Engine) AppendLoRAs(running, waiting []string) ([]string, []string) {
	if e.loraSeqs == 0 {
		return running, waiting
	}
	for _, s := range e.running {
		running = e.appendLoRA(running, s.lora)
	}
	for _, s := range e.loaded {
		waiting = e.appendLoRA(waiting, s.lora)
	}
	for i := range e.waiting.len() {
		waiting = e.appendLoRA(waiting, e.waiting.at(i).lora)
	}
	return running, waiting
}

func (e *Engine) appendLoRA(names []string, lora uint16) []string {
	if lora == 0 {
		return names
	}
	if name := e.loras[lora-1]; !slices.Contains(names, name) {
		return append(names, name)
	}
	return names
}
