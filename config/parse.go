package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Parse decodes a YAML configuration strictly (unknown fields are errors,
// as are more than one document, a number with a fraction for a
// whole-number field and an empty list entry), applies the defaults and
// validates it. A validation failure returns Errors, every invalid field
// at once.
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
	// What the decoder takes without a word but does not keep.
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err == nil {
		var v validator
		checkNode(&v, &doc, reflect.TypeOf(cfg), "", 0)
		if len(v.errs) > 0 {
			return cfg, v.errs
		}
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

// checkNode reports, under path, what the YAML decoder would take from
// node n, decoded into a value of type t, without an error but without
// keeping it: a number with a fraction for a whole-number field (it
// truncates it: weight 0.5 became 0, then the default 1) and an empty
// list entry ("-" with nothing after it: dropped, and the entries after it
// moved up, so that errors named the wrong index). depth bounds the walk
// through aliases.
func checkNode(v *validator, n *yaml.Node, t reflect.Type, path string, depth int) {
	if depth > 100 {
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			checkNode(v, c, t, path, depth+1)
		}
		return
	case yaml.AliasNode:
		if n.Alias != nil {
			checkNode(v, n.Alias, t, path, depth+1)
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if f, ok := yamlField(t, n.Content[i].Value); ok {
				checkNode(v, n.Content[i+1], f.Type, joinPath(path, n.Content[i].Value), depth+1)
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			checkNode(v, n.Content[i+1], t.Elem(), joinPath(path, n.Content[i].Value), depth+1)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return
		}
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			switch t.Elem().Kind() {
			case reflect.Interface, reflect.Pointer, reflect.Map, reflect.Slice: // a null entry is kept
			default:
				if c.Kind == yaml.ScalarNode && c.ShortTag() == "!!null" {
					v.addf(p, "is an empty list entry (a \"-\" with nothing after it): remove it, or give its fields")
					continue
				}
			}
			checkNode(v, c, t.Elem(), p, depth+1)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!float" {
			return
		}
		var f float64
		if err := n.Decode(&f); err == nil && f != math.Trunc(f) {
			v.addf(path, "%s is not a whole number", n.Value)
		}
	}
}

// yamlField returns the field of struct type t that YAML key name decodes
// into.
func yamlField(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "" {
			tag = strings.ToLower(f.Name)
		}
		if tag == name && f.IsExported() {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
