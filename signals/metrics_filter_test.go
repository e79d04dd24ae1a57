package signals

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// referenceParseMetrics is ParseMetrics as it was before the fast path:
// expfmt parses every family of the page, and the engine is told by a scan
// of every family name. It shares only what comes after the decoding and
// the detection (the vLLM version rule, vllmFlavor, and the per-engine
// extraction, extractFlavor). The differential tests hold the fast path to
// it.
func referenceParseMetrics(r io.Reader, contentType string, flavor Flavor) (Metrics, error) {
	fams, err := referenceDecode(r, contentType)
	return referenceExtract(fams, err, flavor)
}

func referenceExtract(fams map[string]*dto.MetricFamily, err error, flavor Flavor) (Metrics, error) {
	if err != nil {
		return Metrics{}, fmt.Errorf("parse metrics: %w", err)
	}
	if flavor == "" {
		flavor = FlavorAuto
	}
	if flavor == FlavorAuto {
		flavor = referenceDetectFlavor(fams)
		if flavor == "" {
			return Metrics{}, fmt.Errorf("parse metrics: %w", ErrUnknownFlavor)
		}
	}
	return extractFlavor(fams, flavor)
}

func referenceDetectFlavor(fams map[string]*dto.MetricFamily) Flavor {
	var vllm, sglang, llama, tgi bool
	for name := range fams {
		switch {
		case strings.HasPrefix(name, "vllm:"):
			vllm = true
		case strings.HasPrefix(name, "sglang:"):
			sglang = true
		case strings.HasPrefix(name, "llamacpp:"):
			llama = true
		case strings.HasPrefix(name, "tgi_"):
			tgi = true
		}
	}
	switch {
	case vllm:
		return vllmFlavor(fams)
	case sglang:
		return FlavorSGLang
	case llama:
		return FlavorLlamaCPP
	case tgi:
		return FlavorTGI
	}
	return ""
}

func referenceDecode(r io.Reader, contentType string) (map[string]*dto.MetricFamily, error) {
	format := expfmt.FmtUnknown
	if contentType != "" {
		format = expfmt.ResponseFormat(http.Header{"Content-Type": {contentType}})
	}
	if format.FormatType() == expfmt.TypeProtoDelim {
		return decodeWith(expfmt.NewDecoder(r, format))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	if len(fams) > MaxFamilies {
		return nil, fmt.Errorf("%d metric families, more than %d", len(fams), MaxFamilies)
	}
	return fams, nil
}

// sameResult compares two parses: equal Metrics (NaN equal to NaN) and
// equal errors.
func sameResult(got Metrics, gotErr error, want Metrics, wantErr error) error {
	if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
		return fmt.Errorf("error %v, want %v", gotErr, wantErr)
	}
	if errors.Is(gotErr, ErrUnknownFlavor) != errors.Is(wantErr, ErrUnknownFlavor) {
		return fmt.Errorf("error %v: errors.Is(ErrUnknownFlavor) differs from %v", gotErr, wantErr)
	}
	g, w := fmt.Sprintf("%#v", nanFree(got)), fmt.Sprintf("%#v", nanFree(want))
	if g != w {
		return fmt.Errorf("metrics\n got %s\nwant %s", g, w)
	}
	return nil
}

func nanFree(m Metrics) Metrics {
	for _, p := range []*float64{&m.Waiting, &m.Running, &m.KVUsage, &m.PrefixQueries, &m.PrefixHits, &m.CacheHitRate,
		&m.Preemptions, &m.PromptTokens, &m.GenerationTokens} {
		if math.IsNaN(*p) {
			*p = -12345
		}
	}
	return m
}

func testPages(t testing.TB) map[string][]byte {
	t.Helper()
	pages := map[string][]byte{}
	for _, name := range append([]string{"vllm", "vllm-legacy", "sglang", "sglang-prefill", "sglang-decode", "llamacpp", "tgi"}, emulatorPages...) {
		b, err := os.ReadFile(filepath.Join("testdata", name+".prom"))
		if err != nil {
			t.Fatal(err)
		}
		pages[name] = b
	}
	return pages
}

