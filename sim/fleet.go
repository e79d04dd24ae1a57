package sim

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/engine"
)

// Group is a set of identical engines in a simulated fleet.
type Group struct {
	// Count is the number of engines in the group; at least 1.
	Count int `yaml:"count" json:"count"`
	// Profile names an engine profile (see engine.ProfileNames). With Spec
	// set it only labels the group (default Spec.Name).
	Profile string `yaml:"profile" json:"profile"`
	// Spec, when set, is the engine profile itself instead of a built-in
	// one looked up by name, e.g. a model from a HuggingFace config.json
	// (engine.ProfileFromHFConfig). Not read from fleet files.
	Spec *engine.Profile `yaml:"-" json:"-"`
	// NumGPUBlocks overrides the profile's KV-cache size in blocks; 0 keeps it.
	NumGPUBlocks int `yaml:"num_gpu_blocks,omitempty" json:"num_gpu_blocks,omitempty"`
	// MaxNumSeqs overrides the profile's batch limit; 0 keeps it.
	MaxNumSeqs int `yaml:"max_num_seqs,omitempty" json:"max_num_seqs,omitempty"`
	// MaxNumBatchedTokens overrides the profile's per-step token budget; 0 keeps it.
	MaxNumBatchedTokens int `yaml:"max_num_batched_tokens,omitempty" json:"max_num_batched_tokens,omitempty"`
	// Speed scales the engine's step times (2 = twice as fast); 0 means 1
	// (a fleet file may not write 0).
	Speed float64 `yaml:"speed,omitempty" json:"speed,omitempty"`
	// Role is both (default), prefill or decode: a fleet with prefill or
	// decode engines runs disaggregated (Config.PD).
	Role string `yaml:"role,omitempty" json:"role,omitempty"`
	// Weight is each engine's endpoint weight (kvroute.Endpoint.Weight),
	// its share of the load under the policies that honour weights, 1 to
	// kvroute.MaxWeight; 0 means 1. It says nothing of the engine's speed
	// (Speed, Profile do). A fleet file may not write 0 (its writer meant
	// no share, not a full one).
	Weight int `yaml:"weight,omitempty" json:"weight,omitempty"`
	// Adapters, when set, are the only LoRA adapters
	// (workload.Request.Adapter) the group's engines serve
	// (kvroute.Endpoint.Adapters): the router offers a request for
	// another adapter to the other engines only, and rejects it (503) when
	// none serves it. Empty: every adapter.
	Adapters []string `yaml:"adapters,omitempty" json:"adapters,omitempty"`
}

// Fleet is the engines of a simulated model pool, in order; engine i of the
// fleet is named e<i> (e0, e1, ...).
type Fleet []Group

// Size returns the number of engines.
func (f Fleet) Size() int {
	n := 0
	for _, g := range f {
		n += g.Count
	}
	return n
}

// String renders the fleet in the form ParseFleet reads, e.g.
// "4xllama-3.1-8b-h100,2xqwen2.5-7b-h100", and, when the groups' weights
// are not all 1, every group's weight after it, e.g.
// "4xllama-3.1-8b-h100 weight 2,2xqwen2.5-7b-h100 weight 1" (only a fleet
// file sets weights: ParseFleet does not read them).
func (f Fleet) String() string {
	weighted := false
	for _, g := range f {
		weighted = weighted || max(g.Weight, 1) != 1
	}
	parts := make([]string, len(f))
	for i, g := range f {
		parts[i] = fmt.Sprintf("%dx%s", g.Count, g.name())
		if g.Role != "" && g.Role != "both" {
			parts[i] += "/" + g.Role
		}
		if weighted {
			parts[i] += " weight " + strconv.Itoa(max(g.Weight, 1))
		}
	}
	return strings.Join(parts, ",")
}

// name is the group's profile name: Profile, else Spec's name.
func (g *Group) name() string {
	if g.Profile == "" && g.Spec != nil {
		return g.Spec.Name
	}
	return g.Profile
}

// profile resolves the group's engine profile: Spec, else the built-in
// profile named Profile.
func (g *Group) profile() (engine.Profile, error) {
	if g.Spec != nil {
		p := *g.Spec
		if p.Name == "" {
			p.Name = g.Profile
		}
		return p, nil
	}
	return engine.LookupProfile(g.Profile)
}

