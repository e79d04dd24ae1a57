package report

import (
	"bytes"
	"encoding/csv"
	"encoding/xml"
	"flag"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

var update = flag.Bool("update", false, "rewrite golden files")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from golden file:\ngot:\n%s\nwant:\n%s", name, got, want)
	}
}

// sweepReport builds a deterministic two-policy sweep with utilisation.
func sweepReport() *Report {
	rep := &Report{Title: "kvroute sim: test", Source: "sim", Workload: "rag",
		Params: map[string]string{"engines": "4", "seed": "1"},
		SLO:    SLO{TTFT: time.Second, TPOT: 50 * time.Millisecond}}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, policy := range []string{"kv-aware", "round_robin"} {
		for _, load := range []float64{0.5, 1, 2} {
			c := NewCollector()
			for i := range 200 {
				slow := time.Duration(load * float64(time.Millisecond) * (1 + rng.Float64()*300))
				if policy == "round_robin" {
					slow *= 3
				}
				s := Sample{ID: "r", Engine: []string{"e0", "e1", "e2", "e3"}[i%4], Arrival: time.Duration(i) * 100 * time.Millisecond,
					TTFT: slow, E2E: slow + 2*time.Second, PromptTokens: 2000, OutputTokens: 100}
				s.CachedTokens = int(rng.IntN(2000))
				if i%50 == 7 {
					s.Err = "timeout"
				}
				if i%70 == 3 {
					s.Rejected = true
				}
				c.Add(s)
			}
			rep.Rows = append(rep.Rows, c.Summary(SummaryOptions{Name: policy, Load: load, SLO: rep.SLO, OracleHitRate: 0.75}))
		}
	}
	u := Utilisation{Run: "kv-aware@1", Metric: "kv usage"}
	for e := range 3 {
		s := Series{Name: []string{"e0", "e1", "e2"}[e]}
		for t := range 20 {
			s.X = append(s.X, float64(t))
			s.Y = append(s.Y, float64((t*(e+1))%10)/10)
		}
		u.Engines = append(u.Engines, s)
	}
	rep.Utilisation = []Utilisation{u}
	return rep
}

func TestTableGolden(t *testing.T) {
	var buf bytes.Buffer
	rep := sweepReport()
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	golden(t, "sweep_table.golden", buf.Bytes())

	buf.Reset()
	single := &Report{Title: "kvroute bench", Workload: "trace.jsonl", Rows: rep.Rows[:1]}
	single.Rows[0].Errors = map[string]int{"connect": 2, "http_500": 1}
	if err := single.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	golden(t, "single_table.golden", buf.Bytes())
}

func TestPercentilesMatchNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 2, 3, 10, 99, 100, 101, 1000} {
		d := make([]time.Duration, n)
		for i := range d {
			d[i] = time.Duration(rng.IntN(1e6))
		}
		sorted := slices.Clone(d)
		slices.Sort(sorted)
		for _, q := range []float64{0, 0.01, 0.5, 0.9, 0.99, 1} {
			// Naive nearest rank: the smallest x with count(<= x) >= q*n.
			var want time.Duration
			for _, x := range sorted {
				cnt := 0
				for _, y := range d {
					if y <= x {
						cnt++
					}
				}
				if float64(cnt) >= q*float64(n) {
					want = x
					break
				}
			}
			if got := Percentile(d, q); got != want {
				t.Errorf("n=%d q=%v: got %v, want %v", n, q, got, want)
			}
		}
	}
}

