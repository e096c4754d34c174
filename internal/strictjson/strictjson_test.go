package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

type inner struct {
	Mode  string            `json:"mode"`
	Items []inner           `json:"items,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
}

type Embedded struct {
	Promoted int `json:"promoted"`
}

type outer struct {
	Embedded
	Template string          `json:"template"`
	Untagged int             // matched as "Untagged", any case
	Inner    *inner          `json:"inner,omitempty"`
	List     []inner         `json:"list,omitempty"`
	Raw      json.RawMessage `json:"raw,omitempty"`
	Any      any             `json:"any,omitempty"`
	Skipped  int             `json:"-"`
}

var outerType = reflect.TypeOf(outer{})

func TestCheckDuplicates(t *testing.T) {
	for _, tc := range []struct {
		body    string
		typ     reflect.Type
		dupKey  string // "" : no duplicate
		dupPath string
	}{
		{`{"template":"a","inner":{"mode":"x"}}`, outerType, "", ""},
		{`{"template":"a","template":"b"}`, outerType, "template", ""},
		{`{"template":"a","Template":"b"}`, outerType, "Template", ""},
		{`{"template":"a","TEMPLATE":"b"}`, outerType, "TEMPLATE", ""},
		{`{"template":"a","\u0074emplate":"b"}`, outerType, "template", ""},
		{`{"untagged":1,"UNTAGGED":2}`, outerType, "UNTAGGED", ""},
		{`{"promoted":1,"Promoted":2}`, outerType, "Promoted", ""},
		{`{"inner":{"mode":"a","MODE":"b"}}`, outerType, "MODE", "inner"},
		{`{"list":[{"mode":"a"},{"mode":"a","mode":"b"}]}`, outerType, "mode", "list[1]"},
		{`{"inner":{"env":{"a":"1","A":"2"}}}`, outerType, "", ""},
		{`{"inner":{"env":{"a":"1","a":"2"}}}`, outerType, "a", "inner.env"},
		{`{"inner":{"items":[{"items":[{"env":{"k":"1","k":"2"}}]}]}}`, outerType, "k", "inner.items[0].items[0].env"},
		{`{"raw":{"x":1,"X":2}}`, outerType, "", ""},
		{`{"raw":{"x":1,"x":2}}`, outerType, "x", "raw"},
		{`{"any":[{"deep":{"y":1,"y":2}}]}`, outerType, "y", "any[0].deep"},
		{`{"unknown":1,"unknown":2}`, outerType, "unknown", ""},
		{`{"unknown":1,"Unknown":2}`, outerType, "", ""},
		{`{"a":1,"A":2}`, nil, "", ""},
		{`{"a":1,"b":{"a":1}}`, nil, "", ""},
		{`[{"a":1},{"a":1,"a":2}]`, nil, "a", "[1]"},
		{`"scalar"`, outerType, "", ""},
	} {
		err := CheckDuplicates([]byte(tc.body), tc.typ)
		var de *DuplicateKeyError
		switch {
		case tc.dupKey == "" && err != nil:
			t.Errorf("%s: %v; want nil", tc.body, err)
		case tc.dupKey != "" && !errors.As(err, &de):
			t.Errorf("%s: %v; want a duplicate %q", tc.body, err, tc.dupKey)
		case tc.dupKey != "" && (de.Key != tc.dupKey || de.Path != tc.dupPath):
			t.Errorf("%s: duplicate %q at %q; want %q at %q", tc.body, de.Key, de.Path, tc.dupKey, tc.dupPath)
		}
	}
}

func TestCheckDuplicatesSyntax(t *testing.T) {
	for _, body := range []string{`{"a":`, `{"a" 1}`, `[1,`, ``, `{"a":1,}`} {
		if err := CheckDuplicates([]byte(body), outerType); err == nil {
			t.Errorf("%q: nil; want a syntax error", body)
		}
	}
}

// countKeys counts the object keys of a decoded value.
func countKeys(v any) int {
	n := 0
	switch v := v.(type) {
	case map[string]any:
		n += len(v)
		for _, e := range v {
			n += countKeys(e)
		}
	case []any:
		for _, e := range v {
			n += countKeys(e)
		}
	}
	return n
}

// tokenKeys counts the object keys written in data.
func tokenKeys(t *testing.T, data []byte) int {
	dec := json.NewDecoder(bytes.NewReader(data))
	n, obj := 0, []bool{}
	expectKey := false
	for {
		tok, err := dec.Token()
		if err != nil {
			return n
		}
		switch tok {
		case json.Delim('{'):
			obj = append(obj, true)
			expectKey = true
			continue
		case json.Delim('['):
			obj = append(obj, false)
		case json.Delim('}'), json.Delim(']'):
			obj = obj[:len(obj)-1]
		default:
			if expectKey {
				n++
				expectKey = false
				continue
			}
		}
		expectKey = len(obj) > 0 && obj[len(obj)-1]
	}
}

// FuzzCheckDuplicates: CheckDuplicates never panics; valid JSON gets no
// error but a duplicate; what it passes untyped decodes without losing a
// key; a typed check finds every duplicate an untyped one does.
func FuzzCheckDuplicates(f *testing.F) {
	for _, s := range []string{
		`{"template":"a","Template":"b"}`,
		`{"inner":{"env":{"a":"1","A":"2"}}}`,
		`[{"a":1},{"a":1,"a":2}]`,
		`{"list":[{"mode":"a"},{"mode":"a","mode":"b"}]}`,
		`{"a":{"b":{"c":[1,2,{"d":null}]}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		untyped := CheckDuplicates(data, nil)
		typed := CheckDuplicates(data, outerType)
		if !json.Valid(data) {
			return
		}
		var de *DuplicateKeyError
		if untyped != nil && !errors.As(untyped, &de) {
			t.Fatalf("valid JSON %q: %v", data, untyped)
		}
		if typed != nil && !errors.As(typed, &de) {
			t.Fatalf("valid JSON %q typed: %v", data, typed)
		}
		if untyped != nil && typed == nil {
			t.Fatalf("%q: untyped found %v, typed nothing", data, untyped)
		}
		if untyped == nil {
			var v any
			dec := json.NewDecoder(bytes.NewReader(data))
			dec.UseNumber() // numbers beyond float64 are valid JSON
			if err := dec.Decode(&v); err != nil {
				t.Fatal(err)
			}
			if got, want := countKeys(v), tokenKeys(t, data); got != want {
				t.Fatalf("%q passed but decodes to %d keys of %d written", data, got, want)
			}
		}
	})
}