// Validate checks counts and that a profile is named (or given) for every
// group.
func (f Fleet) Validate() error {
	if len(f) == 0 {
		return errors.New("fleet: no engines")
	}
	for i := range f {
		g := &f[i]
		switch {
		case g.Count < 1:
			return fmt.Errorf("fleet: group %d (%s): count %d must be at least 1", i, g.name(), g.Count)
		case g.Count > maxEngines:
			// Checked per group first: a sum of huge counts wraps around.
			return fmt.Errorf("fleet: group %d (%s): %d engines is more than the limit of %d", i, g.name(), g.Count, maxEngines)
		case g.Profile == "" && g.Spec == nil:
			return fmt.Errorf("fleet: group %d: profile is empty", i)
		case g.NumGPUBlocks < 0, g.MaxNumSeqs < 0, g.MaxNumBatchedTokens < 0:
			return fmt.Errorf("fleet: group %d (%s): overrides must not be negative", i, g.name())
		case g.NumGPUBlocks > engine.MaxNumGPUBlocks:
			return fmt.Errorf("fleet: group %d (%s): num_gpu_blocks %d is above the limit of %d", i, g.name(), g.NumGPUBlocks, engine.MaxNumGPUBlocks)
		case g.Speed < 0:
			return fmt.Errorf("fleet: group %d (%s): speed %g must not be negative", i, g.name(), g.Speed)
		case g.Weight < 0 || g.Weight > kvroute.MaxWeight:
			return fmt.Errorf("fleet: group %d (%s): weight %d is not in 1..%d (0: 1)", i, g.name(), g.Weight, kvroute.MaxWeight)
		}
		if _, err := kvroute.ParseRole(g.Role); err != nil {
			return fmt.Errorf("fleet: group %d (%s): %w", i, g.name(), err)
		}
		if slices.Contains(g.Adapters, "") {
			return fmt.Errorf("fleet: group %d (%s): an adapter name is empty", i, g.name())
		}
	}
	if f.prefillOnly() {
		return errors.New("fleet: every engine is a prefill engine: a disaggregated fleet needs decode (or both) engines to generate the output")
	}
	if n := f.Size(); n > maxEngines {
		return fmt.Errorf("fleet: %d engines is more than the limit of %d", n, maxEngines)
	}
	return nil
}

// prefillOnly reports whether every engine has the prefill role: no engine
// could run a request's decode, so every request would fail.
func (f Fleet) prefillOnly() bool {
	for _, g := range f {
		if r, _ := kvroute.ParseRole(g.Role); r != kvroute.RolePrefill {
			return false
		}
	}
	return len(f) > 0
}

// maxEngines bounds a fleet so that a typo (--engines 80000) fails fast.
const maxEngines = 4096

// ParseFleet reads the --engines flag: either a count ("8", every engine with
// defaultProfile) or a comma-separated list of groups COUNTxPROFILE, PROFILE
// (one engine) or COUNT (engines with defaultProfile), e.g.
// "4xllama-3.1-8b-h100,4xqwen2.5-7b-h100". A group may end in /ROLE
// (prefill, decode or both), e.g.
// "4xllama-3.1-8b-h100/prefill,4xllama-3.1-8b-h100/decode" or, with
// defaultProfile, "4/prefill,4/decode" (see PDConfig).
func ParseFleet(spec, defaultProfile string) (Fleet, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, errors.New("parse fleet: empty engine list")
	}
	if n, err := strconv.Atoi(spec); err == nil {
		if defaultProfile == "" {
			return nil, errors.New("parse fleet: an engine count needs a profile")
		}
		f := Fleet{{Count: n, Profile: defaultProfile}}
		if err := f.Validate(); err != nil {
			return nil, fmt.Errorf("parse fleet %q: %w", spec, err)
		}
		return f, nil
	}
	var f Fleet
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		role := ""
		if i := strings.LastIndexByte(part, '/'); i > 0 {
			part, role = strings.TrimSpace(part[:i]), strings.TrimSpace(part[i+1:])
		}
		g := Group{Count: 1, Profile: part, Role: role}
		if n, err := strconv.Atoi(part); err == nil {
			// A bare count: that many engines of the default profile.
			if defaultProfile == "" {
				return nil, fmt.Errorf("parse fleet %q: group %q: an engine count needs a profile", spec, part)
			}
			g = Group{Count: n, Profile: defaultProfile, Role: role}
		} else if i := strings.IndexByte(part, 'x'); i > 0 {
			if n, err := strconv.Atoi(part[:i]); err == nil {
				g = Group{Count: n, Profile: strings.TrimSpace(part[i+1:]), Role: role}
			}
		}
		f = append(f, g)
	}
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("parse fleet %q: %w", spec, err)
	}
	return f, nil
}

// fleetFile is the YAML (or JSON) layout of a fleet file:
//
//	engines:
//	  - {count: 4, profile: llama-3.1-8b-h100}
//	  - {count: 2, profile: llama-3.1-8b-h100, num_gpu_blocks: 8000, speed: 0.5, weight: 2}
type fleetFile struct {
	Engines Fleet `yaml:"engines"`
}

