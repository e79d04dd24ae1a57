package engine

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestGolden runs fixed workloads and compares a per-request summary
// (TTFT, end-to-end time, cached tokens, preemptions) and the final stats
// with testdata/golden. Any change to scheduling, caching or the cost model
// shows up here; rerun with -update after checking the diff is intended.
func TestGolden(t *testing.T) {
	tests := []struct {
		name    string
		profile string
		mod     func(*Config)
		n       int
	}{
		{"tiny-pressure", "tiny", func(c *Config) { c.NumGPUBlocks = 48; c.MaxModelLen = 512 }, 60},
		{"llama-8b", "llama-3.1-8b-h100", nil, 60},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustEngine(t, tt.profile, tt.mod)
			d := goldenWorkload(t, e, tt.n)
			var b bytes.Buffer
			fmt.Fprintf(&b, "# %s: id ttft_us e2e_us cached preemptions finish outputs\n", tt.name)
			for _, o := range d.outputs {
				if o.Finished {
					fmt.Fprintf(&b, "%s %d %d %d %d %s %d\n", o.ID, o.TTFT.Microseconds(), (o.Time - o.Arrival).Microseconds(),
						o.CachedTokens, o.Preemptions, o.FinishReason, o.Index+1)
				}
			}
			st := e.Stats()
			fmt.Fprintf(&b, "stats steps=%d busy_us=%d queries=%d hits=%d preemptions=%d prompt=%d generation=%d\n",
				st.Steps, st.BusyTime.Microseconds(), st.PrefixQueries, st.PrefixHits, st.Preemptions, st.PromptTokens, st.GenerationTokens)
			path := filepath.Join("testdata", "golden", tt.name+".txt")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(b.Bytes(), want) {
				t.Errorf("%s differs from the golden file; got:\n%s", path, b.String())
			}
		})
	}
}

// goldenWorkload adds n requests in groups sharing prefixes, arriving every
// few steps, and runs the engine dry.
func goldenWorkload(t *testing.T, e *Engine, n int) *driver {
	d := newDriver(t, e)
	maxLen := e.Profile().MaxModelLen
	for i := 0; i < n || e.HasWork(); i++ {
		if i < n {
			plen := min(40+(i*37)%300, maxLen/2)
			prompt := concat(tokens(1+(i%4)*1000, 64), tokens(100000+i*500, plen))
			out := 1 + (i*53)%120
			d.add(&Request{ID: fmt.Sprintf("r%02d", i), Prompt: prompt, MaxTokens: out, EOSAt: (i * 7) % 90})
		}
		d.step()
	}
	return d
}
