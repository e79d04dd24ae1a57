package tokenizer

import (
	"errors"
	"maps"
	"slices"

	"github.com/ardanlabs/jinja"
)

// jinja2's namespace() makes a Namespace, an object whose attributes a
// template sets with {% set ns.x = ... %}: not a mapping (ns is mapping is
// false, ns|items, ns|list, ns|tojson, 'x' in ns, ns.keys() and iterating
// it are errors), written by str() as <Namespace {'x': 1}>, equal only to
// itself; ns.x and ns['x'] read an attribute. The Go engine's namespace()
// makes a dict, a mapping in all those ways. So a template that calls
// namespace gets this package's (pyNamespace), which makes a dict marked
// as a namespace (isNamespace), and the Python-exact tests, filters,
// methods and comparisons tell it from a mapping as jinja2 does. For the
// rest the Go engine takes it for the dict it is: an empty namespace is
// false in an if (true in Python), and the Go engine's other filters
// (length, first, map, dictsort, ...) take it for a mapping (errors in
// Python).
//
// Iterating a value that is not iterable is Python's TypeError too,
// which the Go engine takes as an empty loop (None, a number, a boolean,
// a namespace): pyCompares rewrites a for loop's iterable through
// iterName, which raises it. And jinja2 refuses an attribute assignment
// to anything but a namespace ({% set d.x = 1 %} on a dict), where the Go
// engine sets the dict's key: pyCompares rewrites the value of such an
// assignment through setAttrName, which refuses it.

// namespaceMark is the key, in a dict's Data and not in its Keys, that
// marks the dict as a namespace: the Go engine reads a dict's keys from
// Keys, so it never sees it.
const namespaceMark = "\x00kvroute namespace"

// isNamespace reports whether v is a namespace pyNamespace made.
func isNamespace(v jinja.Value) bool {
	if !v.IsDict() {
		return false
	}
	_, ok := v.AsDict().Data[namespaceMark]
	return ok
}

// The names of the filters and the global pyNamespace, iterable and
// setAttr are passed as.
const (
	namespaceName = "namespace"
	iterName      = "kvroute_iter"
	setAttrName   = "kvroute_setattr"
)

// namespaceVars are the values a template that calls namespace or
// iterates or sets an attribute gets (see usedFilters), by name.
var namespaceVars = map[string]jinja.Value{
	namespaceName: jinja.NewCallable(namespaceName, pyNamespace),
	iterName:      jinja.NewCallable(iterName, pyIterable),
	setAttrName:   jinja.NewCallable(setAttrName, pySetAttr),
}

// pyNamespace is jinja2's namespace(*args, **kwargs): the attributes of
// dict(*args, **kwargs), a mapping's items or a list of [name, value]
// pairs, then the keyword arguments (in name order: the Go engine passes
// them as a map, where Python keeps their order, which only str() of the
// namespace shows).
func pyNamespace(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	ns := jinja.NewDict()
	d := ns.AsDict()
	switch {
	case len(args) > 1:
		return jinja.Undefined(), errors.New("namespace: dict expected at most 1 argument")
	case len(args) == 0, args[0].IsUndefined():
	case args[0].IsDict() && !isNamespace(args[0]):
		src := args[0].AsDict()
		for _, k := range src.Keys {
			d.Set(k, src.Data[k])
		}
	case args[0].IsList():
		for _, it := range args[0].AsList().Items {
			if !it.IsList() || it.AsList().Len() != 2 || !it.AsList().Items[0].IsString() {
				return jinja.Undefined(), errors.New("namespace: dictionary update sequence element is not a pair of a name and a value")
			}
			d.Set(it.AsList().Items[0].AsString(), it.AsList().Items[1])
		}
	default:
		return jinja.Undefined(), errors.New("namespace: '" + pyTypeName(args[0]) + "' object is not iterable")
	}
	for _, k := range slices.Sorted(maps.Keys(kwargs)) {
		d.Set(k, kwargs[k])
	}
	d.Data[namespaceMark] = jinja.NewBool(true)
	return ns, nil
}

// pyIterable is a for loop's iterable as jinja2 takes it: an error for a
// value Python cannot iterate (None, a number, a boolean, a namespace, a
// callable), the value itself otherwise (a string, a list, a dict, which
// the Go engine iterates as Python does, and an undefined value, which
// iterates as empty in both).
func pyIterable(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 || len(kwargs) > 0 {
		return jinja.Undefined(), errors.New("for: malformed iterable")
	}
	if v := args[0]; !iterable(v) {
		return jinja.Undefined(), errors.New("for: '" + pyTypeName(v) + "' object is not iterable")
	}
	return args[0], nil
}

// iterable reports whether Python can iterate v (an undefined value
// iterates as empty in jinja2).
func iterable(v jinja.Value) bool {
	return v.IsString() || v.IsList() || v.IsUndefined() || v.IsDict() && !isNamespace(v)
}