// ParseFleetFile parses a fleet file's contents. Unknown keys are errors.
func ParseFleetFile(data []byte) (Fleet, error) {
	var ff fleetFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&ff); err != nil {
		return nil, fmt.Errorf("parse fleet file: %w", config.DecodeError(err, data))
	}
	if err := ff.Engines.Validate(); err != nil {
		return nil, fmt.Errorf("parse fleet file: %w", err)
	}
	if err := checkWrittenZeros(data); err != nil {
		return nil, fmt.Errorf("parse fleet file: %w", err)
	}
	return ff.Engines, nil
}

// writtenZero lists the fleet file's keys whose zero value is a default
// (Group: 0 means 1) that a 0 written in the file would silently take: a
// weight of 0 meant to send a group nothing got a full share, and a speed
// of 0 ran the group at full speed.
var writtenZero = map[string]string{
	"weight": fmt.Sprintf("0 is not a weight (1 to %d, default 1): to send a group nothing, leave it out of the fleet", kvroute.MaxWeight),
	"speed":  "0 is not a speed (positive, default 1: the profile's own)",
}

// checkWrittenZeros reports a group key of writtenZero written as 0 in a
// fleet file that decoded (so its layout is engines: [mapping, ...]).
func checkWrittenZeros(data []byte) error {
	var doc struct {
		Engines []map[string]yaml.Node `yaml:"engines"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil // decoded once already: cannot happen
	}
	for i, g := range doc.Engines {
		for _, key := range []string{"weight", "speed"} {
			n, ok := g[key]
			var v float64
			if ok && n.Kind == yaml.ScalarNode && n.ShortTag() != "!!null" && n.Decode(&v) == nil && v == 0 {
				return fmt.Errorf("line %d: engines[%d].%s: %s", n.Line, i, key, writtenZero[key])
			}
		}
	}
	return nil
}

// LoadFleetFile reads and parses a fleet file.
func LoadFleetFile(path string) (Fleet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load fleet: %w", err)
	}
	return ParseFleetFile(data)
}

// ParseSweep reads a rate-scale sweep FROM:TO:STEP (e.g. 0.5:2:0.25, both
// ends included) or a comma-separated list of scales (0.5,1,2).
// sweepRound is the precision of a FROM:TO:STEP sweep's points.
const sweepRound = 1e-9

func ParseSweep(spec string) ([]float64, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, errors.New("parse sweep: empty")
	}
	if strings.Contains(spec, ":") {
		p := strings.Split(spec, ":")
		if len(p) != 3 {
			return nil, fmt.Errorf("parse sweep %q: want FROM:TO:STEP", spec)
		}
		var v [3]float64
		for i, s := range p {
			x, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
			if err != nil {
				return nil, fmt.Errorf("parse sweep %q: %w", spec, err)
			}
			if math.IsInf(x, 0) {
				// An infinite step made 0*Inf, a NaN scale.
				return nil, fmt.Errorf("parse sweep %q: %s is not finite", spec, strings.TrimSpace(s))
			}
			v[i] = x
		}
		from, to, step := v[0], v[1], v[2]
		if !(from > 0) || !(to >= from) || !(step > 0) {
			return nil, fmt.Errorf("parse sweep %q: want 0 < FROM <= TO and STEP > 0", spec)
		}
		if from < sweepRound {
			// Rounded, it would be scale 0: sim.Config's default, 1.
			return nil, fmt.Errorf("parse sweep %q: FROM %g is below %g (the points are rounded to it)", spec, from, sweepRound)
		}
		// Count in floating point first: a count too large for an int
		// converts to a negative one.
		steps := (to-from)/step + 1e-9
		if !(steps < maxSweep) {
			return nil, fmt.Errorf("parse sweep %q: %.4g points is more than %d", spec, math.Floor(steps)+1, maxSweep)
		}
		n := int(steps) + 1
		out := make([]float64, n)
		for i := range out {
			// Round to 1e-9 so 0.1 steps print as 0.3, not 0.30000000000000004.
			out[i] = roundTo(from+float64(i)*step, 1/sweepRound)
		}
		return out, nil
	}
	var out []float64
	for _, s := range strings.Split(spec, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return nil, fmt.Errorf("parse sweep %q: %w", spec, err)
		}
		if !(x > 0) || math.IsInf(x, 1) {
			return nil, fmt.Errorf("parse sweep %q: scale %g must be positive and finite", spec, x)
		}
		out = append(out, x)
	}
	if len(out) > maxSweep {
		return nil, fmt.Errorf("parse sweep %q: %d points is more than %d", spec, len(out), maxSweep)
	}
	return out, nil
}

const maxSweep = 1000

func roundTo(x, scale float64) float64 {
	if x*scale > 1<<52 {
		return x
	}
	r := x * scale
	if r < 0 {
		r -= 0.5
	} else {
		r += 0.5
	}
	return float64(int64(r)) / scale
}
