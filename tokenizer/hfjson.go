package tokenizer

import (
	"encoding/json"
	"fmt"
)

// The subset of HuggingFace's tokenizer.json schema that this package reads.
// Unknown component types are reported by Load, never silently ignored.

type hfFile struct {
	AddedTokens   []hfAddedToken  `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         hfModel         `json:"model"`
}

type hfAddedToken struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type hfModel struct {
	Type                    string   `json:"type"`
	Vocab                   hfVocab  `json:"vocab"`
	Merges                  hfMerges `json:"merges"`
	ContinuingSubwordPrefix *string  `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string  `json:"end_of_word_suffix"`
	ByteFallback            bool     `json:"byte_fallback"`
	IgnoreMerges            bool     `json:"ignore_merges"`
	Dropout                 *float64 `json:"dropout"`
}

// hfComponent is any normalizer, pre-tokenizer, post-processor or decoder.
type hfComponent struct {
	Type string `json:"type"`

	// Sequence
	Normalizers    []json.RawMessage `json:"normalizers"`
	PreTokenizers  []json.RawMessage `json:"pretokenizers"`
	Processors     []json.RawMessage `json:"processors"`
	Decoders       []json.RawMessage `json:"decoders"`
	AddPrefixSpace bool              `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`

	// Split
	Pattern  *hfPattern `json:"pattern"`
	Behavior string     `json:"behavior"`
	Invert   bool       `json:"invert"`

	// TemplateProcessing
	Single        []hfTemplatePiece          `json:"single"`
	SpecialTokens map[string]hfSpecialTokens `json:"special_tokens"`
}

type hfPattern struct {
	Regex  *string `json:"Regex"`
	String *string `json:"String"`
}

type hfTemplatePiece struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

type hfSpecialTokens struct {
	ID  string   `json:"id"`
	IDs []uint32 `json:"ids"`
}

// parseComponent decodes raw; a JSON null gives ok == false.
func parseComponent(raw json.RawMessage, what string) (c hfComponent, ok bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return c, false, nil
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, false, fmt.Errorf("%s: %w", what, err)
	}
	return c, true, nil
}