func TestSummarize(t *testing.T) {
	ms := time.Millisecond
	samples := []Sample{
		{Engine: "a", Arrival: 0, TTFT: 100 * ms, E2E: 1100 * ms, PromptTokens: 100, CachedTokens: 50, OutputTokens: 11},
		{Engine: "a", Arrival: 500 * ms, TTFT: 300 * ms, E2E: 2300 * ms, PromptTokens: 100, CachedTokens: -1, OutputTokens: 21},
		{Engine: "b", Arrival: 1000 * ms, TTFT: 200 * ms, E2E: 200 * ms, PromptTokens: 100, CachedTokens: 0, OutputTokens: 1},
		{Arrival: 1500 * ms, E2E: 10 * ms, Err: "connect"},
		{Arrival: 1500 * ms, E2E: 10 * ms, Err: "connect"},
		{Engine: "b", Arrival: 2000 * ms, E2E: 5 * ms, Rejected: true},
	}
	row := Summarize(samples, SummaryOptions{Name: "x", SLO: SLO{TTFT: 250 * ms, TPOT: 99 * ms}, Engines: []string{"a", "b", "c"}, OracleHitRate: -1})
	want := Row{
		Name: "x", Requests: 6, Completed: 3, Rejected: 1, Errors: map[string]int{"connect": 2},
		TTFT:         Dist{N: 3, Mean: 200 * ms, P50: 200 * ms, P90: 300 * ms, P99: 300 * ms, Max: 300 * ms},
		TPOT:         Dist{N: 2, Mean: 100 * ms, P50: 100 * ms, P90: 100 * ms, P99: 100 * ms, Max: 100 * ms},
		E2E:          Dist{N: 3, Mean: 1200 * ms, P50: 1100 * ms, P90: 2300 * ms, P99: 2300 * ms, Max: 2300 * ms},
		Duration:     2800 * ms, // 0 .. 500ms+2300ms
		PromptTokens: 300, CachedTokens: 50, OutputTokens: 33,
		HitRate: 50.0 / 200, OracleHitRate: -1,
		Imbalance: 3 / (4.0 / 3), // a: 2, b: 2 (one rejected), c: 0
		Engines:   []EngineStat{{"a", 2, 200, 50}, {"b", 2, 100, 0}, {"c", 0, 0, 0}},
	}
	secs := 2.8
	want.ThroughputRPS, want.OutputTPS = 3/secs, 33/secs
	// Goodput: #1 (ttft 100, tpot 100ms > 99ms: no), #2 (ttft 300: no), #3 (1 token: yes).
	want.Goodput, want.GoodputFrac = 1/secs, 1.0/6
	want.Imbalance = 2 / (4.0 / 3)
	row.TTFTQuantiles = nil
	if !reflect.DeepEqual(row, want) {
		t.Errorf("got  %+v\nwant %+v", row, want)
	}

	empty := Summarize(nil, SummaryOptions{Name: "none", OracleHitRate: -1})
	if empty.Requests != 0 || empty.HitRate != -1 || empty.Imbalance != -1 || empty.TTFTQuantiles != nil {
		t.Errorf("empty summary: got %+v", empty)
	}
}

// TestSummarizeNegativeSLOIsNone: a negative limit is no limit, as
// SLO.String renders it ("none"), not a limit every request misses.
func TestSummarizeNegativeSLOIsNone(t *testing.T) {
	samples := []Sample{{TTFT: time.Millisecond, E2E: 10 * time.Millisecond, OutputTokens: 5}}
	slo := SLO{TTFT: -time.Second, TPOT: -time.Second}
	row := Summarize(samples, SummaryOptions{SLO: slo, OracleHitRate: -1})
	if slo.String() != "none" || row.GoodputFrac != 1 {
		t.Errorf("SLO %q: goodput fraction %v, want none and 1", slo, row.GoodputFrac)
	}
}

func TestCollectorConcurrent(t *testing.T) {
	c := NewCollector()
	done := make(chan struct{})
	for g := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 100 {
				c.Add(Sample{TTFT: time.Duration(g*100 + i), E2E: time.Second, OutputTokens: 1})
			}
		}()
	}
	for range 8 {
		<-done
	}
	if got := c.Summary(SummaryOptions{}).Completed; got != 800 {
		t.Errorf("completed: got %d, want 800", got)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	rep := sweepReport()
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	got, err := ReadJSON(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rep) {
		t.Errorf("JSON round trip differs:\ngot  %+v\nwant %+v", got, rep)
	}
}

