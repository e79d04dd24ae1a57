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
	"time"

	"go.yaml.in/yaml/v3"
)

// Parse decodes a YAML configuration strictly (Decode), applies the
// defaults and validates it. A validation failure returns Errors, every
// invalid field at once.
func Parse(data []byte) (Config, error) {
	cfg, err := Decode(data)
	if err != nil {
		return cfg, err
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// Decode decodes a YAML configuration strictly (unknown fields are errors,
// as are more than one document, a number with a fraction for a
// whole-number field, an empty list entry and a ${VARIABLE}: the file is
// not expanded) and returns it as written: no defaults applied, not
// validated. A reload takes the file so (proxy.Proxy.Reload applies the
// defaults itself: an endpoint's signals settings left unset inherit the
// running model's, not the file's).
func Decode(data []byte) (Config, error) {
	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		if errors.Is(err, io.EOF) {
			if len(bytes.TrimSpace(data)) == 0 {
				return cfg, errors.New("the file is empty")
			}
			return cfg, errors.New("the file holds no settings (only comments or blank lines)")
		}
		return cfg, decodeError(err, data, bareZeros(data))
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
	return cfg, nil
}

// The YAML decoder's messages for a field the structs do not have and for
// a value of the wrong type, which name a Go type rather than the YAML.
var (
	unknownField = regexp.MustCompile(`^line (\d+): field (.*) not found in type \S+$`)
	wrongType    = regexp.MustCompile("^line (\\d+): cannot unmarshal (!!\\S+)(?: `(.*)`)? into (.+)$")
	// goStruct matches a named type of a package (config.Model, sim.Group):
	// a mapping in the file.
	goStruct = regexp.MustCompile(`^[a-z][a-z0-9]*\.[A-Z]\w*$`)
)

// durationSyntax is the form of a Go duration ("1h30m", "500ms", "-1.5s").
var durationSyntax = regexp.MustCompile(`^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)

// plainNumber is a number without a unit ("5", "0.5", "1e3").
var plainNumber = regexp.MustCompile(`^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$`)

// durationHint says why v is not a duration: a number without its unit
// ("5"), one out of range ("999999999h": time.ParseDuration's "invalid
// duration" too), or something else.
func durationHint(v string) string {
	switch {
	case v == "":
		return ` (a duration has a unit: "5s", "500ms")`
	case durationSyntax.MatchString(v):
		return " (out of range: a duration is at most 2562047h)"
	}
	if plainNumber.MatchString(v) {
		return ` (a duration has a unit: "5s", "500ms")`
	}
	return ` (a duration is a number with a unit: "5s", "500ms", "1h30m")`
}

// DecodeError turns the YAML decoder's type errors ("yaml: unmarshal
// errors:" and one indented line per error, naming Go types) into one
// line naming the fields by their paths, as validation errors do: "line 3:
// unknown field "modelz"; line 9: models[0].policy: cannot unmarshal
// !!str `least_r...` into a mapping". data is the document decoded. Other
// errors are returned as they are. The simulator's fleet files use it too.
func DecodeError(err error, data []byte) error {
	return decodeError(err, data, nil)
}

// bareZeros returns, by path, the refusal of each 0 written without a unit
// for a duration field tagged zero (timeouts.dial: 0), which the decoder
// refuses for its missing unit: "0s" would be refused next, for its
// default.
func bareZeros(data []byte) map[string]string {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil {
		return nil
	}
	var v validator
	checkNode(&v, &doc, reflect.TypeOf(Config{}), "", 0)
	zeros := map[string]string{}
	for _, e := range v.errs {
		if strings.HasPrefix(e.Msg, "0 is refused") {
			zeros[e.Path] = e.Msg
		}
	}
	return zeros
}

// decodeError is DecodeError, a wrong-type error at a path of zeros
// replaced by its message there.
func decodeError(err error, data []byte, zeros map[string]string) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	var doc yaml.Node
	var ss []site
	if yaml.Unmarshal(data, &doc) == nil {
		sites(&doc, "", &ss, 0)
	}
	// find returns the path of the first site not yet used that match
	// accepts, or "".
	used := make([]bool, len(ss))
	find := func(match func(site) bool) (string, bool) {
		for i, s := range ss {
			if !used[i] && match(s) {
				used[i] = true
				return s.path, true
			}
		}
		return "", false
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		if s := unknownField.FindStringSubmatch(m); s != nil {
			line, name := s[1], s[2]
			m = "line " + line + ": unknown field " + strconv.Quote(name)
			if p, ok := find(func(x site) bool { return x.key && strconv.Itoa(x.line) == line && x.value == name }); ok && p != "" {
				m += " in " + p
			}
		} else if s := wrongType.FindStringSubmatch(m); s != nil {
			line, tag, val, into := s[1], s[2], s[3], s[4]
			prefix, cut := strings.CutSuffix(val, "...")
			full := val // the value, which the decoder cuts after 7 characters
			p, ok := find(func(x site) bool {
				if !x.key && strconv.Itoa(x.line) == line && x.tag == tag &&
					(x.value == val || cut && strings.HasPrefix(x.value, prefix)) {
					full = x.value
					return true
				}
				return false
			})
			switch {
			case goStruct.MatchString(into) && into != "time.Duration", strings.HasPrefix(into, "map["):
				into = "a mapping"
			case strings.HasPrefix(into, "[]"):
				into = "a list"
			}
			m = "line " + line + ": "
			if ok && p != "" {
				m += p + ": "
			}
			if z, isZero := zeros[p]; ok && isZero && into == "time.Duration" {
				msgs[i] = m + z
				continue
			}
			m += "cannot unmarshal " + tag
			if s[3] != "" || strings.Contains(te.Errors[i], "`") {
				m += " `" + val + "`"
			}
			m += " into " + into
			if into == "time.Duration" {
				m += durationHint(full)
			}
		}
		msgs[i] = m
	}
	return errors.New(strings.Join(msgs, "; "))
}

