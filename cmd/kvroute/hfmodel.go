package main

import (
	"errors"
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
	fs                 *flag.FlagSet // the flags were registered on, to see which were given
}

// register adds the flags to fs; what says what the config models.
func (m *hfModel) register(fs *flag.FlagSet, what string) {
	m.fs = fs
	fs.StringVar(&m.config, "hf-config", "", "HuggingFace config.json `file`: "+what)
	fs.StringVar(&m.gpu, "gpu", "h100", "with --hf-config: GPU type (h100, h200, a100, l40s)")
	fs.IntVar(&m.tp, "tp", 1, "with --hf-config: tensor-parallel GPUs per engine")
	fs.StringVar(&m.dtype, "dtype", "", "with --hf-config: weight and KV dtype (bfloat16, fp8, ...; default the config's)")
}

// hfFlagError is a profile error that names its flags itself (--gpu
// without --hf-config, --profile with it); hfUsage prints it as it is.
type hfFlagError string

func (e hfFlagError) Error() string { return string(e) }

// hfUsage is the usage message of a profile error: one of the flags'
// (hfFlagError) as it is, one of the file's after "--hf-config: ".
func hfUsage(err error) string {
	var fe hfFlagError
	if errors.As(err, &fe) {
		return fe.Error()
	}
	return "--hf-config: " + err.Error()
}

// profile builds the profile; ok is false without --hf-config. Either
// failure (a file that cannot be read, a config that makes no profile) is
// the flag's, and so are --gpu, --tp or --dtype without it (they would be
// ignored) and --profile with it (one of them would be).
func (m *hfModel) profile() (p engine.Profile, ok bool, err error) {
	given := func(name string) bool { return m.fs != nil && m.fs.Lookup(name) != nil && flagSet(m.fs, name) }
	if m.config == "" {
		for _, name := range []string{"gpu", "tp", "dtype"} {
			if given(name) {
				return p, false, hfFlagError(fmt.Sprintf("--%s applies to --hf-config, which is not given (a built-in --profile has its own GPU, TP and dtype)", name))
			}
		}
		return p, false, nil
	}
	if given("profile") {
		return p, true, hfFlagError("give --profile or --hf-config, not both")
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
