package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kvroute/kvroute/engine"
)

// hfModel is the --hf-config, --gpu, --tp and --dtype flags that engine,
// sim and plan share: a profile built from a HuggingFace config.json
// instead of a built-in one.
type hfModel struct {
	config, gpu, dtype string
	tp                 int
}

// register adds the flags to fs; what says what the config models.
func (m *hfModel) register(fs *flag.FlagSet, what string) {
	fs.StringVar(&m.config, "hf-config", "", "HuggingFace config.json `file`: "+what)
	fs.StringVar(&m.gpu, "gpu", "h100", "with --hf-config: GPU type (h100, h200, a100, l40s)")
	fs.IntVar(&m.tp, "tp", 1, "with --hf-config: tensor-parallel GPUs per engine")
	fs.StringVar(&m.dtype, "dtype", "", "with --hf-config: weight and KV dtype (bfloat16, fp8, ...; default the config's)")
}

// profile builds the profile; ok is false without --hf-config. Either
// failure (a file that cannot be read, a config that makes no profile) is
// the flag's.
func (m *hfModel) profile() (p engine.Profile, ok bool, err error) {
	if m.config == "" {
		return p, false, nil
	}
	data, err := os.ReadFile(m.config)
	if err != nil {
		return p, true, err
	}
	if p, err = engine.ProfileFromHFConfig(data, m.gpu, m.tp, m.dtype); err != nil {
		return p, true, fmt.Errorf("model %s: %w", m.config, err)
	}
	return p, true, nil
}
