package workload

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// TestGenerateStable: the generators' requests for a given seed and options
// never change (the simulator's published results are computed from them):
// the SHA-256 of each case's trace (WriteTrace: arrivals in ns, sessions,
// tenants, segments, lengths) is pinned. A change that alters one on
// purpose must say so and update the hash.
func TestGenerateStable(t *testing.T) {
	for _, tc := range []struct {
		gen  string
		opts Options
		want string
	}{
		{"chat", Options{Seed: 1, Requests: 400}, "20dc706f4ded1b5806a6e12e123c840548ea7afb787c774ba42208b9ee7019e8"},
		{"chat", Options{Seed: 2, Requests: 400, Arrivals: Arrivals{Rate: 500}}, "bce74110168916400c0e6eb0f117db4b5272506b39e8f545aced1fa8db3fe6e9"},
		{"chat", Options{Seed: 3, Requests: 400, Arrivals: Arrivals{Rate: 5000}}, "9aa3bf11cd5950033683ef27f7f71b3f1e59d6e48a50c524148310f721af82c4"},
		{"chat", Options{Seed: 4, Requests: 400, Arrivals: Arrivals{Rate: 20000, Kind: Gamma, CV: 3}}, "8368c040f2295189b93ca8c362814857254c817ecf7a429208962d972f8b75c7"},
		{"chat", Options{Seed: 5, Requests: 400, Arrivals: Arrivals{Rate: 50, Kind: Constant},
			Params: map[string]float64{"turns": 7, "think_s": 2, "max_len": 3000, "system_len": 0}}, "cd92bd6228307cd49ca8e95480dea20335928c3c9369de98bcda629307719e28"},
		{"chat", Options{Seed: 6, Requests: 400, Arrivals: Arrivals{Rate: 100}, Params: map[string]float64{"turns": 1, "think_s": 0}}, "709b3993728ec8559551085d27dc7b29b3e06f7eaa2cc926d49c822a2b8d249c"},
		{"rag", Options{Seed: 1, Requests: 400, Arrivals: Arrivals{Rate: 300}}, "9eaae8204d8a3c3816840731d59ae848f343583f8ad6e5c51a6ff0d8526d0e18"},
		{"sysprompt", Options{Seed: 1, Requests: 400, Arrivals: Arrivals{Rate: 300}}, "7ff45972c6308629a2b5abf4b33d901eaab4dc4c22b861a5478570e057f50e77"},
		{"storm", Options{Seed: 1, Requests: 400, Arrivals: Arrivals{Rate: 300}}, "8b3333b9364e4ab3a5c9f2c927f07a220f33516e0fcd9dcc288cbb831dfddeca"},
		{"tenants", Options{Seed: 1, Requests: 400, Arrivals: Arrivals{Rate: 300}}, "703f4e929c19c1302ea2530454b6904e842e8cbfeea5a0a8412a0cadcf019b6f"},
		{"lora", Options{Seed: 1, Requests: 400, Arrivals: Arrivals{Rate: 300}, Params: map[string]float64{"base_share": 0.2}}, "571bb062dc6714a12cb571f63de8e0c3ad38cfe68b8b9adfadb9cdd3f7c0d0ce"},
	} {
		name := fmt.Sprintf("%s/seed=%d/rate=%g", tc.gen, tc.opts.Seed, tc.opts.Arrivals.Rate)
		t.Run(name, func(t *testing.T) {
			w := genOrFatal(t, tc.gen, tc.opts)
			var b strings.Builder
			if err := WriteTrace(&b, w.Requests); err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256([]byte(b.String()))
			if got := hex.EncodeToString(sum[:]); got != tc.want {
				t.Errorf("sha256 %s, want %s", got, tc.want)
			}
		})
	}
}
