package emulator

import (
	"math"
	"strings"
	"testing"
)

// TestConfigRejectsNonFiniteFloats: New refuses a Speed, FabricGbps or
// EOSMean that is NaN or infinite (a NaN Speed passed "< 0" and hung every
// request after its first token), naming the field.
func TestConfigRejectsNonFiniteFloats(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"speed NaN", Config{Speed: nan}, "Speed NaN"},
		{"speed +Inf", Config{Speed: inf}, "Speed +Inf"},
		{"speed -Inf", Config{Speed: -inf}, "Speed -Inf"},
		{"speed negative", Config{Speed: -2}, "Speed -2"},
		{"speed tiny", Config{Speed: 1e-300}, "Speed 1e-300 is below 0.001"},
		{"fabric NaN", Config{FabricGbps: nan}, "FabricGbps NaN"},
		{"fabric +Inf", Config{FabricGbps: inf}, "FabricGbps +Inf"},
		{"eos NaN", Config{EOSMean: nan}, "EOSMean NaN"},
		{"eos +Inf", Config{EOSMean: inf}, "EOSMean +Inf"},
		{"max logprobs -2", Config{MaxLogprobs: -2}, "MaxLogprobs -2 must be -1 or positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Model = "tiny"
			tt.cfg.Engine = tinyEngine(t)
			s, err := New(tt.cfg)
			if err == nil {
				s.Close()
				t.Fatalf("New: got no error, want one naming %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: got %v, want an error naming %q", err, tt.want)
			}
		})
	}
}
