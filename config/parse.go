package config

import (
	"bytes"
	"errors"
	"io"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Parse decodes a YAML configuration strictly (unknown fields are errors,
// as is more than one document), applies the defaults and validates it. A
// validation failure returns Errors, every invalid field at once.
func Parse(data []byte) (Config, error) {
	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		if errors.Is(err, io.EOF) {
			return cfg, errors.New("the file is empty")
		}
		return cfg, decodeError(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return cfg, errors.New("the file holds more than one YAML document")
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// unknownField matches the YAML decoder's message for a field the
// structs do not have, which names a Go type rather than the YAML.
var unknownField = regexp.MustCompile(`^(line \d+): field (.*) not found in type \S+$`)

// decodeError turns the YAML decoder's type errors ("yaml: unmarshal
// errors:" and one indented line per error, naming Go types) into one
// line: "line 3: unknown field "modelz"; line 9: cannot unmarshal ...".
func decodeError(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		if s := unknownField.FindStringSubmatch(m); s != nil {
			m = s[1] + ": unknown field " + strconv.Quote(s[2])
		} else if strings.HasSuffix(m, " into time.Duration") {
			m += ` (a duration has a unit: "5s", "500ms")`
		}
		msgs[i] = m
	}
	return errors.New(strings.Join(msgs, "; "))
}
