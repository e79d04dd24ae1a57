package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"unicode"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
	"golang.org/x/text/unicode/norm"
)

// HF is a HuggingFace tokenizer loaded from a tokenizer.json (and optionally
// its tokenizer_config.json). It supports what the byte-level BPE tokenizers of
// current LLMs (Llama 3.x, Qwen2/2.5/3, DeepSeek-V3, GPT-2 style) use: added
// and special tokens, the NFC/NFD/NFKC/NFKD/Lowercase normalizers,
// Split (regex) and ByteLevel pre-tokenizers, the BPE model, the ByteLevel and
// TemplateProcessing post-processors and the ByteLevel decoder. Load reports
// anything else as an error.
//
// An HF is immutable after Load and safe for concurrent use.
type HF struct {
	model      bpe
	normalize  func(string) string // nil: none
	splitters  []splitter          // applied in order; nil: the whole segment is one word
	prefixSp   bool                // ByteLevel add_prefix_space
	byteLevel  bool                // the pre-tokenizer has a ByteLevel step (required)
	added      addedMatcher        // tokens matched in the raw text
	addedNorm  addedMatcher        // tokens matched in normalized text
	addedByID  map[uint32]hfAddedToken
	idToToken  []string // byte-level token text by id ("" for holes)
	prefixIDs  []uint32 // post-processor ids before the sequence (EncodeAddSpecial)
	suffixIDs  []uint32 // post-processor ids after the sequence
	vocabSize  int
	eos        uint32
	hasEOS     bool
	bos        string
	eosText    string
	template   *ChatTemplate // nil: none
	templateEr error         // compiling the chat template failed (reported by ChatTemplate)
}

// LoadDir loads dir/tokenizer.json and, when present,
// dir/tokenizer_config.json and dir/special_tokens_map.json (a HuggingFace
// model directory; see Files). dir may also name the tokenizer.json file
// itself; the other files are then looked for beside it.
func LoadDir(dir string) (*HF, error) {
	file := filepath.Join(dir, "tokenizer.json")
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		file, dir = dir, filepath.Dir(dir)
	}
	tj, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	f := Files{Tokenizer: tj}
	for _, opt := range []struct {
		name string
		dst  *[]byte
	}{{"tokenizer_config.json", &f.Config}, {"special_tokens_map.json", &f.SpecialTokensMap}} {
		if *opt.dst, err = os.ReadFile(filepath.Join(dir, opt.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
	}
	return LoadFiles(f)
}

// Files are the contents of a HuggingFace model directory's tokenizer
// files, which LoadFiles reads.
type Files struct {
	// Tokenizer is tokenizer.json. Required.
	Tokenizer []byte
	// Config is tokenizer_config.json; nil for none: no chat template,
	// no bos/eos names.
	Config []byte
	// SpecialTokensMap is special_tokens_map.json; nil for none.
	// transformers 4.x reads it only beside a tokenizer_config.json
	// without added_tokens_decoder (which transformers writes since 4.34;
	// or none), and then its special tokens win over the config's
	// (hfConfig.applySpecialTokensMap); else it is not read.
	SpecialTokensMap []byte
}

// Load builds a tokenizer from the contents of a tokenizer.json and of a
// tokenizer_config.json (nil when there is none: no chat template, no
// bos/eos names): LoadFiles without a special_tokens_map.json.
func Load(tokenizerJSON, tokenizerConfigJSON []byte) (*HF, error) {
	return LoadFiles(Files{Tokenizer: tokenizerJSON, Config: tokenizerConfigJSON})
}

// LoadFiles builds a tokenizer from the contents of its files.
func LoadFiles(f Files) (*HF, error) {
	t, err := load(f)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: load: %w", err)
	}
	return t, nil
}

