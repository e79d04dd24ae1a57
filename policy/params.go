package policy

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

// decodeParams copies params into the struct pointed to by dst. Each settable
// field is named by its `param:"name"` tag; fields without a tag are not
// parameters. Values may come from JSON (float64, json.Number), YAML (int,
// float64, bool, string) or Go callers (any numeric kind). Durations accept a
// Go duration string ("250ms") or a number of seconds. An unknown name or a
// value of the wrong type is an error naming the parameter and listing the
// known ones.
func decodeParams(policy string, params map[string]any, dst any) error {
	rv := reflect.ValueOf(dst).Elem()
	rt := rv.Type()
	fields := make(map[string]int, rt.NumField())
	for i := 0; i < rt.NumField(); i++ {
		if name := rt.Field(i).Tag.Get("param"); name != "" {
			fields[name] = i
		}
	}
	// Deterministic error order: sort the given names.
	names := make([]string, 0, len(params))
	for k := range params {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, name := range names {
		i, ok := fields[name]
		if !ok {
			known := make([]string, 0, len(fields))
			for k := range fields {
				known = append(known, k)
			}
			sort.Strings(known)
			if len(known) == 0 {
				return fmt.Errorf("policy %s: unknown param %q (the policy takes no params)", policy, name)
			}
			return fmt.Errorf("policy %s: unknown param %q (known: %s)", policy, name, strings.Join(known, ", "))
		}
		if err := setParam(rv.Field(i), params[name]); err != nil {
			return fmt.Errorf("policy %s: param %q: %w", policy, name, err)
		}
	}
	return nil
}

var durationType = reflect.TypeOf(time.Duration(0))

func setParam(f reflect.Value, v any) error {
	if f.Type() == durationType {
		switch x := v.(type) {
		case string:
			d, err := time.ParseDuration(x)
			if err != nil {
				return fmt.Errorf("want a duration, got %q", x)
			}
			f.SetInt(int64(d))
			return nil
		default:
			sec, ok := toFloat(v)
			if !ok {
				return fmt.Errorf("want a duration (\"250ms\" or seconds), got %T", v)
			}
			// A number of seconds past a Duration's range (or NaN, YAML's
			// .nan) converts to whatever the platform makes of it: on
			// amd64 the most negative Duration.
			if ns := sec * float64(time.Second); !(math.Abs(ns) < math.MaxInt64) {
				return fmt.Errorf("want a duration, got %v seconds", sec)
			}
			f.SetInt(int64(sec * float64(time.Second)))
			return nil
		}
	}
	switch f.Kind() {
	case reflect.Float64:
		x, ok := toFloat(v)
		if !ok || math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("want a number, got %s", describe(v))
		}
		f.SetFloat(x)
	case reflect.Int:
		x, ok := toFloat(v)
		if !ok || x != math.Trunc(x) || math.Abs(x) > 1<<53 {
			return fmt.Errorf("want an integer, got %s", describe(v))
		}
		f.SetInt(int64(x))
	case reflect.Bool:
		switch x := v.(type) {
		case bool:
			f.SetBool(x)
		case string:
			b, err := strconv.ParseBool(x)
			if err != nil {
				return fmt.Errorf("want a boolean, got %q", x)
			}
			f.SetBool(b)
		default:
			return fmt.Errorf("want a boolean, got %s", describe(v))
		}
	case reflect.String:
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("want a string, got %s", describe(v))
		}
		f.SetString(s)
	default:
		return fmt.Errorf("unsupported field kind %s", f.Kind())
	}
	return nil
}

func describe(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%T", v)
}

func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case float32:
		return float64(x), true
	case int:
		return float64(x), true
	case int8:
		return float64(x), true
	case int16:
		return float64(x), true
	case int32:
		return float64(x), true
	case int64:
		return float64(x), true
	case uint:
		return float64(x), true
	case uint8:
		return float64(x), true
	case uint16:
		return float64(x), true
	case uint32:
		return float64(x), true
	case uint64:
		return float64(x), true
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	case string:
		// Numbers given as strings (environment variables, flags) are accepted.
		f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
		return f, err == nil
	}
	return 0, false
}

// maxNumberParam bounds the number params of a score's terms (rates,
// weights, slacks): far above any real engine's, and low enough that no
// product of them with a load reaches +Inf, whose differences and whose
// products with zero are NaN (a NaN score ties with nothing: kv-aware's
// tie break had no candidate to draw from, and panicked).
const maxNumberParam = 1e9

// check returns an error naming the param when ok is false.
func check(policy, param string, ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf("policy %s: param %q: %s", policy, param, fmt.Sprintf(format, args...))
}