// TestInterruptedRow: a row's interrupted requests (bench: in flight at
// Ctrl-C) show under the table and in the HTML, and survive the JSON round
// trip.
// TestInterruptedOneRequest: one interrupted request is "1 request", in
// the table and the HTML.
func TestInterruptedOneRequest(t *testing.T) {
	rep := &Report{Title: "kvroute bench", Rows: []Row{{Name: "bench", Requests: 5, Completed: 5, Interrupted: 1}}}
	var table, html bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteHTML(&html); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{table.String(), html.String()} {
		if !strings.Contains(out, ": 1 request in flight cut short") || strings.Contains(out, "1 requests") {
			t.Errorf("want \": 1 request in flight cut short\" and no \"1 requests\" in:\n%s", out)
		}
	}
}

func TestInterruptedRow(t *testing.T) {
	rep := &Report{Title: "kvroute bench", Rows: []Row{{Name: "bench", Requests: 5, Completed: 5, Interrupted: 2}}}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if want := "interrupted bench: 2 requests in flight cut short"; !strings.Contains(buf.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, buf.String())
	}
	buf.Reset()
	if err := rep.WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	if want := "bench (load 0): 2 requests in flight cut short"; !strings.Contains(buf.String(), want) {
		t.Errorf("HTML lacks %q:\n%s", want, buf.String())
	}
	buf.Reset()
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	got, err := ReadJSON(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if got.Rows[0].Interrupted != 2 {
		t.Errorf("interrupted %d after the JSON round trip, want 2", got.Rows[0].Interrupted)
	}
}

func TestCSV(t *testing.T) {
	rep := sweepReport()
	var buf bytes.Buffer
	if err := rep.WriteCSV(&buf); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(recs), len(rep.Rows)+1; got != want {
		t.Fatalf("got %d records, want %d", got, want)
	}
	head := recs[0]
	col := func(name string) int { return slices.Index(head, name) }
	for _, name := range []string{"name", "load", "ttft_p99_ms", "goodput_rps", "hit_rate", "oracle_hit_rate", "imbalance", "error_kinds"} {
		if col(name) < 0 {
			t.Errorf("no column %q in %v", name, head)
		}
	}
	if got, want := recs[1][col("name")], "kv-aware"; got != want {
		t.Errorf("row 1 name: got %q, want %q", got, want)
	}
	if got, want := recs[1][col("error_kinds")], "timeout=4"; got != want {
		t.Errorf("row 1 error kinds: got %q, want %q", got, want)
	}
}

// svgInfo is what a test learns from parsing an SVG chart.
type svgInfo struct {
	title  string
	series []string // data-name of each series group
	lines  int      // polylines drawn
}

func parseSVG(t *testing.T, dec *xml.Decoder, start xml.StartElement) svgInfo {
	t.Helper()
	var info svgInfo
	depth := 1
	inTitle := false
	for depth > 0 {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("svg: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			depth++
			switch el.Name.Local {
			case "title":
				inTitle = true
			case "g":
				for _, a := range el.Attr {
					if a.Name.Local == "data-name" {
						info.series = append(info.series, a.Value)
					}
				}
			case "polyline":
				for _, a := range el.Attr {
					if a.Name.Local == "points" && len(strings.Fields(a.Value)) >= 2 {
						info.lines++
					}
				}
			}
		case xml.EndElement:
			depth--
			inTitle = false
		case xml.CharData:
			if inTitle {
				info.title += string(el)
			}
		}
	}
	return info
}

