package signals

import (
	"bytes"
	"strconv"
	"strings"
	"unicode/utf8"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The text-format fast path.
//
// An engine's page has a few hundred samples, mostly histogram buckets, and
// ParseMetrics reads about twenty families. expfmt builds dto objects for
// every sample, label and bucket (some 10,000 allocations and ~1 ms for a
// vLLM page), so the fast path hands expfmt only the TYPE and sample lines
// of the families the extract functions read (wantedFamilies) and drops the
// other lines.
//
// It never changes the result. Before dropping anything, every line of the
// page is checked by a conservative mirror of expfmt's text parser (filter):
// the same family bookkeeping (HELP and TYPE at most once per family, TYPE
// before samples, _sum/_count/_bucket lines joining their summary or
// histogram), the same token syntax, in the plain form engines write. On any
// line it cannot vouch for (a syntax error, an escape it does not know, a
// quoted UTF-8 name, a line starting with '{', unusual spacing, a page
// without its last newline, more than MaxFamilies samples) it gives up and
// the whole page goes through expfmt as before. The same happens if expfmt
// fails on the lines kept (it should not): the whole page is parsed again
// and its error, with the page's line numbers, is returned. So a page that
// expfmt rejects is still rejected, with expfmt's own error, even when the
// bad line belongs to a family no one reads: a scrape that used to fail
// never succeeds now, and a malformed page is reported rather than
// half-read. TestParseFilterDifferential, TestParseFilterCases and
// FuzzParseFilter hold Metrics and errors to the whole-page parse.
//
// Why dropping lines is exact, once the mirror has vouched for the page: the
// families read never end in _count, _sum or _bucket (TestWantedFamilyNames),
// and a sample or TYPE line is kept when its name is a wanted family, or one
// plus such a suffix. expfmt puts a sample in the family named by the line,
// or, for a suffixed name, in the family without the suffix if that is a
// summary or histogram; those families' existence and types come only from
// kept lines, so every kept line lands where it did in the whole page and no
// dropped sample lands in a wanted family. HELP lines only set a docstring
// (and may create a family without a type, which changes where no sample
// goes and which expfmt drops again if no sample follows). Blank lines and
// other comments change nothing. Lines starting with '{' would be read
// against the previous line's family: the mirror refuses them.

// wantedFamilies are the families the extract functions read, of every
// flavour. TestWantedFamilyNames checks that each name the extract functions
// use is here.
var wantedFamilies = map[string]struct{}{
	"vllm:num_requests_waiting": {}, "vllm:num_requests_running": {},
	"vllm:kv_cache_usage_perc": {}, "vllm:gpu_cache_usage_perc": {},
	"vllm:prefix_cache_queries_total": {}, "vllm:prefix_cache_queries": {},
	"vllm:gpu_prefix_cache_queries_total": {}, "vllm:gpu_prefix_cache_queries": {},
	"vllm:prefix_cache_hits_total": {}, "vllm:prefix_cache_hits": {},
	"vllm:gpu_prefix_cache_hits_total": {}, "vllm:gpu_prefix_cache_hits": {},
	"vllm:num_preemptions_total": {}, "vllm:num_preemptions": {},
	"vllm:prompt_tokens_total": {}, "vllm:prompt_tokens": {},
	"vllm:generation_tokens_total": {}, "vllm:generation_tokens": {},
	"vllm:cache_config_info": {}, "vllm:lora_requests_info": {},

	"sglang:num_queue_reqs": {}, "sglang:num_running_reqs": {},
	"sglang:token_usage": {}, "sglang:cache_hit_rate": {},
	"sglang:cached_tokens_total": {}, "sglang:cached_tokens": {},
	"sglang:prompt_tokens_total": {}, "sglang:prompt_tokens": {},
	"sglang:generation_tokens_total": {}, "sglang:generation_tokens": {},
	"sglang:num_retracted_requests_total": {}, "sglang:num_retracted_reqs_total": {}, "sglang:total_retracted_reqs": {},
	"sglang:max_total_num_tokens": {}, "sglang:num_prefill_bootstrap_queue_reqs": {},
	"sglang:num_prefill_prealloc_queue_reqs": {}, "sglang:num_decode_prealloc_queue_reqs": {},
	"sglang:num_decode_transfer_queue_reqs": {},

	"llamacpp:requests_deferred": {}, "llamacpp:requests_processing": {},
	"llamacpp:kv_cache_usage_ratio": {}, "llamacpp:prompt_tokens_total": {},
	"llamacpp:prompt_tokens_cached_total": {}, "llamacpp:tokens_predicted_total": {},

	"tgi_queue_size": {}, "tgi_batch_current_size": {},
}

// keepLine reports whether the lines named name are handed to expfmt.
func keepLine(name []byte) bool {
	if _, ok := wantedFamilies[string(name)]; ok {
		return true
	}
	if base := histogramBase(name); len(base) < len(name) {
		_, ok := wantedFamilies[string(base)]
		return ok
	}
	return false
}

// histogramBase is name without a _count, _sum or _bucket suffix (expfmt's
// histogramMetricName); summaryBase without _count or _sum.
func histogramBase(name []byte) []byte {
	if b := summaryBase(name); len(b) < len(name) {
		return b
	}
	if len(name) > 7 && string(name[len(name)-7:]) == "_bucket" {
		return name[:len(name)-7]
	}
	return name
}

func summaryBase(name []byte) []byte {
	switch {
	case len(name) > 6 && string(name[len(name)-6:]) == "_count":
		return name[:len(name)-6]
	case len(name) > 4 && string(name[len(name)-4:]) == "_sum":
		return name[:len(name)-4]
	}
	return name
}

// prefixSet records which engines' name prefixes the families have.
type prefixSet uint8

const (
	prefixVLLM prefixSet = 1 << iota
	prefixSGLang
	prefixLlamaCPP
	prefixTGI
)

func prefixOf(name string) prefixSet {
	switch {
	case strings.HasPrefix(name, "vllm:"):
		return prefixVLLM
	case strings.HasPrefix(name, "sglang:"):
		return prefixSGLang
	case strings.HasPrefix(name, "llamacpp:"):
		return prefixLlamaCPP
	case strings.HasPrefix(name, "tgi_"):
		return prefixTGI
	}
	return 0
}

// noType marks a family without a type yet (expfmt's nil Type).
const noType = -1

// family is the mirror's state of one metric family during one parse.
type family struct {
	name    string
	gen     uint64 // the parse this state belongs to; older = absent
	typ     int32  // dto.MetricType or noType
	help    bool   // a HELP line was read
	sampled bool   // a sample was read (expfmt keeps the family)
}

// metricsParser parses /metrics bodies and keeps its buffers and expfmt's
// parser from one body to the next. Not safe for concurrent use; a Scraper
// owns one.
type metricsParser struct {
	text   expfmt.TextParser
	reader bytes.Reader
	kept   []byte             // the lines of the families read
	fams   map[string]*family // the mirror's families, kept across parses
	gen    uint64
}

func newMetricsParser() *metricsParser {
	return &metricsParser{text: expfmt.NewTextParser(model.UTF8Validation), fams: make(map[string]*family)}
}

// parseText parses a text-format page, through the fast path when the
// mirror vouches for every line; prefixes are the engines named by its
// families.
func (p *metricsParser) parseText(body []byte) (map[string]*dto.MetricFamily, prefixSet, error) {
	if kept, prefixes, ok := p.filter(body); ok {
		if fams, err := p.textToFamilies(kept); err == nil {
			return fams, prefixes, nil
		}
	}
	fams, err := p.textToFamilies(body)
	if err != nil {
		return nil, 0, err
	}
	if err := checkFamilies(fams); err != nil {
		return nil, 0, err
	}
	return fams, familyPrefixes(fams), nil
}

func (p *metricsParser) textToFamilies(b []byte) (map[string]*dto.MetricFamily, error) {
	p.reader.Reset(b)
	fams, err := p.text.TextToMetricFamilies(&p.reader)
	p.reader.Reset(nil)
	return fams, err
}

func familyPrefixes(fams map[string]*dto.MetricFamily) prefixSet {
	var s prefixSet
	for name := range fams {
		s |= prefixOf(name)
	}
	return s
}

// filter checks every line of body against the mirror and returns the
// TYPE and sample lines of the families read, and the engine prefixes of the
// page's families; ok is false when a line is one it cannot vouch for.
func (p *metricsParser) filter(body []byte) (kept []byte, prefixes prefixSet, ok bool) {
	p.gen++
	if len(p.fams) > MaxFamilies {
		clear(p.fams) // a page of a great many names: do not keep them all
	}
	if cap(p.kept) < len(body) {
		p.kept = make([]byte, 0, len(body)) // out never outgrows it
	}
	out := p.kept[:0]
	created, samples := 0, 0
	// The last sample line's name, family and whether it is kept: a
	// histogram's bucket lines repeat one name, and consecutive samples of
	// one name go to one family (only a comment line changes families).
	var last []byte
	var lastFam *family
	lastKeep := false
	for len(body) > 0 {
		i := bytes.IndexByte(body, '\n')
		if i < 0 {
			return nil, 0, false // expfmt needs the last newline
		}
		line := body[:i+1]
		body = body[i+1:]
		if len(line) == 1 {
			continue
		}
		if line[0] == '#' {
			last = nil
			name, isNew, good := p.comment(line[:i])
			if !good {
				return nil, 0, false
			}
			if isNew {
				created++
			}
			if name != nil && keepLine(name) {
				out = append(out, line...)
			}
		} else {
			name, f, isNew, good := p.sample(line[:i], last, lastFam)
			if !good {
				return nil, 0, false
			}
			if isNew {
				created++
			}
			samples++
			if !f.sampled {
				f.sampled = true
				prefixes |= prefixOf(f.name)
			}
			if f != lastFam || !bytes.Equal(name, last) {
				last, lastFam, lastKeep = name, f, keepLine(name)
			}
			if lastKeep {
				out = append(out, line...)
			}
		}
		if samples > MaxFamilies || created > MaxFamilies {
			return nil, 0, false // let expfmt and checkFamilies judge
		}
	}
	return out, prefixes, true
}

// lookup returns the family called name in this parse, or nil.
func (p *metricsParser) lookup(name []byte) *family {
	if f := p.fams[string(name)]; f != nil && f.gen == p.gen {
		return f
	}
	return nil
}

// resolve is expfmt's setOrCreateCurrentMF: the family a line named name
// belongs to, created if need be.
func (p *metricsParser) resolve(name []byte) (f *family, isNew bool) {
	if f := p.lookup(name); f != nil {
		return f, false
	}
	if base := summaryBase(name); len(base) < len(name) {
		if f := p.lookup(base); f != nil && f.typ == int32(dto.MetricType_SUMMARY) {
			return f, false
		}
	}
	if base := histogramBase(name); len(base) < len(name) {
		if f := p.lookup(base); f != nil && isHistogram(f.typ) {
			return f, false
		}
	}
	f = p.fams[string(name)]
	if f == nil {
		f = &family{name: string(name)}
		p.fams[f.name] = f
	}
	*f = family{name: f.name, gen: p.gen, typ: noType}
	return f, true
}

func isHistogram(typ int32) bool {
	return typ == int32(dto.MetricType_HISTOGRAM) || typ == int32(dto.MetricType_GAUGE_HISTOGRAM)
}

// comment checks a line starting with '#'. name is the metric a TYPE line
// names (nil for other comments, HELP lines included).
func (p *metricsParser) comment(line []byte) (name []byte, isNew, ok bool) {
	rest := skipBlanks(line[1:])
	if len(rest) == 0 {
		return nil, false, true
	}
	kw := rest[:tokenEnd(rest)]
	rest = rest[len(kw):]
	if string(kw) != "HELP" && string(kw) != "TYPE" {
		return nil, false, true // a comment expfmt skips
	}
	if len(rest) == 0 {
		return nil, false, true // "# HELP" alone: skipped too
	}
	rest = skipBlanks(rest)
	n := nameEnd(rest)
	if n == 0 || n == len(rest) || !isBlank(rest[n]) {
		return nil, false, false
	}
	name = rest[:n]
	text := skipBlanks(rest[n:])
	if len(text) == 0 {
		return nil, false, false // a family without help or type: rare, left to expfmt
	}
	f, isNew := p.resolve(name)
	if string(kw) == "HELP" {
		if f.help || !validHelp(text) {
			return nil, false, false
		}
		f.help = true
		// Dropped: a docstring no one reads. The family it may create has
		// no type, so it changes where no sample goes, and expfmt drops
		// it again if no sample follows.
		return nil, isNew, true
	}
	if f.typ != noType {
		return nil, false, false // a second TYPE, or TYPE after samples
	}
	typ, good := metricType(text)
	if !good {
		return nil, false, false
	}
	f.typ = typ
	return name, isNew, true
}

// validHelp reports whether expfmt accepts a docstring's escapes.
func validHelp(text []byte) bool {
	for i := 0; i < len(text); i++ {
		if text[i] != '\\' {
			continue
		}
		if i+1 == len(text) {
			return false
		}
		i++
		if c := text[i]; c != '\\' && c != 'n' && c != '"' {
			return false
		}
	}
	return true
}

// metricType reads a TYPE line's type as expfmt does (any ASCII case; the
// rest of the line, trailing blanks included, must be the type).
func metricType(text []byte) (int32, bool) {
	for _, c := range text {
		if c >= utf8.RuneSelf {
			return 0, false // expfmt upper-cases Unicode: leave it to expfmt
		}
	}
	s := string(text)
	for _, t := range [...]struct {
		name string
		typ  dto.MetricType
	}{
		{"COUNTER", dto.MetricType_COUNTER}, {"GAUGE", dto.MetricType_GAUGE}, {"SUMMARY", dto.MetricType_SUMMARY},
		{"UNTYPED", dto.MetricType_UNTYPED}, {"HISTOGRAM", dto.MetricType_HISTOGRAM},
		{"GAUGE_HISTOGRAM", dto.MetricType_GAUGE_HISTOGRAM}, {"GAUGEHISTOGRAM", dto.MetricType_GAUGE_HISTOGRAM},
	} {
		if strings.EqualFold(s, t.name) {
			return int32(t.typ), true
		}
	}
	return 0, false
}

// maxLabels bounds the labels of a sample line the mirror checks for
// duplicates; a line with more goes to expfmt.
const maxLabels = 32

// sample checks a sample line: name{label="value",...} value [timestamp].
// The previous line was a sample named last, of family lastFam (last is nil
// after a comment line).
func (p *metricsParser) sample(line, last []byte, lastFam *family) (name []byte, f *family, isNew, ok bool) {
	n := nameEnd(line)
	if n == 0 || n == len(line) {
		return nil, nil, false, false
	}
	name = line[:n]
	rest := line[n:]
	if rest[0] != '{' && rest[0] != ' ' {
		return nil, nil, false, false // expfmt reads "a-1 2" as a=-1 at 2: too clever for the mirror
	}
	if last != nil && bytes.Equal(name, last) {
		f = lastFam
	} else {
		f, isNew = p.resolve(name)
		if f.typ == noType {
			f.typ = int32(dto.MetricType_UNTYPED)
		}
	}
	if rest[0] == '{' {
		var labels [maxLabels][]byte
		nl := 0
		rest = rest[1:]
		for {
			if len(rest) == 0 {
				return nil, nil, false, false
			}
			if rest[0] == '}' {
				rest = rest[1:]
				break
			}
			ln := labelNameEnd(rest)
			if ln == 0 || ln == len(rest) || rest[ln] != '=' || ln+1 == len(rest) || rest[ln+1] != '"' {
				return nil, nil, false, false
			}
			lname := rest[:ln]
			if string(lname) == model.MetricNameLabel || nl == maxLabels {
				return nil, nil, false, false
			}
			for _, l := range labels[:nl] {
				if bytes.Equal(l, lname) {
					return nil, nil, false, false // duplicate (even le or quantile: left to expfmt)
				}
			}
			labels[nl] = lname
			nl++
			rest = rest[ln+2:]
			end, escaped, ascii := labelValueEnd(rest)
			if end < 0 {
				return nil, nil, false, false
			}
			val := rest[:end]
			if !ascii && !utf8.Valid(val) {
				return nil, nil, false, false
			}
			if (f.typ == int32(dto.MetricType_SUMMARY) && string(lname) == model.QuantileLabel) ||
				(isHistogram(f.typ) && string(lname) == model.BucketLabel) {
				if escaped {
					return nil, nil, false, false
				}
				if _, err := parseFloat(val); err != nil {
					return nil, nil, false, false
				}
			}
			rest = rest[end+1:]
			if len(rest) == 0 {
				return nil, nil, false, false
			}
			switch rest[0] {
			case ',':
				rest = rest[1:]
			case '}':
			default:
				return nil, nil, false, false
			}
		}
	}
	rest = skipBlanks(rest)
	te := tokenEnd(rest)
	v, err := parseFloat(rest[:te])
	if err != nil {
		return nil, nil, false, false
	}
	if isHistogram(f.typ) && !(v >= 0) {
		return nil, nil, false, false // negative (or NaN) counts: left to expfmt
	}
	rest = rest[te:]
	if len(rest) > 0 {
		// A timestamp: blanks, an integer, the end of the line.
		rest = skipBlanks(rest)
		te = tokenEnd(rest)
		if te == 0 || te != len(rest) {
			return nil, nil, false, false
		}
		if _, err := strconv.ParseInt(string(rest), 10, 64); err != nil {
			return nil, nil, false, false
		}
	}
	return name, f, isNew, true
}

// parseFloat is expfmt's: strconv.ParseFloat without hex floats and
// underscores.
func parseFloat(b []byte) (float64, error) {
	if len(b) > 0 && len(b) <= 15 {
		// Counts (most of a page) are small integers: exact, no overflow.
		v := 0
		for _, c := range b {
			if !isDigit(c) {
				v = -1
				break
			}
			v = v*10 + int(c-'0')
		}
		if v >= 0 {
			return float64(v), nil
		}
	}
	for _, c := range b {
		if c == 'p' || c == 'P' || c == '_' {
			return 0, strconv.ErrSyntax
		}
	}
	return strconv.ParseFloat(string(b), 64)
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' }

func skipBlanks(b []byte) []byte {
	for len(b) > 0 && isBlank(b[0]) {
		b = b[1:]
	}
	return b
}

// tokenEnd is the length of b's first token (up to a blank).
func tokenEnd(b []byte) int {
	for i, c := range b {
		if isBlank(c) {
			return i
		}
	}
	return len(b)
}

// nameEnd is the length of the unquoted metric name b starts with (0 if
// none); a quote after it (expfmt's UTF-8 syntax) makes it 0.
func nameEnd(b []byte) int { return tokenOf(b, metricStart, metricChar) }

// labelNameEnd is nameEnd for label names (no colons).
func labelNameEnd(b []byte) int { return tokenOf(b, labelStart, labelChar) }

func tokenOf(b []byte, start, cont uint8) int {
	if len(b) == 0 || charClass[b[0]]&start == 0 {
		return 0
	}
	i := 1
	for i < len(b) && charClass[b[i]]&cont != 0 {
		i++
	}
	if i < len(b) && b[i] == '"' {
		return 0
	}
	return i
}

// Character classes of names: [a-zA-Z_:][a-zA-Z0-9_:]* for metrics, the
// same without colons for labels.
const (
	metricStart uint8 = 1 << iota
	metricChar
	labelStart
	labelChar
)

var charClass = func() (t [256]uint8) {
	for c := range 256 {
		b := byte(c)
		letter := b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b == '_'
		switch {
		case letter:
			t[c] = metricStart | metricChar | labelStart | labelChar
		case b == ':':
			t[c] = metricStart | metricChar
		case isDigit(b):
			t[c] = metricChar | labelChar
		}
	}
	return t
}()

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// labelValueEnd finds the closing quote of a label value b starts just
// after; -1 if there is none or an escape expfmt refuses. escaped says the
// value has escapes, ascii that it is plain ASCII.
func labelValueEnd(b []byte) (end int, escaped, ascii bool) {
	ascii = true
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i, escaped, ascii
		case c == '\\':
			if i+1 == len(b) {
				return -1, false, false
			}
			i++
			if c := b[i]; c != '\\' && c != 'n' && c != '"' {
				return -1, false, false
			}
			escaped = true
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return -1, false, false
}
