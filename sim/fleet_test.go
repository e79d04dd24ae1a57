package sim

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestParseFleet(t *testing.T) {
	tests := []struct {
		spec, def string
		want      Fleet
		err       string
	}{
		{spec: "8", def: "tiny", want: Fleet{{Count: 8, Profile: "tiny"}}},
		{spec: "4xllama-3.1-8b-h100,2xqwen2.5-7b-h100", want: Fleet{{Count: 4, Profile: "llama-3.1-8b-h100"}, {Count: 2, Profile: "qwen2.5-7b-h100"}}},
		{spec: " tiny , 3xtiny ", want: Fleet{{Count: 1, Profile: "tiny"}, {Count: 3, Profile: "tiny"}}},
		{spec: "xtiny", want: Fleet{{Count: 1, Profile: "xtiny"}}},
		{spec: "", err: "empty"},
		{spec: "8", err: "needs a profile"},
		{spec: "0", def: "tiny", err: "at least 1"},
		{spec: "0xtiny", err: "at least 1"},
		{spec: "3x", err: "profile is empty"},
		{spec: "99999", def: "tiny", err: "limit"},
		// Counts whose sum wraps around int (to 2^63 and to 5) are over
		// the limit too, not a fleet of a few engines that then tries to
		// build 2^62 of them.
		{spec: "4611686018427387904xtiny,4611686018427387904xtiny", err: "limit"},
		{spec: "4611686018427387904xtiny,4611686018427387904xtiny,4611686018427387904xtiny,4611686018427387904xtiny,5xtiny", err: "limit"},
		{spec: ",", err: "no engines"},
		{spec: "2/prefill,3/decode", def: "tiny", want: Fleet{{Count: 2, Profile: "tiny", Role: "prefill"}, {Count: 3, Profile: "tiny", Role: "decode"}}},
		{spec: "2,1xqwen2.5-7b-h100", def: "tiny", want: Fleet{{Count: 2, Profile: "tiny"}, {Count: 1, Profile: "qwen2.5-7b-h100"}}},
		{spec: "2/prefill,2/decode", err: "needs a profile"},
		{spec: "2xtiny/prefill", err: "every engine is a prefill engine"},
		{spec: "1xtiny/prefill,1xtiny/prefill", err: "every engine is a prefill engine"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := ParseFleet(tt.spec, tt.def)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseFleet(%q) error: got %v, want containing %q", tt.spec, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseFleet(%q): %v", tt.spec, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseFleet(%q): got %+v, want %+v", tt.spec, got, tt.want)
			}
		})
	}
}

