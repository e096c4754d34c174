// Package strictjson finds what encoding/json accepts silently but a
// strict reader of untrusted input must refuse: an object that holds the
// same key twice. encoding/json keeps the last of the two, and matches keys
// to struct fields case-insensitively, so {"template":"a","Template":"b"}
// decodes as "b" while a proxy or audit log in front may have read "a".
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
)

// maxDepth bounds nesting as encoding/json does.
const maxDepth = 10000

// DuplicateKeyError is an object holding a key twice.
type DuplicateKeyError struct {
	Path string // where the object is: "" for the top level, else "resources", "env.items[2]", ...
	Key  string // the key's second occurrence, as written (unescaped)
}

func (e *DuplicateKeyError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("duplicate key %q", e.Key)
	}
	return fmt.Sprintf("duplicate key %q in %s", e.Key, e.Path)
}

// CheckDuplicates reports the first object in data that holds a key twice,
// as a *DuplicateKeyError, reading keys as decoding data into a value of
// type t (nil: no type, e.g. any) would:
//
//   - in an object decoded into a struct, two keys are the same when
//     encoding/json matches both to one field (exactly or, as it does,
//     case-insensitively: "template", "Template" and "TEMPLATE" are one);
//   - in an object decoded into a map, an interface or json.RawMessage,
//     and everywhere below an untyped value, keys are the same when equal
//     after unescaping ("a" and "\u0061" are one; "a" and "A" are two).
//
// data must be one JSON value; a syntax error is returned as found (a
// decoder run on the same data reports it better). CheckDuplicates does
// not decode anything and is safe for concurrent use.
func CheckDuplicates(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walk(dec, t, "", 0)
}

// walk reads one value from dec, which decodes into type t (nil: untyped).
func walk(dec *json.Decoder, t reflect.Type, path string, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("JSON nested deeper than %d", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return io.ErrUnexpectedEOF
		}
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar
	}
	t = deref(t)
	switch d {
	case '[':
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && t != rawMessage {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := walk(dec, elem, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
				return err
			}
		}
	case '{':
		if err := walkObject(dec, t, path, depth); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unexpected %v", d)
	}
	_, err = dec.Token() // the closing delimiter
	return err
}

// walkObject reads the members of an object whose '{' was read.
func walkObject(dec *json.Decoder, t reflect.Type, path string, depth int) error {
	var fields *structFields
	var elem reflect.Type
	switch {
	case t == nil || t == rawMessage:
	case t.Kind() == reflect.Struct:
		fields = fieldsOf(t)
	case t.Kind() == reflect.Map:
		elem = t.Elem()
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, ok := tok.(string)
		if !ok {
			return fmt.Errorf("object key is not a string")
		}
		canon, vt := key, elem
		if fields != nil {
			if f, ok := fields.lookup(key); ok {
				canon, vt = "\x00"+f.name, f.typ // one field, however the key is spelled
			}
		}
		if seen[canon] {
			return &DuplicateKeyError{Path: path, Key: key}
		}
		seen[canon] = true
		sub := key
		if path != "" {
			sub = path + "." + key
		}
		if err := walk(dec, vt, sub, depth+1); err != nil {
			return err
		}
	}
	return nil
}

var rawMessage = reflect.TypeOf(json.RawMessage(nil))

func deref(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// field is a struct field as encoding/json names it.
type field struct {
	name string
	typ  reflect.Type
}

// structFields are a struct type's JSON fields, promoted ones included.
type structFields struct {
	exact map[string]field
	list  []field
}

// lookup finds the field encoding/json decodes key into: an exact name
// first, else the first that matches case-insensitively.
func (s *structFields) lookup(key string) (field, bool) {
	if f, ok := s.exact[key]; ok {
		return f, true
	}
	for _, f := range s.list {
		if strings.EqualFold(f.name, key) {
			return f, true
		}
	}
	return field{}, false
}

var fieldCache sync.Map // reflect.Type -> *structFields

func fieldsOf(t reflect.Type) *structFields {
	if v, ok := fieldCache.Load(t); ok {
		return v.(*structFields)
	}
	s := &structFields{exact: map[string]field{}}
	collect(t, s, map[reflect.Type]bool{})
	fieldCache.Store(t, s)
	return s
}

// collect adds t's fields to s: its own first, then those promoted from
// untagged embedded structs (an outer name hides an inner one, as in
// encoding/json).
func collect(t reflect.Type, s *structFields, visiting map[reflect.Type]bool) {
	if visiting[t] {
		return
	}
	visiting[t] = true
	var embedded []reflect.Type
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if sf.Anonymous && name == "" {
			if et := deref(sf.Type); et.Kind() == reflect.Struct {
				embedded = append(embedded, et)
				continue
			}
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		if _, ok := s.exact[name]; ok {
			continue
		}
		f := field{name: name, typ: sf.Type}
		s.exact[name] = f
		s.list = append(s.list, f)
	}
	for _, et := range embedded {
		collect(et, s, visiting)
	}
}