// checkSame parses body with the fast path (a fresh parser and p, which
// may hold an earlier page's state) and the reference, for every flavour.
func checkSame(p *metricsParser, body []byte, contentType string) error {
	fams, decodeErr := referenceDecode(bytes.NewReader(body), contentType)
	want, wantErr := referenceExtract(fams, decodeErr, FlavorAuto)
	got, err := ParseMetrics(bytes.NewReader(body), contentType, FlavorAuto)
	if d := sameResult(got, err, want, wantErr); d != nil {
		return fmt.Errorf("ParseMetrics: %v", d)
	}
	fastFams, prefixes, fastErr := p.decode(body, contentType)
	for _, flavor := range Flavors {
		want, wantErr := referenceExtract(fams, decodeErr, flavor)
		var got Metrics
		var err error
		if fastErr != nil {
			err = fmt.Errorf("parse metrics: %w", fastErr)
		} else {
			got, err = extract(fastFams, prefixes, flavor)
		}
		if d := sameResult(got, err, want, wantErr); d != nil {
			return fmt.Errorf("flavor %s: %v", flavor, d)
		}
	}
	return nil
}

// TestParseFilterFastPath: engines' pages take the fast path, which gives
// expfmt a fraction of the page.
func TestParseFilterFastPath(t *testing.T) {
	for name, body := range testPages(t) {
		p := newMetricsParser()
		kept, prefixes, ok := p.filter(body)
		if !ok {
			t.Errorf("%s: the mirror gave up on an engine page", name)
			continue
		}
		if len(kept) > len(body) || strings.HasPrefix(name, "emulator-") && len(kept) >= len(body) || prefixes == 0 {
			t.Errorf("%s: kept %d of %d bytes, prefixes %b", name, len(kept), len(body), prefixes)
		}
	}
}