func TestHTMLHasCharts(t *testing.T) {
	rep := sweepReport()
	var buf bytes.Buffer
	if err := rep.WriteHTML(&buf); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, bad := range []string{"<script", "http://", "https://", "@import", "url("} {
		if strings.Contains(strings.ReplaceAll(page, `xmlns="http://www.w3.org/2000/svg"`, ""), bad) {
			t.Errorf("HTML contains %q: not self-contained", bad)
		}
	}
	dec := xml.NewDecoder(strings.NewReader(page))
	dec.Strict = true
	var charts []svgInfo
	var cells int
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("HTML is not well formed: %v", err)
		}
		if el, ok := tok.(xml.StartElement); ok {
			switch el.Name.Local {
			case "svg":
				charts = append(charts, parseSVG(t, dec, el))
			case "td":
				cells++
			}
		}
	}
	wantTitles := []string{"TTFT CDF", "p99 TTFT against load", "Goodput (ttft<=1s tpot<=50ms) against load", "Per-engine kv usage over time: kv-aware@1"}
	var titles []string
	for _, c := range charts {
		titles = append(titles, c.title)
	}
	if !reflect.DeepEqual(titles, wantTitles) {
		t.Fatalf("chart titles: got %q, want %q", titles, wantTitles)
	}
	wantSeries := [][]string{
		{"kv-aware @2", "round_robin @2"},
		{"kv-aware", "round_robin"},
		{"kv-aware", "round_robin"},
		{"e0", "e1", "e2"},
	}
	for i, c := range charts {
		if !reflect.DeepEqual(c.series, wantSeries[i]) || c.lines != len(wantSeries[i]) {
			t.Errorf("chart %q: got series %q with %d lines, want %q", c.title, c.series, c.lines, wantSeries[i])
		}
	}
	if cells < len(rep.Rows)*10 {
		t.Errorf("results table has %d cells, want at least %d", cells, len(rep.Rows)*10)
	}
}

func TestWriteDir(t *testing.T) {
	dir := t.TempDir()
	paths, err := sweepReport().WriteDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range paths {
		names = append(names, filepath.Base(p))
	}
	want := []string{"report.json", "report.csv", "report.txt", "report.html", "ttft_cdf.svg", "ttft_p99_vs_load.svg",
		"goodput_vs_load.svg", "utilisation_0_kv-aware_1.svg"}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("wrote %q, want %q", names, want)
	}
	for _, n := range names[4:] {
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		dec := xml.NewDecoder(bytes.NewReader(data))
		dec.Strict = true
		found := false
		for {
			tok, err := dec.Token()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", n, err)
			}
			if el, ok := tok.(xml.StartElement); ok && el.Name.Local == "svg" {
				found = parseSVG(t, dec, el).lines > 0
			}
		}
		if !found {
			t.Errorf("%s: no svg with lines", n)
		}
	}
}

func TestEmptyReportRenders(t *testing.T) {
	rep := &Report{}
	var buf bytes.Buffer
	for _, f := range []func(io.Writer) error{rep.WriteTable, rep.WriteCSV, rep.WriteJSON, rep.WriteHTML} {
		if err := f(&buf); err != nil {
			t.Fatal(err)
		}
	}
	// One degenerate series: a single point and NaNs must not break the chart.
	rep.Utilisation = []Utilisation{{Engines: []Series{{Name: "e", X: []float64{1, 2}, Y: []float64{nan(), 5}}}}}
	if got := len(rep.Charts()); got != 1 {
		t.Errorf("got %d charts, want 1", got)
	}
	if err := rep.WriteJSON(&buf); err != nil {
		t.Errorf("JSON with NaN: %v", err)
	}
}

func nan() float64 { var z float64; return z / z }

func TestProgress(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	p := newProgress(&buf, 10, "bench", func() time.Time { return now })
	for range 10 {
		now = now.Add(time.Second)
		p.Add(1)
	}
	p.Finish()
	out := buf.String()
	if !strings.Contains(out, "10/10 100%") || !strings.HasSuffix(out, "\n") {
		t.Errorf("progress output %q lacks the final state", out)
	}
	var off bytes.Buffer
	q := NewProgress(&off, 5, "x") // not a terminal: silent
	q.Add(5)
	q.Finish()
	if off.Len() != 0 {
		t.Errorf("non-terminal progress wrote %q", off.String())
	}
	var nilP *Progress
	nilP.Add(1)
	nilP.Finish()
}

func TestNiceTicks(t *testing.T) {
	for _, tc := range [][2]float64{{0, 1}, {0, 10}, {3, 3}, {0, 8.76}, {0.5, 2}, {-3, 7.2}, {1e-5, 3e-5}, {0, 1234}} {
		got := niceTicks(tc[0], tc[1], 5)
		eps := 1e-9 * max(1e-12, tc[1]-tc[0])
		if len(got) < 2 || got[0] > tc[0]+eps || got[len(got)-1] < tc[1]-eps || len(got) > 12 {
			t.Errorf("niceTicks(%v, %v) = %v: want 2..12 ticks covering the range", tc[0], tc[1], got)
		}
	}
}