func TestParseFleetFile(t *testing.T) {
	got, err := ParseFleetFile([]byte("engines:\n  - {count: 2, profile: tiny}\n  - {count: 1, profile: tiny, num_gpu_blocks: 64, speed: 0.5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Fleet{{Count: 2, Profile: "tiny"}, {Count: 1, Profile: "tiny", NumGPUBlocks: 64, Speed: 0.5}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if got.Size() != 3 || got.String() != "2xtiny,1xtiny" {
		t.Fatalf("Size, String: got %d %q, want 3 \"2xtiny,1xtiny\"", got.Size(), got.String())
	}
	for _, bad := range []string{"engines: []", "engines:\n  - {count: 1, profile: tiny, colour: red}", "engines: 3", "{",
		"engines:\n  - {count: 1, profile: tiny, weight: -1}", "engines:\n  - {count: 1, profile: tiny, weight: 1000001}"} {
		if _, err := ParseFleetFile([]byte(bad)); err == nil {
			t.Errorf("ParseFleetFile(%q): got nil error, want one", bad)
		}
	}
	// The decoder's errors name the file's fields, not Go types, as the
	// config file's do.
	for bad, want := range map[string]string{
		"engines:\n  - {count: 1, profile: tiny, colour: red}": `parse fleet file: line 2: unknown field "colour" in engines[0]`,
		"engines:\n  - {count: x, profile: tiny}":              "parse fleet file: line 2: engines[0].count: cannot unmarshal !!str `x` into int",
		"engines:\n  - 3": "parse fleet file: line 2: engines[0]: cannot unmarshal !!int `3` into a mapping",
		// Two billion blocks would take the host's memory (it did, with a
		// Go stack trace), not model a GPU.
		"engines:\n  - {count: 1, profile: tiny, num_gpu_blocks: 2000000000}": "parse fleet file: fleet: group 0 (tiny): num_gpu_blocks 2000000000 is above the limit of 16777216",
		// A weight (or speed) written as 0 became the default 1: a group
		// meant to get nothing got a full share.
		"engines:\n  - {count: 1, profile: tiny, weight: 2}\n  - {count: 1, profile: tiny, weight: 0}": "parse fleet file: line 3: engines[1].weight: 0 is not a weight (1 to 1000000, default 1): to send a group nothing, leave it out of the fleet",
		"engines:\n  - count: 1\n    profile: tiny\n    speed: 0.0":                                    "parse fleet file: line 4: engines[0].speed: 0 is not a speed (positive, default 1: the profile's own)",
	} {
		if _, err := ParseFleetFile([]byte(bad)); err == nil || err.Error() != want {
			t.Errorf("ParseFleetFile(%q): got %v, want %s", bad, err, want)
		}
	}
}

func FuzzParseFleetFile(f *testing.F) {
	f.Add([]byte("engines:\n  - {count: 2, profile: tiny}\n"))
	f.Add([]byte("engines: [{count: -1, profile: x, speed: -2}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fl, err := ParseFleetFile(data)
		if err == nil && fl.Validate() != nil {
			t.Fatalf("accepted an invalid fleet %+v", fl)
		}
	})
}

func FuzzParseFleet(f *testing.F) {
	f.Add("4xtiny,2xllama-3.1-8b-h100")
	f.Add("8")
	f.Fuzz(func(t *testing.T, spec string) {
		fl, err := ParseFleet(spec, "tiny")
		if err == nil && (fl.Validate() != nil || fl.Size() < 1 || fl.Size() > maxEngines) {
			t.Fatalf("accepted an invalid fleet %+v", fl)
		}
	})
}

func TestParseSweep(t *testing.T) {
	tests := []struct {
		spec string
		want []float64
		err  bool
	}{
		{spec: "0.5:2:0.25", want: []float64{0.5, 0.75, 1, 1.25, 1.5, 1.75, 2}},
		{spec: "0.1:0.3:0.1", want: []float64{0.1, 0.2, 0.3}},
		{spec: "1:1:1", want: []float64{1}},
		{spec: "1,2, 4", want: []float64{1, 2, 4}},
		{spec: "", err: true},
		{spec: "2:1:0.5", err: true},
		{spec: "0:1:0.5", err: true},
		{spec: "1:2:0", err: true},
		{spec: "1:2", err: true},
		{spec: "1,-1", err: true},
		{spec: "1:1e9:1e-9", err: true},
		// So many points that their count overflows int: an error, not a
		// negative count that panics in make.
		{spec: "1:1e300:1e-300", err: true},
		{spec: "0.5:1e308:1e-10", err: true},
		{spec: "a:b:c", err: true},
		// An infinite step gave the scale NaN (0*Inf), run as
		// -9.2e9 ("rate scale -9.223372036854776e+09 must be positive");
		// an infinite scale was refused only by sim.Config.
		{spec: "1:1:Inf", err: true},
		{spec: "1,Inf", err: true},
		// FROM rounded to 0: sim.Config ran it at its default scale, 1,
		// in a row labelled load 0.
		{spec: "1e-10:1:1", err: true},
		{spec: "1e-9:1e-9:1", want: []float64{1e-9}},
	}
	for _, tt := range tests {
		got, err := ParseSweep(tt.spec)
		if tt.err {
			if err == nil {
				t.Errorf("ParseSweep(%q): got %v, want an error", tt.spec, got)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseSweep(%q): got %v, %v, want %v", tt.spec, got, err, tt.want)
		}
	}
}

func FuzzParseSweep(f *testing.F) {
	f.Add("0.5:2:0.25")
	f.Add("1,2,3")
	f.Add("1:1e300:1e-300")
	f.Add("1:Inf:1")
	f.Fuzz(func(t *testing.T, spec string) {
		got, err := ParseSweep(spec)
		if err != nil {
			return
		}
		if len(got) == 0 || len(got) > maxSweep {
			t.Fatalf("ParseSweep(%q): %d points", spec, len(got))
		}
		for _, x := range got {
			if !(x > 0) || math.IsInf(x, 1) {
				t.Fatalf("ParseSweep(%q): non-positive scale %g", spec, x)
			}
		}
	})
}

// TestFleetStringWeights: the fleet's description names each group's
// endpoint weight when the weights are not all 1 (0 is 1), so that a run
// of weighted engines does not read as one of equal engines.
func TestFleetStringWeights(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fleet Fleet
		want  string
	}{
		{"no weights", Fleet{{Count: 2, Profile: "tiny"}, {Count: 1, Profile: "tiny", Role: "decode"}}, "2xtiny,1xtiny/decode"},
		{"all 1", Fleet{{Count: 2, Profile: "tiny", Weight: 1}, {Count: 1, Profile: "tiny"}}, "2xtiny,1xtiny"},
		{"one group weighted", Fleet{{Count: 2, Profile: "tiny", Weight: 3}, {Count: 1, Profile: "tiny"}}, "2xtiny weight 3,1xtiny weight 1"},
		{"roles", Fleet{{Count: 1, Profile: "tiny", Role: "prefill", Weight: 2}, {Count: 2, Profile: "tiny", Role: "decode", Weight: 5}},
			"1xtiny/prefill weight 2,2xtiny/decode weight 5"},
		{"all equal, not 1", Fleet{{Count: 4, Profile: "tiny", Weight: 7}}, "4xtiny weight 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.fleet.String(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	f, err := ParseFleetFile([]byte("engines:\n  - {count: 2, profile: tiny, weight: 2}\n  - {count: 1, profile: tiny}\n"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(t.Context(), Config{Fleet: f, Policy: "round_robin"}, smallChat(t, 3, 10, 1))
	if err != nil {
		t.Fatal(err)
	}
	if want := "2xtiny weight 2,1xtiny weight 1"; res.Fleet != want {
		t.Errorf("Result.Fleet: got %q, want %q", res.Fleet, want)
	}
}