func load(files Files) (*HF, error) {
	var f hfFile
	if err := json.Unmarshal(files.Tokenizer, &f); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	t := &HF{addedByID: make(map[uint32]hfAddedToken)}
	if err := t.loadModel(&f.Model); err != nil {
		return nil, err
	}
	if err := t.loadNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if err := t.loadPreTokenizer(f.PreTokenizer, 0); err != nil {
		return nil, err
	}
	if err := t.loadPostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	if err := checkDecoder(f.Decoder, 0); err != nil {
		return nil, err
	}
	var raw, normd []hfAddedToken
	for _, a := range f.AddedTokens {
		if a.Content == "" {
			return nil, fmt.Errorf("added token %d has empty content", a.ID)
		}
		t.addedByID[a.ID] = a
		if err := t.setToken(a.ID, a.Content); err != nil {
			return nil, err
		}
		// Normalized tokens are matched after the others, in the text
		// between them, as HuggingFace does even without a normalizer.
		if a.Normalized {
			normd = append(normd, a)
		} else {
			raw = append(raw, a)
		}
	}
	t.added = newAddedMatcher(raw, nil)
	t.addedNorm = newAddedMatcher(normd, t.normalize)
	t.vocabSize = len(t.idToToken)
	if !t.byteLevel {
		// The BPE here runs on the bytes' byte-level runes, which is what
		// HuggingFace does only after a ByteLevel pre-tokenizer; without
		// one it runs on the characters and the ids differ.
		return nil, errors.New("pre_tokenizer: no ByteLevel step: only byte-level BPE tokenizers are supported")
	}
	if len(files.Config) > 0 || len(files.SpecialTokensMap) > 0 {
		if err := t.loadConfig(files.Config, files.SpecialTokensMap); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// maxTokenID bounds token ids (the largest vocabularies have ~260k tokens).
const maxTokenID = 1<<21 - 1

func (t *HF) setToken(id uint32, text string) error {
	if id > maxTokenID {
		return fmt.Errorf("token %q has id %d, above the supported %d", text, id, maxTokenID)
	}
	if int(id) >= len(t.idToToken) {
		t.idToToken = append(t.idToToken, make([]string, int(id)+1-len(t.idToToken))...)
	}
	t.idToToken[id] = text
	return nil
}

func (t *HF) loadModel(m *hfModel) error {
	if m.Type != "BPE" && m.Type != "" {
		return fmt.Errorf("model type %q is not supported (only BPE)", m.Type)
	}
	if m.ByteFallback {
		return errors.New("BPE byte_fallback is not supported")
	}
	if (m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "") ||
		(m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") {
		return errors.New("BPE continuing_subword_prefix / end_of_word_suffix are not supported")
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return errors.New("BPE dropout is not supported")
	}
	if len(m.Vocab) == 0 {
		return errors.New("BPE model has an empty vocab")
	}
	b := &t.model
	b.vocab = m.Vocab
	b.ignoreMerges = m.IgnoreMerges
	b.cache = make([]atomic.Pointer[wordEntry], wordCacheSlots)
	for tok, id := range m.Vocab {
		if err := t.setToken(id, tok); err != nil {
			return err
		}
	}
	for c := 0; c < 256; c++ {
		id, ok := m.Vocab[string(byteLevelRunes[c])]
		b.byteIDs[c], b.hasByte[c] = id, ok
	}
	b.merges = make(map[uint64]mergeRule, len(m.Merges))
	for rank, pair := range m.Merges {
		l, r := pair[0], pair[1]
		li, ok1 := m.Vocab[l]
		ri, ok2 := m.Vocab[r]
		mi, ok3 := m.Vocab[l+r]
		if !ok1 || !ok2 || !ok3 {
			return fmt.Errorf("merge %d (%q %q): token not in vocab", rank, l, r)
		}
		// A pair listed twice takes its last rank, as in HuggingFace's BPE.
		b.merges[pairKey(li, ri)] = mergeRule{rank: uint32(rank), id: mi}
	}
	return nil
}

func normalizerFunc(c hfComponent, depth int) (func(string) string, error) {
	switch c.Type {
	case "NFC":
		return norm.NFC.String, nil
	case "NFD":
		return norm.NFD.String, nil
	case "NFKC":
		return norm.NFKC.String, nil
	case "NFKD":
		return norm.NFKD.String, nil
	case "Lowercase":
		return lowercase, nil
	case "Sequence":
		if depth > 8 {
			return nil, errors.New("normalizer: sequences nested too deep")
		}
		var fs []func(string) string
		for i, raw := range c.Normalizers {
			sub, ok, err := parseComponent(raw, fmt.Sprintf("normalizer %d", i))
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
			f, err := normalizerFunc(sub, depth+1)
			if err != nil {
				return nil, err
			}
			fs = append(fs, f)
		}
		return func(s string) string {
			for _, f := range fs {
				s = f(s)
			}
			return s
		}, nil
	}
	return nil, fmt.Errorf("normalizer %q is not supported", c.Type)
}

// lowercase is HuggingFace's Lowercase normalizer: each character through
// Rust's char::to_lowercase, which differs from Go's unicode.ToLower on
// İ (U+0130), lowercased to "i" and a combining dot above (U+0307) by
// Unicode's SpecialCasing rather than to a bare "i" (and on letters added
// after Go's Unicode 15.0 tables, which Go leaves as they are).
func lowercase(s string) string {
	if strings.ContainsRune(s, 'İ') {
		s = strings.ReplaceAll(s, "İ", "i\u0307")
	}
	return strings.ToLower(s)
}

func (t *HF) loadNormalizer(raw json.RawMessage) error {
	c, ok, err := parseComponent(raw, "normalizer")
	if err != nil || !ok {
		return err
	}
	f, err := normalizerFunc(c, 0)
	if err != nil {
		return err
	}
	t.normalize = f
	return nil
}

func (t *HF) loadPreTokenizer(raw json.RawMessage, depth int) error {
	c, ok, err := parseComponent(raw, "pre_tokenizer")
	if err != nil || !ok {
		return err
	}
	switch c.Type {
	case "Sequence":
		if depth > 8 {
			return errors.New("pre_tokenizer: sequences nested too deep")
		}
		for _, sub := range c.PreTokenizers {
			if err := t.loadPreTokenizer(sub, depth+1); err != nil {
				return err
			}
		}
		return nil
	case "Split":
		if t.byteLevel {
			// HuggingFace would split the byte-level runes (Ġ for a space).
			return errors.New("pre_tokenizer Split after ByteLevel is not supported")
		}
		if c.Pattern == nil {
			return errors.New("pre_tokenizer Split: no pattern")
		}
		if c.Behavior != "Isolated" || c.Invert {
			return fmt.Errorf("pre_tokenizer Split: behavior %q (invert %v) is not supported (only Isolated)", c.Behavior, c.Invert)
		}
		var s splitter
		switch {
		case c.Pattern.Regex != nil:
			s, err = newSplitter(*c.Pattern.Regex)
		case c.Pattern.String != nil:
			s, err = newRegexSplitter(regexpQuote(*c.Pattern.String))
		default:
			err = errors.New("pre_tokenizer Split: empty pattern")
		}
		if err != nil {
			return err
		}
		t.splitters = append(t.splitters, s)
		return nil
	case "ByteLevel":
		if len(t.splitters) > 0 && c.AddPrefixSpace {
			return errors.New("pre_tokenizer ByteLevel: add_prefix_space after a Split is not supported")
		}
		t.prefixSp, t.byteLevel = c.AddPrefixSpace, true
		if c.UseRegex == nil || *c.UseRegex {
			s, err := newRegexSplitter(patternGPT2)
			if err != nil {
				return err
			}
			t.splitters = append(t.splitters, s)
		}
		return nil
	}
	return fmt.Errorf("pre_tokenizer %q is not supported", c.Type)
}

func regexpQuote(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\.+*?()|[]{}^$#&-~ `, r) || unicode.IsSpace(r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (t *HF) loadPostProcessor(raw json.RawMessage) error {
	c, ok, err := parseComponent(raw, "post_processor")
	if err != nil || !ok {
		return err
	}
	switch c.Type {
	case "ByteLevel": // offsets only
		return nil
	case "Sequence":
		for _, sub := range c.Processors {
			if err := t.loadPostProcessor(sub); err != nil {
				return err
			}
		}
		return nil
	case "TemplateProcessing":
		seen := false
		for _, p := range c.Single {
			switch {
			case p.Sequence != nil:
				seen = true
			case p.SpecialToken != nil:
				st, ok := c.SpecialTokens[p.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("post_processor: special token %q not defined", p.SpecialToken.ID)
				}
				if seen {
					t.suffixIDs = append(t.suffixIDs, st.IDs...)
				} else {
					t.prefixIDs = append(t.prefixIDs, st.IDs...)
				}
			}
		}
		return nil
	}
	return fmt.Errorf("post_processor %q is not supported", c.Type)
}

func checkDecoder(raw json.RawMessage, depth int) error {
	c, ok, err := parseComponent(raw, "decoder")
	if err != nil || !ok {
		return err
	}
	switch c.Type {
	case "ByteLevel":
		return nil
	case "Sequence":
		if depth > 8 {
			return errors.New("decoder: sequences nested too deep")
		}
		for _, sub := range c.Decoders {
			if err := checkDecoder(sub, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("decoder %q is not supported (only ByteLevel)", c.Type)
}

// hfConfig is the part of tokenizer_config.json this package reads.
type hfConfig struct {
	BOS            json.RawMessage `json:"bos_token"`
	EOS            json.RawMessage `json:"eos_token"`
	UNK            json.RawMessage `json:"unk_token"`
	SEP            json.RawMessage `json:"sep_token"`
	PAD            json.RawMessage `json:"pad_token"`
	CLS            json.RawMessage `json:"cls_token"`
	Mask           json.RawMessage `json:"mask_token"`
	Additional     json.RawMessage `json:"additional_special_tokens"`
	Extra          json.RawMessage `json:"extra_special_tokens"`
	ChatTemplate   json.RawMessage `json:"chat_template"`
	TokenizerClass string          `json:"tokenizer_class"`
	AddBOS         *bool           `json:"add_bos_token"`
	AddEOS         *bool           `json:"add_eos_token"`

	// AddedTokensDecoder is only told apart from absent (nil), which
	// makes transformers read special_tokens_map.json.
	AddedTokensDecoder json.RawMessage `json:"added_tokens_decoder"`
}

// llamaClasses are the transformers tokenizer classes whose constructor
// replaces tokenizer.json's post-processor by one that adds BOS (when
// add_bos_token, default true) and EOS (when add_eos_token, default false):
// LlamaTokenizerFast.update_post_processor in transformers 4.x.
var llamaClasses = map[string]bool{
	"LlamaTokenizerFast": true, "LlamaTokenizer": true,
	"CodeLlamaTokenizerFast": true, "CodeLlamaTokenizer": true,
	"GemmaTokenizerFast": true, "GemmaTokenizer": true,
}

// jsonString reports whether raw is a JSON string, and which.
func jsonString(raw json.RawMessage) (string, bool) {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return "", false
	}
	s, ok := v.(string)
	return s, ok
}

// jsonObject reports whether raw is a JSON object.
func jsonObject(raw json.RawMessage) bool {
	var o map[string]json.RawMessage
	return json.Unmarshal(raw, &o) == nil && o != nil
}

// tokenName reads a bos/eos entry: a string, an {"content": ...} object or null.
func tokenName(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil {
		return o.Content
	}
	return ""
}

// specialTokens returns the variables transformers gives a chat template
// for the special tokens of c: the special_tokens_map of transformers 4.x
// (vLLM requires transformers < 5), which apply_chat_template passes under
// its keyword arguments ({**self.special_tokens_map, **kwargs}, and so
// under vLLM's chat_template_kwargs). It holds bos_token, eos_token,
// unk_token, sep_token, pad_token, cls_token and mask_token as strings (an
// AddedToken's content), additional_special_tokens as a list of them, and
// the tokens extra_special_tokens names, by their names (model-specific
// tokens such as image_token), each only when it is set and not empty: a
// token that is null, "" or [], or not in the file, is no variable, and
// undefined in the template.
func specialTokens(c *hfConfig) map[string]jinja.Value {
	vars := make(map[string]jinja.Value)
	for _, t := range []struct {
		name string
		raw  json.RawMessage
	}{{"bos_token", c.BOS}, {"eos_token", c.EOS}, {"unk_token", c.UNK}, {"sep_token", c.SEP}, {"pad_token", c.PAD},
		{"cls_token", c.CLS}, {"mask_token", c.Mask}} {
		if s := tokenName(t.raw); s != "" {
			vars[t.name] = jinja.NewString(s)
		}
	}
	var list []json.RawMessage
	if json.Unmarshal(c.Additional, &list) == nil && len(list) > 0 {
		items := make([]jinja.Value, len(list))
		for i, raw := range list {
			items[i] = jinja.NewString(tokenName(raw))
		}
		vars["additional_special_tokens"] = jinja.NewList(items)
	}
	var extra map[string]json.RawMessage
	if json.Unmarshal(c.Extra, &extra) == nil {
		for name, raw := range extra {
			if s := tokenName(raw); s != "" {
				vars[name] = jinja.NewString(s)
			} else {
				delete(vars, name) // it replaces a named token's value
			}
		}
	}
	return vars
}

// mentioned returns the variables of vars whose names the template source
// src has: the others it cannot read.
func mentioned(vars map[string]jinja.Value, src string) map[string]jinja.Value {
	out := make(map[string]jinja.Value, len(vars))
	for k, v := range vars {
		if strings.Contains(src, k) {
			out[k] = v
		}
	}
	return out
}

// applySpecialTokensMap sets c's special tokens from a
// special_tokens_map.json, data, as transformers 4.x's from_pretrained
// does for a tokenizer_config.json without added_tokens_decoder (the
// branch it calls legacy): each of its entries bos_token, eos_token,
// unk_token, sep_token, pad_token, cls_token and mask_token replaces the
// config's (an {"content": ...} object, an AddedToken, by its content;
// null unsets it); its additional_special_tokens, a list, is the
// config's list (or none) with each of its tokens that the list does
// not hold yet appended, else it replaces the config's. A string is held
// by a list with the same string, an object by one with an object of
// this map with the same content: tokenizers' AddedToken equals no
// string, and no dict, which the config's entries still are there (so
// ["<a>"] and [{"content": "<a>"}] make ["<a>", "<a>"]). Its other
// entries are no special tokens for the template: the tokenizer's
// constructor takes none from there (and extra_special_tokens, an
// object, is an error there, which this leaves to the config's).
func (c *hfConfig) applySpecialTokensMap(data []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	named := map[string]*json.RawMessage{"bos_token": &c.BOS, "eos_token": &c.EOS, "unk_token": &c.UNK, "sep_token": &c.SEP,
		"pad_token": &c.PAD, "cls_token": &c.CLS, "mask_token": &c.Mask}
	for name, raw := range m {
		if dst, ok := named[name]; ok {
			*dst = raw
		}
	}
	raw, ok := m["additional_special_tokens"]
	if !ok {
		return nil
	}
	var add []json.RawMessage
	if json.Unmarshal(raw, &add) != nil || add == nil {
		c.Additional = raw // not a list: in its place
		return nil
	}
	var list []json.RawMessage
	json.Unmarshal(c.Additional, &list) // what is no list counts as none
	base := len(list)                   // list[:base] are the config's
	for _, tok := range add {
		held := false
		for i, have := range list {
			if s, ok := jsonString(tok); ok {
				h, ok := jsonString(have)
				held = ok && h == s
			} else {
				held = i >= base && jsonObject(tok) && jsonObject(have) && tokenName(have) == tokenName(tok)
			}
			if held {
				break
			}
		}
		if !held {
			list = append(list, tok)
		}
	}
	merged, err := json.Marshal(list)
	if err != nil {
		return err
	}
	c.Additional = merged
	return nil
}

func (t *HF) loadConfig(data, specialTokensMap []byte) error {
	var c hfConfig
	if len(data) > 0 {
		if err := json.Unmarshal(data, &c); err != nil {
			return fmt.Errorf("tokenizer_config.json: %w", err)
		}
	}
	if len(specialTokensMap) > 0 && c.AddedTokensDecoder == nil {
		if err := c.applySpecialTokensMap(specialTokensMap); err != nil {
			return fmt.Errorf("special_tokens_map.json: %w", err)
		}
	}
	t.bos, t.eosText = tokenName(c.BOS), tokenName(c.EOS)
	if id, ok := t.TokenID(t.eosText); ok && t.eosText != "" {
		t.eos, t.hasEOS = id, true
	}
	if llamaClasses[c.TokenizerClass] {
		t.prefixIDs, t.suffixIDs = nil, nil
		if id, ok := t.TokenID(t.bos); ok && t.bos != "" && (c.AddBOS == nil || *c.AddBOS) {
			t.prefixIDs = []uint32{id}
		}
		if c.AddEOS != nil && *c.AddEOS && t.hasEOS {
			t.suffixIDs = []uint32{t.eos}
		}
	}
	src, toolUse := templateSource(c.ChatTemplate)
	if src != "" {
		tokens := specialTokens(&c)
		t.template, t.templateEr = NewChatTemplate(src, t.bos, t.eosText)
		if t.template != nil {
			t.template.tokens = mentioned(tokens, src)
		}
		if t.template != nil && toolUse != "" {
			t.template.toolUse, t.template.toolUseErr = NewChatTemplate(toolUse, t.bos, t.eosText)
			if t.template.toolUse != nil {
				t.template.toolUse.tokens = mentioned(tokens, toolUse)
			}
		}
	}
	return nil
}

// templateSource returns the default chat template and the one for requests
// with tools ("" when there is none apart): chat_template is either a
// string or a list of {"name", "template"} (the one named "default", and
// the one named "tool_use", which transformers' get_chat_template picks
// when it is given tools).
func templateSource(raw json.RawMessage) (def, toolUse string) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, ""
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if json.Unmarshal(raw, &list) == nil {
		found := false
		for _, e := range list {
			switch {
			case e.Name == "default" && !found:
				def, found = e.Template, true
			case e.Name == "tool_use" && toolUse == "":
				toolUse = e.Template
			}
		}
		if !found && len(list) > 0 {
			def = list[0].Template
		}
	}
	return def, toolUse
}

// VocabSize returns one more than the largest token id.
func (t *HF) VocabSize() int { return t.vocabSize }

// EOS returns the id of the eos_token of tokenizer_config.json.
func (t *HF) EOS() (uint32, bool) { return t.eos, t.hasEOS }

// TokenID returns the id of a token given by its text as it appears in the
// vocabulary (byte-level form, e.g. "Ġthe") or an added token's content.
func (t *HF) TokenID(token string) (uint32, bool) {
	if a, ok := t.added.byContent[token]; ok {
		return a.ID, true
	}
	if a, ok := t.addedNorm.byContent[token]; ok {
		return a.ID, true
	}
	id, ok := t.model.vocab[token]
	return id, ok
}

// ChatTemplate returns the chat template of tokenizer_config.json, or
// ErrNoChatTemplate when it has none, or the error compiling it.
func (t *HF) ChatTemplate() (*ChatTemplate, error) {
	if t.templateEr != nil {
		return nil, t.templateEr
	}
	if t.template == nil {
		return nil, ErrNoChatTemplate
	}
	return t.template, nil
}

// Encode returns the ids of text as HuggingFace's encode(text,
// add_special_tokens=False) does: added and special tokens written in the text
// are recognised, and no BOS/EOS is added. This is what vLLM does with a
// rendered chat prompt.
func (t *HF) Encode(text string) []uint32 {
	return t.AppendEncode(make([]uint32, 0, len(text)/3+4), text)
}

// EncodeAddSpecial is Encode plus the post-processor's special tokens (for
// example Llama 3.1's <|begin_of_text|>), as encode(text) with
// add_special_tokens=True does and vLLM does for a completion prompt. For the
// Llama-family tokenizer classes of tokenizer_config.json (LlamaTokenizerFast,
// e.g. DeepSeek-V3), it follows add_bos_token/add_eos_token as transformers
// 4.x does rather than tokenizer.json's post-processor.
func (t *HF) EncodeAddSpecial(text string) []uint32 {
	ids := make([]uint32, 0, len(text)/3+4+len(t.prefixIDs)+len(t.suffixIDs))
	ids = append(ids, t.prefixIDs...)
	ids = t.AppendEncode(ids, text)
	return append(ids, t.suffixIDs...)
}

// AppendEncode appends the ids of text (as Encode) to dst.
func (t *HF) AppendEncode(dst []uint32, text string) []uint32 {
	t.added.split(text, func(seg string, tok *hfAddedToken) {
		if tok != nil {
			dst = append(dst, tok.ID)
			return
		}
		dst = t.appendSegment(dst, seg)
	})
	return dst
}

// appendSegment encodes text that contains no raw-matched added token.
func (t *HF) appendSegment(dst []uint32, seg string) []uint32 {
	if t.normalize != nil {
		seg = t.normalize(seg)
	}
	t.addedNorm.split(seg, func(s string, tok *hfAddedToken) {
		if tok != nil {
			dst = append(dst, tok.ID)
			return
		}
		dst = t.appendPreTokenized(dst, s)
	})
	return dst
}

func (t *HF) appendPreTokenized(dst []uint32, s string) []uint32 {
	if s == "" {
		return dst
	}
	if t.prefixSp && s[0] != ' ' {
		s = " " + s
	}
	if len(t.splitters) == 0 {
		return t.model.appendWord(dst, s)
	}
	return t.appendSplit(dst, s, 0)
}

// appendSplit applies splitter k and the following ones to s.
func (t *HF) appendSplit(dst []uint32, s string, k int) []uint32 {
	if ls, ok := t.splitters[k].(llamaSplitter); ok && k+1 == len(t.splitters) {
		// The common case, streamed: no slice of offsets.
		for i := 0; i < len(s); {
			end := ls.match(s, i)
			dst = t.model.appendWord(dst, s[i:end])
			i = end
		}
		return dst
	}
	ends := t.splitters[k].appendSplits(nil, s)
	start := 0
	for _, end := range ends {
		piece := s[start:end]
		start = end
		if k+1 < len(t.splitters) {
			dst = t.appendSplit(dst, piece, k+1)
		} else {
			dst = t.model.appendWord(dst, piece)
		}
	}
	return dst
}

// Decode returns the text of ids: added tokens as their content, the others
// through the byte-level decoder. Unknown ids are skipped. The result is the
// raw bytes: it is not valid UTF-8 when ids cut a character in two (HuggingFace
// would show U+FFFD there), and no clean_up_tokenization_spaces is applied, so
// Decode(Encode(s)) == s.
func (t *HF) Decode(ids []uint32) string {
	var b []byte
	for _, id := range ids {
		if a, ok := t.addedByID[id]; ok {
			b = append(b, a.Content...)
			continue
		}
		if int(id) >= len(t.idToToken) {
			continue
		}
		for _, r := range t.idToToken[id] {
			if c, ok := byteLevelBytes[r]; ok {
				b = append(b, c)
			} else {
				b = utf8.AppendRune(b, r)
			}
		}
	}
	return string(b)
}

// SpecialTokens returns the contents of the added tokens marked special, sorted.
func (t *HF) SpecialTokens() []string {
	var out []string
	for _, a := range t.addedByID {
		if a.Special {
			out = append(out, a.Content)
		}
	}
	slices.Sort(out)
	return out
}
