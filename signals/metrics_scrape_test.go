package signals

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

// gzipServer serves testdata/<file>, gzipped when the scrape accepts it and
// gz is set (as prometheus_client does for vLLM and SGLang); corrupt breaks
// the gzip stream's checksum.
func gzipServer(tb testing.TB, file string, gz bool, corrupt bool) *httptest.Server {
	tb.Helper()
	page, err := os.ReadFile("testdata/" + file)
	if err != nil {
		tb.Fatal(err)
	}
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, _ = zw.Write(page)
	_ = zw.Close()
	zbody := zb.Bytes()
	if corrupt {
		zbody[len(zbody)-6] ^= 0xff // the CRC-32
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		if gz && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			_, _ = w.Write(zbody)
			return
		}
		_, _ = w.Write(page)
	}))
	tb.Cleanup(srv.Close)
	return srv
}

// TestScrapeGzip: gzipped pages (the Transport inflates them, with pooled
// readers) parse scrape after scrape as the page does directly, and a
// corrupt stream fails the scrape.
func TestScrapeGzip(t *testing.T) {
	page, _ := os.ReadFile("testdata/emulator-vllm.prom")
	want, err := ParseMetrics(bytes.NewReader(page), textCT, FlavorAuto)
	if err != nil {
		t.Fatal(err)
	}
	srv := gzipServer(t, "emulator-vllm.prom", true, false)
	var got []Metrics
	v := NewView(ViewConfig{})
	s, err := NewScraper(ScrapeConfig{Client: srv.Client()}, Target{Endpoint: "e", MetricsURL: srv.URL, View: v,
		OnMetrics: func(_ time.Time, m Metrics) { got = append(got, m) }})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		s.ScrapeOnce(context.Background())
	}
	if st := v.Snapshot(); st.Errors != 0 || len(got) != 3 {
		t.Fatalf("%d scrapes seen, snapshot %+v", len(got), st)
	}
	for i, m := range got {
		if err := sameResult(m, nil, want, nil); err != nil {
			t.Errorf("scrape %d: %v", i, err)
		}
	}

	bad := gzipServer(t, "emulator-vllm.prom", true, true)
	v = NewView(ViewConfig{})
	s, _ = NewScraper(ScrapeConfig{Client: bad.Client()}, Target{Endpoint: "e", MetricsURL: bad.URL, View: v})
	s.ScrapeOnce(context.Background())
	if st := v.Snapshot(); st.Errors != 1 || !strings.Contains(st.LastError, "checksum") {
		t.Errorf("corrupt gzip: snapshot %+v, want a checksum error", st)
	}
}

// referenceFetch is Scraper.fetch before the fast path (whole-page expfmt
// parse, no parser kept between scrapes), for side-by-side benchmarks.
func referenceFetch(ctx context.Context, client *http.Client, url string, buf *bytes.Buffer) (Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Metrics{}, err
	}
	req.Header.Set("Accept", acceptHeader)
	req.Header.Set("User-Agent", "kvroute")
	resp, err := client.Do(req)
	if err != nil {
		return Metrics{}, err
	}
	defer resp.Body.Close()
	buf.Reset()
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, 4<<20+1)); err != nil {
		return Metrics{}, err
	}
	return referenceParseMetrics(bytes.NewReader(buf.Bytes()), resp.Header.Get("Content-Type"), FlavorAuto)
}

// BenchmarkScrapeOnce is one scrape of the emulator's vLLM page over
// loopback HTTP, gzipped or not (the test server's costs included): old is
// referenceFetch, new Scraper.ScrapeOnce.
func BenchmarkScrapeOnce(b *testing.B) {
	for _, gz := range []bool{false, true} {
		enc := "plain"
		if gz {
			enc = "gzip"
		}
		srv := gzipServer(b, "emulator-vllm.prom", gz, false)
		b.Run(enc+"/old", func(b *testing.B) {
			var buf bytes.Buffer
			client := srv.Client()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := referenceFetch(context.Background(), client, srv.URL, &buf); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(enc+"/new", func(b *testing.B) {
			v := NewView(ViewConfig{})
			s, err := NewScraper(ScrapeConfig{Client: srv.Client()}, Target{Endpoint: "e", MetricsURL: srv.URL, View: v})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				s.ScrapeOnce(context.Background())
			}
			if st := v.Snapshot(); st.Errors != 0 {
				b.Fatalf("snapshot %+v", st)
			}
		})
	}
}