// TestParseFilterDifferential compares the fast path with the reference on
// the testdata pages and on many small corruptions of them.
func TestParseFilterDifferential(t *testing.T) {
	p := newMetricsParser()
	pages := testPages(t)
	for name, body := range pages {
		if err := checkSame(p, body, textCT); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	names := slices.Sorted(maps.Keys(pages))
	n := 1000
	if testing.Short() {
		n = 200
	}
	for i := range n {
		name := names[rng.IntN(len(names))]
		body := mutatePage(rng, pages[name])
		if err := checkSame(p, body, textCT); err != nil {
			t.Fatalf("mutation %d of %s: %v\npage:\n%s", i, name, err, body)
		}
	}
}

// mutatePage corrupts a page the way a broken engine or a cut connection
// might: a byte changed, inserted or removed, a line duplicated, moved,
// dropped or cut short, the page truncated.
func mutatePage(rng *rand.Rand, page []byte) []byte {
	lines := strings.SplitAfter(string(page), "\n")
	nasty := []string{" ", "\t", "{", "}", "\"", "\\", ",", "=", "#", "\n", "\r", "-", "_count", "_sum", "_bucket",
		"NaN", "+Inf", "0x1p3", "1_0", "le", "quantile", "__name__", "\xff", "HELP ", "TYPE ", "histogram", "summary",
		" 123", " 1.5", "vllm:", "tgi_", "e", ":"}
	for range 1 + rng.IntN(3) {
		if len(lines) == 0 {
			break
		}
		i := rng.IntN(len(lines))
		l := lines[i]
		switch rng.IntN(8) {
		case 0: // change, insert or remove at a byte
			j := rng.IntN(len(l) + 1)
			ins := nasty[rng.IntN(len(nasty))]
			cut := j
			if rng.IntN(2) == 0 && j < len(l) {
				cut = j + 1
			}
			lines[i] = l[:j] + ins + l[cut:]
		case 1:
			lines = append(lines[:i+1], lines[i:]...)
		case 2:
			k := rng.IntN(len(lines))
			lines[i], lines[k] = lines[k], lines[i]
		case 3:
			lines = append(lines[:i], lines[i+1:]...)
		case 4:
			lines[i] = l[:rng.IntN(len(l)+1)]
		case 5: // a HELP or TYPE line for a family read or not
			fam := []string{"vllm:num_requests_waiting", "vllm:num_requests_waiting_count", "vllm:e2e_request_latency_seconds",
				"vllm:e2e_request_latency_seconds_sum", "sglang:token_usage", "vllm:kv_cache_usage_perc_bucket"}[rng.IntN(6)]
			kind := []string{"# HELP " + fam + " x\n", "# TYPE " + fam + " gauge\n", "# TYPE " + fam + " histogram\n",
				"# TYPE " + fam + " summary\n", fam + "{le=\"1\"} 2\n", fam + " 3\n", fam + "_count 4\n"}[rng.IntN(7)]
			lines = append(lines[:i], append([]string{kind}, lines[i:]...)...)
		case 6: // a timestamp or trailing blank
			lines[i] = strings.TrimSuffix(l, "\n") + []string{" 1700000000000", " ", "\t", " 1.5", " 12 "}[rng.IntN(5)] + "\n"
		case 7:
			b := []byte(strings.Join(lines, ""))
			return b[:rng.IntN(len(b)+1)]
		}
	}
	return []byte(strings.Join(lines, ""))
}

// TestParseFilterCases are pages where the mirror must give up or follow
// expfmt's family bookkeeping.
func TestParseFilterCases(t *testing.T) {
	q := "vllm:num_requests_waiting 1\nvllm:num_requests_running 2\n"
	tests := []struct {
		name string
		body string
		fast bool // the mirror vouches for the page
	}{
		{"plain", q, true},
		{"untyped le is a label", q + "vllm:e2e_seconds_bucket{le=\"x\"} 1\n", true},
		{"skipped family bad value", q + "vllm:other 1.2.3\n", false},
		{"skipped histogram le", "# TYPE vllm:h histogram\nvllm:h_bucket{le=\"x\"} 1\n" + q, false},
		{"second HELP skipped", "# HELP vllm:other a\n# HELP vllm:other b\n" + q, false},
		{"second HELP of a family read", "# HELP vllm:num_requests_waiting a\n# HELP vllm:num_requests_waiting b\n" + q, false},
		{"HELP only", "# HELP vllm:other a\n# HELP vllm:num_requests_waiting_count b\n" + q, true},
		{"second TYPE", "# TYPE vllm:other gauge\n# TYPE vllm:other gauge\n" + q, false},
		{"TYPE after samples", "vllm:other 1\n# TYPE vllm:other gauge\n" + q, false},
		{"HELP of histogram suffix", "# TYPE vllm:h histogram\n# HELP vllm:h_sum x\n# HELP vllm:h y\n" + q, false},
		{"TYPE of summary suffix", "# TYPE vllm:s summary\n# TYPE vllm:s_count gauge\n" + q, false},
		{"wanted family as histogram", "# TYPE vllm:num_requests_waiting histogram\nvllm:num_requests_waiting_bucket{le=\"1\"} 3\nvllm:num_requests_running 2\n", true},
		{"wanted family count suffix", "vllm:num_requests_waiting_count 3\n" + q, true},
		{"duplicate label", "vllm:other{a=\"1\",a=\"2\"} 1\n" + q, false},
		{"reserved label", "vllm:other{__name__=\"x\"} 1\n" + q, false},
		{"brace start", "{\"vllm:other\"} 1\n" + q, false},
		{"quoted name", "\"vllm:other\" 1\n" + q, false},
		{"no last newline", strings.TrimSuffix(q, "\n"), false},
		{"CRLF", strings.ReplaceAll(q, "\n", "\r\n"), false},
		{"timestamp", "vllm:other 1 1700000000000\n" + q, true},
		{"bad timestamp", "vllm:other 1 17.5\n" + q, false},
		{"trailing blank", "vllm:other 1 \n" + q, false},
		{"hex value", "vllm:other 0x1p3\n" + q, false},
		{"escapes", "# HELP vllm:other a \\\\ \\n \\\"\nvllm:other{a=\"\\\" \\\\ \\n\"} 1\n" + q, true},
		{"bad escape", "# HELP vllm:other a \\t\n" + q, false},
		{"bad UTF-8 label", "vllm:other{a=\"\xff\"} 1\n" + q, false},
		{"negative bucket", "# TYPE vllm:h histogram\nvllm:h_bucket{le=\"1\"} -1.5\n" + q, false},
		{"comments", "# EOF\n#\n# foo bar\n#HELP\n" + q, true},
		{"tgi suffix family", "# TYPE tgi histogram\ntgi_count 1\ntgi_queue_size 1\ntgi_batch_current_size 1\n", true},
		{"only a tgi suffix", "# TYPE tgi histogram\ntgi_count 1\n", true},
		{"empty", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, ok := newMetricsParser().filter([]byte(tt.body))
			if ok != tt.fast {
				t.Errorf("fast path = %v, want %v", ok, tt.fast)
			}
			if err := checkSame(newMetricsParser(), []byte(tt.body), textCT); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestWantedFamilyNames checks that every metric name the extract
// functions read is a wanted family, and that none ends in a suffix expfmt
// gives to summaries and histograms (the fast path's exactness rests on it).
func TestWantedFamilyNames(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "metrics.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || !strings.HasPrefix(fn.Name.Name, "extract") && fn.Name.Name != "detectFlavor" || fn.Name.Name == "extract" {
			continue
		}
		ast.Inspect(fn, func(node ast.Node) bool {
			lit, ok := node.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil || strings.Contains(s, " ") || !(strings.Contains(s, ":") || strings.HasPrefix(s, "tgi_")) {
				return true
			}
			n++
			if _, ok := wantedFamilies[s]; !ok {
				t.Errorf("%s reads %q, which is not in wantedFamilies", fn.Name.Name, s)
			}
			return true
		})
	}
	if n < len(wantedFamilies) {
		t.Errorf("found %d names in the extract functions, fewer than the %d wanted families", n, len(wantedFamilies))
	}
	for name := range wantedFamilies {
		if b := histogramBase([]byte(name)); len(b) != len(name) {
			t.Errorf("wanted family %q ends in _count, _sum or _bucket", name)
		}
	}
}

// FuzzParseFilter holds the fast path to the reference parse: the same
// Metrics and the same errors, for every flavour, with a fresh parser and
// with one that parsed an engine page before.
func FuzzParseFilter(f *testing.F) {
	pages := testPages(f)
	for _, name := range slices.Sorted(maps.Keys(pages)) {
		f.Add(pages[name])
	}
	f.Add([]byte("# TYPE vllm:h histogram\n# HELP vllm:h_sum x\n# HELP vllm:h y\nvllm:num_requests_waiting 1\n"))
	f.Add([]byte("# TYPE tgi histogram\ntgi_count 1\ntgi_queue_size 1 1700000000000\n"))
	f.Add([]byte("{\"vllm:num_requests_waiting\"} 1\nvllm:num_requests_running{a=\"\\\\\"} 2\n"))
	f.Add([]byte("vllm:num_requests_waiting_count 3\n# TYPE vllm:num_requests_waiting summary\nvllm:num_requests_waiting{quantile=\"0.5\"} 1\n"))
	warm := pages["vllm"]
	f.Fuzz(func(t *testing.T, body []byte) {
		p := newMetricsParser()
		if _, err := p.parse(warm, textCT, FlavorAuto); err != nil {
			t.Fatal(err)
		}
		if err := checkSame(p, body, textCT); err != nil {
			t.Fatal(err)
		}
	})
}
