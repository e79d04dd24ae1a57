package signals

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// llama.cpp's GET /slots and GET /props (tools/server/server-context.cpp).
//
// /slots is a JSON array, one object per slot (server_slot::to_json, with
// only_metrics unless LLAMA_SERVER_SLOTS_DEBUG is set):
//
//	id             the slot's index, 0 .. -np - 1
//	n_ctx          the slot's context size in tokens (llama_n_ctx_seq: the
//	               context divided among the slots, or all of it with
//	               --kv-unified, where the slots share one cache)
//	speculative    whether the slot drafts tokens
//	is_processing  the slot has a task (state not IDLE): prompt or decode
//
// and, once the slot has run a task (its current one, or its last one:
// llama.cpp keeps task_prev), id_task, params (the task's sampling
// settings), next_token [{has_next_token, has_new_line, n_remain (tokens
// left of its n_predict, -1 for none), n_decoded (tokens generated)}] (an
// object instead of a one-element array in some builds), and in newer builds
// n_prompt_tokens (the size of the slot's cached sequence, prompt.tokens:
// the tokens whose KV the slot holds, its prompt and the tokens generated
// so far), n_prompt_tokens_processed and n_prompt_tokens_cache. Older
// builds always give id_task (-1 when idle) and no n_prompt_tokens: the KV
// a slot holds is then unknown, and only busy slots are derived.
//
// /props has total_slots (-np) and default_generation_settings.n_ctx (a
// slot's n_ctx).

// MaxSlots bounds the slots ParseSlots accepts.
const MaxSlots = 1 << 16

// Slots is what the router derives from one /slots body.
type Slots struct {
	// Total is the number of slots, Busy those processing.
	Total, Busy int
	// NCtx is the sum of the slots' n_ctx: the KV capacity in tokens when
	// each slot has its own part of the cache (no --kv-unified).
	NCtx int
	// Tokens is the sum of the busy slots' n_prompt_tokens (the KV their
	// requests hold; an idle slot's cached prompt is not counted, as a new
	// request overwrites it). Valid when HasTokens.
	Tokens int
	// HasTokens says the server reports n_prompt_tokens: some slot has it
	// and every busy slot does.
	HasTokens bool
}

// slotJSON is one slot of /slots; pointers tell absent fields.
type slotJSON struct {
	ID            *int64          `json:"id"`
	NCtx          *int64          `json:"n_ctx"`
	IsProcessing  *bool           `json:"is_processing"`
	NPromptTokens *int64          `json:"n_prompt_tokens"`
	NextToken     json.RawMessage `json:"next_token"`
}

type nextTokenJSON struct {
	NDecoded *int64 `json:"n_decoded"`
}

// ParseSlots reads llama.cpp's /slots body. Bad input (not an array of
// slot objects, a slot without id, n_ctx or is_processing, a negative or
// fractional count, more than MaxSlots slots, two slots with one id) is
// an error.
func ParseSlots(body []byte) (Slots, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return Slots{}, fmt.Errorf("parse slots: %w", jsonErr(err))
	}
	if raw == nil {
		return Slots{}, errors.New("parse slots: body is null, not an array of slots")
	}
	if len(raw) > MaxSlots {
		return Slots{}, fmt.Errorf("parse slots: %d slots, more than %d", len(raw), MaxSlots)
	}
	var s Slots
	ids := make(map[int64]bool, len(raw))
	anyTokens, busyLack := false, false
	for i, r := range raw {
		var sl slotJSON
		if !bytes.HasPrefix(bytes.TrimLeft(r, " \t\r\n"), []byte("{")) {
			return Slots{}, fmt.Errorf("parse slots: slot %d is not an object", i)
		}
		if err := json.Unmarshal(r, &sl); err != nil {
			return Slots{}, fmt.Errorf("parse slots: slot %d: %w", i, jsonErr(err))
		}
		switch {
		case sl.ID == nil:
			return Slots{}, fmt.Errorf("parse slots: slot %d has no id", i)
		case sl.NCtx == nil:
			return Slots{}, fmt.Errorf("parse slots: slot %d has no n_ctx", i)
		case sl.IsProcessing == nil:
			return Slots{}, fmt.Errorf("parse slots: slot %d has no is_processing", i)
		case *sl.ID < 0 || *sl.ID >= MaxSlots:
			return Slots{}, fmt.Errorf("parse slots: slot %d: id %d out of range", i, *sl.ID)
		case ids[*sl.ID]:
			return Slots{}, fmt.Errorf("parse slots: slot %d: id %d repeated", i, *sl.ID)
		case *sl.NCtx < 0 || *sl.NCtx > math.MaxInt32:
			return Slots{}, fmt.Errorf("parse slots: slot %d: n_ctx %d out of range", i, *sl.NCtx)
		}
		ids[*sl.ID] = true
		if err := checkNextToken(sl.NextToken); err != nil {
			return Slots{}, fmt.Errorf("parse slots: slot %d: %w", i, err)
		}
		s.Total++
		s.NCtx += int(*sl.NCtx)
		busy := *sl.IsProcessing
		if busy {
			s.Busy++
		}
		if sl.NPromptTokens == nil {
			busyLack = busyLack || busy
			continue
		}
		n := *sl.NPromptTokens
		if n < 0 || n > math.MaxInt32 {
			return Slots{}, fmt.Errorf("parse slots: slot %d: n_prompt_tokens %d out of range", i, n)
		}
		anyTokens = true
		if busy {
			s.Tokens += int(n)
		}
	}
	s.HasTokens = anyTokens && !busyLack
	if !s.HasTokens {
		s.Tokens = 0
	}
	return s, nil
}