func TestOccupancy(t *testing.T) {
	s := []Sample{
		{Engine: "a", Arrival: 0, E2E: 4 * time.Second},
		{Engine: "a", Arrival: time.Second, E2E: time.Second},
		{Engine: "b", Arrival: 2 * time.Second, E2E: 2 * time.Second},
	}
	got := Occupancy(s, 5) // t = 0, 1, 2, 3, 4 s
	want := []Series{
		{Name: "a", X: []float64{0, 1, 2, 3, 4}, Y: []float64{1, 2, 1, 1, 0}},
		{Name: "b", X: []float64{0, 1, 2, 3, 4}, Y: []float64{0, 0, 1, 1, 0}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if Occupancy(nil, 5) != nil {
		t.Error("Occupancy(nil) != nil")
	}
}

func FuzzReadJSON(f *testing.F) {
	var buf bytes.Buffer
	if err := sweepReport().WriteJSON(&buf); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte(`{"rows":[{"name":"x","load":1,"ttft_quantiles_s":[1,2]}],"utilisation":[{"engines":[{"x":[1],"y":[]}]}]}`))
	f.Add([]byte(`{"rows":[{"name":"<b>&","errors":{"a":1}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rep, err := ReadJSON(bytes.NewReader(data))
		if err != nil {
			return
		}
		// Whatever parses renders, and its HTML stays well formed.
		for _, w := range []func(io.Writer) error{rep.WriteTable, rep.WriteCSV, rep.WriteJSON} {
			if err := w(io.Discard); err != nil {
				t.Fatal(err)
			}
		}
		var html bytes.Buffer
		if err := rep.WriteHTML(&html); err != nil {
			t.Fatal(err)
		}
		if err := wellFormed(&html); err != nil {
			t.Fatalf("HTML not well formed: %v", err)
		}
	})
}

// wellFormed reads r as strict XML to its end.
func wellFormed(r io.Reader) error {
	dec := xml.NewDecoder(r)
	dec.Strict = true
	for {
		if _, err := dec.Token(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

func BenchmarkSummarize(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	samples := make([]Sample, 10000)
	for i := range samples {
		samples[i] = Sample{Engine: "e" + string(rune('0'+i%8)), Arrival: time.Duration(i) * time.Millisecond,
			TTFT: time.Duration(rng.IntN(1e9)), E2E: time.Duration(1e9 + rng.IntN(1e9)), PromptTokens: 1000, CachedTokens: 500, OutputTokens: 100}
	}
	b.ReportAllocs()
	for b.Loop() {
		Summarize(samples, SummaryOptions{SLO: SLO{TTFT: time.Second}})
	}
}

func TestMerge(t *testing.T) {
	a := &Report{Title: "a", Source: "bench", Params: map[string]string{"url": "x", "rate": "1"}, Rows: []Row{{Name: "p1"}}}
	b := &Report{Title: "b", Source: "bench", Params: map[string]string{"url": "x", "rate": "2"}, Rows: []Row{{Name: "p2"}},
		Utilisation: []Utilisation{{Run: "p2"}}}
	got := Merge(a, nil, b)
	want := &Report{Title: "a", Source: "bench", Params: map[string]string{"url": "x", "rate": "1 | 2"},
		Rows: []Row{{Name: "p1"}, {Name: "p2"}}, Utilisation: []Utilisation{{Run: "p2"}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestWriteSamplesCSV(t *testing.T) {
	var buf bytes.Buffer
	err := WriteSamplesCSV(&buf, []Sample{
		{ID: "r1", Engine: "e0", Arrival: 1500 * time.Microsecond, TTFT: 20 * time.Millisecond, E2E: 120 * time.Millisecond,
			PromptTokens: 10, CachedTokens: -1, OutputTokens: 11},
		{ID: "r,2", Err: "http_500"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "id,engine,arrival_ms,ttft_ms,tpot_ms,e2e_ms,prompt_tokens,cached_tokens,output_tokens,preemptions,error,rejected\n" +
		"r1,e0,1.500,20.000,10.000,120.000,10,-1,11,0,,false\n" +
		"\"r,2\",,0.000,0.000,0.000,0.000,0,0,0,0,http_500,false\n"
	if got := buf.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// TestChartLongNameStaysUTF8: a legend cuts a long name to fit, on a
// character boundary: cut inside a multi-byte character, the standalone
// .svg file was not UTF-8 and no XML reader (browsers included) opened it.
func TestChartLongNameStaysUTF8(t *testing.T) {
	name := strings.Repeat("é", 30) // 60 bytes: a cut at byte 23 falls inside an é
	rep := &Report{Rows: []Row{{Name: name, TTFTQuantiles: []float64{0.1, 0.2}}}}
	charts := rep.Charts()
	if len(charts) == 0 {
		t.Fatal("no chart")
	}
	for _, c := range charts {
		if err := wellFormed(strings.NewReader(svgHeader + c.SVG)); err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		if !strings.Contains(c.SVG, ">"+strings.Repeat("é", 23)+"…<") {
			t.Errorf("%s: legend does not hold the name cut to 23 characters and …", c.Name)
		}
	}
}

// TestNamesWithIllegalXMLCharacters: a control character or a byte that is
// not UTF-8 in a name, a title or a setting left the HTML and the
// standalone .svg files not well formed (XML syntax error: illegal
// character code U+0008), which no browser opens as SVG. FuzzReadJSON found
// the name "\b".
func TestNamesWithIllegalXMLCharacters(t *testing.T) {
	for _, bad := range []string{"a\bb", "a\xffb", "a\uFFFEb", "a\x00b"} {
		rep := &Report{Title: bad, Workload: bad, Params: map[string]string{bad: bad},
			Rows: []Row{{Name: bad, TTFTQuantiles: []float64{0.1, 0.2}, Errors: map[string]int{bad: 1}},
				{Name: bad, Load: 2, TTFTQuantiles: []float64{0.1, 0.3}}},
			Utilisation: []Utilisation{{Run: bad, Metric: bad, Engines: []Series{{Name: bad, X: []float64{0, 1}, Y: []float64{0, 1}}}}}}
		for _, c := range rep.Charts() {
			if err := wellFormed(strings.NewReader(svgHeader + c.SVG)); err != nil {
				t.Errorf("%q: %s.svg: %v", bad, c.Name, err)
			}
			if !strings.Contains(c.SVG, "a\uFFFDb") {
				t.Errorf("%q: %s.svg does not show the name with U+FFFD", bad, c.Name)
			}
		}
		var html bytes.Buffer
		if err := rep.WriteHTML(&html); err != nil {
			t.Fatal(err)
		}
		if err := wellFormed(&html); err != nil {
			t.Errorf("%q: report.html: %v", bad, err)
		}
	}
}

// TestTableAlignsNonASCIINames: the table pads its columns by characters,
// not bytes: a row named with a multi-byte character was padded short by
// one column per extra byte, and every column after it was out of line.
func TestTableAlignsNonASCIINames(t *testing.T) {
	rep := &Report{Rows: []Row{{Name: "kv"}, {Name: "café-π"}, {Name: "ünïcödé"}}}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")[1:] // the header and the rows
	for _, l := range lines[1:] {
		if utf8.RuneCountInString(l) != utf8.RuneCountInString(lines[0]) {
			t.Errorf("table lines of different widths:\n%s", strings.Join(lines, "\n"))
			break
		}
	}
}

// TestReadJSONTrailingData: ReadJSON reads one report and nothing after it:
// two reports in one file (cat a.json b.json), or a report with text
// after it, was read as its first report alone, the rest dropped without
// a word.
func TestReadJSONTrailingData(t *testing.T) {
	var buf bytes.Buffer
	if err := sweepReport().WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	one := buf.String()
	if _, err := ReadJSON(strings.NewReader(one + "\n \t\r\n")); err != nil {
		t.Errorf("one report and white space: %v", err)
	}
	for _, bad := range []string{one + one, one + "x", one + "]"} {
		if _, err := ReadJSON(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "after the report") {
			t.Errorf("ReadJSON(%q...%q): got %v, want an error about data after the report", bad[:10], bad[len(bad)-10:], err)
		}
	}
}