// pySetAttr is the value of {% set obj.attr = value %} (args: value, obj)
// as jinja2 assigns it: the value when obj is a namespace, jinja2's error
// otherwise.
func pySetAttr(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 2 || len(kwargs) > 0 {
		return jinja.Undefined(), errors.New("set: malformed attribute assignment")
	}
	if !isNamespace(args[1]) {
		return jinja.Undefined(), errors.New("set: cannot assign attribute on non-namespace object")
	}
	return args[0], nil
}

// pyItemsFilter is jinja2's items filter: a mapping's (key, value) pairs,
// nothing for an undefined value, an error for anything else (a
// namespace too).
var pyItemsFilter = jinja.NewCallable(filterPrefix+"items", func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 || len(kwargs) > 0 {
		return jinja.Undefined(), errors.New("items: takes no arguments")
	}
	switch v := args[0]; {
	case v.IsUndefined():
		return jinja.NewList(nil), nil
	case v.IsDict() && !isNamespace(v):
		return dictItems(v.AsDict()), nil
	}
	return jinja.Undefined(), errors.New("items: Can only get item pairs from a mapping.")
})

// dictItems is d's (key, value) pairs, each a list of two.
func dictItems(d *jinja.Dict) jinja.Value {
	items := make([]jinja.Value, len(d.Keys))
	for i, k := range d.Keys {
		items[i] = jinja.NewList([]jinja.Value{jinja.NewString(k), d.Data[k]})
	}
	return jinja.NewList(items)
}

// dictKeys is d's keys.
func dictKeys(d *jinja.Dict) jinja.Value {
	items := make([]jinja.Value, len(d.Keys))
	for i, k := range d.Keys {
		items[i] = jinja.NewString(k)
	}
	return jinja.NewList(items)
}

// pyListFilter is jinja2's list filter, Python's list(value): a string's
// characters, a list's items, a dict's keys, nothing for an undefined
// value, an error for what Python cannot iterate (None, a number, a
// boolean, a namespace).
var pyListFilter = jinja.NewCallable(filterPrefix+"list", func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 || len(kwargs) > 0 {
		return jinja.Undefined(), errors.New("list: takes no arguments")
	}
	switch v := args[0]; {
	case v.IsUndefined():
		return jinja.NewList(nil), nil
	case v.IsString():
		var items []jinja.Value
		for _, r := range v.AsString() {
			items = append(items, jinja.NewString(string(r)))
		}
		return jinja.NewList(items), nil
	case v.IsList():
		return jinja.NewList(slices.Clone(v.AsList().Items)), nil
	case v.IsDict() && !isNamespace(v):
		return dictKeys(v.AsDict()), nil
	default:
		return jinja.Undefined(), errors.New("list: '" + pyTypeName(v) + "' object is not iterable")
	}
})

// dictSelf is the dict a rewritten dict method is called on (the
// filter's first argument): jinja2's error for a namespace, which has no
// such method, and for anything else.
func dictSelf(method string, args []jinja.Value) (*jinja.Dict, error) {
	switch {
	case len(args) == 0 || !args[0].IsDict():
		return nil, errors.New("'" + method + "': no such method of that value (not a dict)")
	case isNamespace(args[0]):
		return nil, errors.New("'jinja2.utils.Namespace object' has no attribute '" + method + "'")
	}
	return args[0].AsDict(), nil
}

// pyDictView is Python's dict.keys(), values() or items() (which view
// returns): a list of them.
func pyDictView(method string, view func(*jinja.Dict) jinja.Value) jinja.Value {
	return jinja.NewCallable("kvroute_"+method, func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		d, err := dictSelf(method, args)
		if err != nil {
			return jinja.Undefined(), err
		}
		if len(args) > 1 || len(kwargs) > 0 {
			return jinja.Undefined(), errors.New("dict." + method + "() takes no arguments")
		}
		return view(d), nil
	})
}

// dictValues is d's values.
func dictValues(d *jinja.Dict) jinja.Value {
	items := make([]jinja.Value, len(d.Keys))
	for i, k := range d.Keys {
		items[i] = d.Data[k]
	}
	return jinja.NewList(items)
}

// pyDictGet is Python's dict.get(key, default=None, /): a key that is not
// a string is in no dict a template gets (their keys are strings), where
// the Go engine looks its str() up ({"1": 2}.get(1) is 2 there, None in
// Python).
var pyDictGet = jinja.NewCallable("kvroute_get", func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	d, err := dictSelf("get", args)
	if err != nil {
		return jinja.Undefined(), err
	}
	switch {
	case len(kwargs) > 0:
		return jinja.Undefined(), errors.New("dict.get() takes no keyword arguments")
	case len(args) < 2 || len(args) > 3:
		return jinja.Undefined(), errors.New("dict.get: expected 1 or 2 arguments")
	case args[1].IsList() || args[1].IsDict() && !isNamespace(args[1]):
		return jinja.Undefined(), errors.New("dict.get: unhashable type: '" + pyTypeName(args[1]) + "'")
	}
	if args[1].IsString() {
		if v, ok := d.Data[args[1].AsString()]; ok {
			return v, nil
		}
	}
	if len(args) == 3 {
		return args[2], nil
	}
	return jinja.None(), nil
})