// checkNextToken checks next_token, when present: an array of objects or
// an object (older builds), whose counts are integers.
func checkNextToken(raw json.RawMessage) error {
	t := bytes.TrimLeft(raw, " \t\r\n")
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil
	}
	var list []nextTokenJSON
	if t[0] == '{' {
		list = make([]nextTokenJSON, 1)
		if err := json.Unmarshal(t, &list[0]); err != nil {
			return fmt.Errorf("next_token: %w", jsonErr(err))
		}
	} else if err := json.Unmarshal(t, &list); err != nil {
		return fmt.Errorf("next_token: %w", jsonErr(err))
	}
	for _, n := range list {
		if n.NDecoded != nil && *n.NDecoded < 0 {
			return fmt.Errorf("next_token: n_decoded %d is negative", *n.NDecoded)
		}
	}
	return nil
}

// jsonErr shortens encoding/json's errors about Go types.
func jsonErr(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			return fmt.Errorf("%s: %s is not a %s", te.Field, te.Value, jsonKind(te.Type.Kind().String()))
		}
		return fmt.Errorf("%s is not a %s", te.Value, jsonKind(te.Type.Kind().String()))
	}
	return err
}

func jsonKind(k string) string {
	switch k {
	case "int64", "int":
		return "integer"
	case "slice":
		return "array"
	case "struct", "map":
		return "object"
	case "bool":
		return "boolean"
	}
	return k
}

// Props is what the router reads of llama.cpp's /props.
type Props struct {
	// TotalSlots is the server's -np; NCtx a slot's n_ctx (0: absent).
	TotalSlots, NCtx int
}

type propsJSON struct {
	TotalSlots *int64 `json:"total_slots"`
	DGS        *struct {
		NCtx *int64 `json:"n_ctx"`
	} `json:"default_generation_settings"`
}

// ParseProps reads llama.cpp's /props body: total_slots is required.
func ParseProps(body []byte) (Props, error) {
	if !bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{")) {
		return Props{}, errors.New("parse props: body is not a JSON object")
	}
	var p propsJSON
	if err := json.Unmarshal(body, &p); err != nil {
		return Props{}, fmt.Errorf("parse props: %w", jsonErr(err))
	}
	if p.TotalSlots == nil {
		return Props{}, errors.New("parse props: no total_slots")
	}
	if *p.TotalSlots < 0 || *p.TotalSlots > MaxSlots {
		return Props{}, fmt.Errorf("parse props: total_slots %d out of range", *p.TotalSlots)
	}
	out := Props{TotalSlots: int(*p.TotalSlots)}
	if p.DGS != nil && p.DGS.NCtx != nil {
		if *p.DGS.NCtx < 0 || *p.DGS.NCtx > math.MaxInt32 {
			return Props{}, fmt.Errorf("parse props: default_generation_settings.n_ctx %d out of range", *p.DGS.NCtx)
		}
		out.NCtx = int(*p.DGS.NCtx)
	}
	return out, nil
}

// applySlots adds what /slots (and /props, when p.TotalSlots > 0) tell to
// m, a llama.cpp scrape: the busy slots are the running requests (the
// same count as llamacpp:requests_processing), and with n_prompt_tokens
// the KV the busy slots hold, over the slots' n_ctx as KV usage unless
// the metrics had a usage of their own (llamacpp:kv_cache_usage_ratio,
// before 2025).
func applySlots(m *Metrics, s Slots, p Props) {
	m.TotalSlots, m.BusySlots = s.Total, s.Busy
	if p.TotalSlots > 0 {
		m.TotalSlots = p.TotalSlots
	}
	m.Have |= HasSlots
	m.Running = float64(s.Busy)
	m.Have |= HasRunning
	if !s.HasTokens {
		return
	}
	m.KVTokens = s.Tokens
	m.Have |= HasKVTokens
	if s.NCtx > 0 && !m.Has(HasKVCapacity) {
		m.KVCapacityTokens = s.NCtx
		m.Have |= HasKVCapacity
	}
	if !m.Has(HasKVUsage) && m.KVCapacityTokens > 0 {
		m.KVUsage = clamp01(float64(s.Tokens) / float64(m.KVCapacityTokens))
		m.Have |= HasKVUsage
	}
}