// site is a key or value of the YAML document, for DecodeError: its line,
// its path (a key's is its mapping's), tag and text.
type site struct {
	line       int
	path       string
	tag, value string
	key        bool
}

// sites appends n's keys and values below path to ss, in document order.
// Aliases are not followed; depth bounds the walk.
func sites(n *yaml.Node, path string, ss *[]site, depth int) {
	if depth > 1000 {
		return
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			sites(c, path, ss, depth+1)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := joinPath(path, k.Value)
			*ss = append(*ss, site{line: k.Line, path: path, value: k.Value, key: true},
				site{line: v.Line, path: p, tag: v.ShortTag(), value: v.Value})
			sites(v, p, ss, depth+1)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			*ss = append(*ss, site{line: c.Line, path: p, tag: c.ShortTag(), value: c.Value})
			sites(c, p, ss, depth+1)
		}
	}
}

// envReference matches a string that names an environment variable, as
// a shell or envsubst would expand it: ${NAME} anywhere, or the whole
// value $NAME in capitals.
var envReference = regexp.MustCompile(`\$\{[A-Za-z_][A-Za-z0-9_]*\}|^\$[A-Z_][A-Z0-9_]*$`)

// checkNode reports, under path, what the YAML decoder would take from
// node n, decoded into a value of type t, without an error but without
// keeping it: a number with a fraction for a whole-number field (it
// truncates it: weight 0.5 became 0, then the default 1) or a float out
// of its range (seed -1.0 became 18446744073709551615, max_body_bytes
// -.inf the most negative int64), and an empty
// list entry ("-" with nothing after it: dropped, and the entries after it
// moved up, so that errors named the wrong index); and a string that names
// an environment variable, which the file does not expand (an admin token
// ${KVROUTE_ADMIN_TOKEN} was that text). depth bounds the walk through
// aliases.
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
				if hint := f.Tag.Get("zero"); hint != "" {
					checkZero(v, n.Content[i+1], f.Type, joinPath(path, n.Content[i].Value), hint)
				}
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
	case reflect.String:
		if n.Kind == yaml.ScalarNode && envReference.MatchString(n.Value) {
			v.addf(path, "%q names an environment variable, but the file is not expanded: write the value itself", n.Value)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!float" {
			return
		}
		var f float64
		if err := n.Decode(&f); err != nil {
			return
		}
		// The decoder converts a whole float with Go's conversion, whose
		// result out of the type's range is the platform's (amd64: -1.0
		// into a uint64 is its largest value, -.inf into an int64 its
		// most negative), so the range is checked here.
		var min, max float64 // the type's range: [min, max)
		if k := t.Kind(); k >= reflect.Uint && k <= reflect.Uint64 {
			max = math.Ldexp(1, t.Bits())
		} else {
			min, max = -math.Ldexp(1, t.Bits()-1), math.Ldexp(1, t.Bits()-1)
		}
		switch {
		case math.IsNaN(f) || math.IsInf(f, 0):
			v.addf(path, "%s is not a finite number", n.Value)
		case f != math.Trunc(f):
			v.addf(path, "%s is not a whole number", n.Value)
		case f < min || f >= max:
			v.addf(path, "%s is out of range", n.Value)
		}
	}
}

// checkZero reports a 0 written for a field tagged zero:"<hint>": a field
// whose default replaces 0, where 0 would be read as none or as no limit
// (an endpoint's weight of 0 became 1, a full share; timeouts.shutdown 0s,
// no drain, became 30s), and the hint says what to write instead. A 0 is
// a number that is zero (0, 0.0, -0), for a duration of type t a duration
// that is ("0s", "0", "0ms", "-0h"), and for a string the empty string
// (router.session.header: "" became X-Session-Id). Aliases are followed.
func checkZero(v *validator, n *yaml.Node, t reflect.Type, path, hint string) {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		return
	}
	if t.Kind() == reflect.String {
		if n.Value == "" {
			v.addf(path, `"" is refused (unset, the field takes its default, not ""): %s`, hint)
		}
		return
	}
	zero := false
	if t == durationType {
		d, err := time.ParseDuration(strings.TrimSpace(n.Value))
		zero = err == nil && d == 0
	}
	var x float64
	if !zero && n.Decode(&x) == nil && x == 0 {
		zero = true
	}
	if zero {
		v.addf(path, "%s is refused (unset, the field takes its default, not 0): %s", zeroText(n.Value), hint)
	}
}

// zeroText is how a refused zero is named: 0, or a duration as written
// ("0s").
func zeroText(s string) string {
	if _, err := time.ParseDuration(s); err == nil && strings.ContainsAny(s, "nsuµμmh") {
		return strconv.Quote(s)
	}
	return "0"
}

var durationType = reflect.TypeOf(time.Duration(0))

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
