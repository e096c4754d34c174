package httpapi

import (
	"encoding/json"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/agentbox/agentbox/api"
)

type openAPIDoc struct {
	OpenAPI    string                          `yaml:"openapi"`
	Paths      map[string]map[string]yaml.Node `yaml:"paths"`
	Components struct {
		Schemas         map[string]schema `yaml:"schemas"`
		SecuritySchemes map[string]struct {
			Type   string `yaml:"type"`
			Scheme string `yaml:"scheme"`
		} `yaml:"securitySchemes"`
	} `yaml:"components"`
}

type schema struct {
	Ref        string            `yaml:"$ref"`
	Type       string            `yaml:"type"`
	Format     string            `yaml:"format"`
	Properties map[string]schema `yaml:"properties"`
	Items      *schema           `yaml:"items"`
}

func loadSpec(t *testing.T) openAPIDoc {
	t.Helper()
	var doc openAPIDoc
	if err := yaml.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatalf("parsing api/openapi.yaml: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Fatalf("openapi version %q", doc.OpenAPI)
	}
	return doc
}

// schemaOf returns the type of v (a wire struct value) and the schema of
// its name; without one it fails t and returns false.
func schemaOf(t *testing.T, doc openAPIDoc, v any) (reflect.Type, schema, bool) {
	t.Helper()
	rt := reflect.TypeOf(v)
	s, ok := doc.Components.Schemas[rt.Name()]
	if !ok {
		t.Errorf("schema %s missing", rt.Name())
	}
	return rt, s, ok
}

// checkSchemaFields fails t unless each of types (wire struct values) has
// a schema of its name whose properties are its JSON fields (jsonFields),
// no more and no fewer.
func checkSchemaFields(t *testing.T, doc openAPIDoc, types ...any) {
	t.Helper()
	for _, v := range types {
		rt, s, ok := schemaOf(t, doc, v)
		if !ok {
			continue
		}
		fields := jsonFields(rt)
		for name := range fields {
			if _, ok := s.Properties[name]; !ok {
				t.Errorf("%s: field %q not in schema", rt.Name(), name)
			}
		}
		for name := range s.Properties {
			if !fields[name] {
				t.Errorf("schema %s: property %q not in the type", rt.Name(), name)
			}
		}
	}
}

// jsonFields returns the JSON names of rt's fields, those of embedded
// structs without a tag flattened in.
func jsonFields(rt reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := 0; i < rt.NumField(); i++ {
		f := rt.Field(i)
		if f.Anonymous && f.Tag.Get("json") == "" {
			for k := range jsonFields(f.Type) {
				out[k] = true
			}
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out[name] = true
		}
	}
	return out
}

// Every registered route is in the spec and vice versa.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	doc := loadSpec(t)
	methods := map[string]bool{"get": true, "put": true, "post": true, "delete": true, "patch": true, "head": true, "options": true}
	var inSpec, inMux []string
	for p, ops := range doc.Paths {
		for m := range ops {
			if methods[m] {
				inSpec = append(inSpec, strings.ToUpper(m)+" "+p)
			}
		}
	}
	h := New(&fakeService{}, Options{}).(*handler)
	for _, rt := range h.routes() {
		inMux = append(inMux, rt.method+" "+rt.pattern)
	}
	sort.Strings(inSpec)
	sort.Strings(inMux)
	if !reflect.DeepEqual(inSpec, inMux) {
		t.Fatalf("spec and mux differ:\nspec: %v\nmux:  %v", inSpec, inMux)
	}
	if s := doc.Components.SecuritySchemes["bearerAuth"]; s.Type != "http" || s.Scheme != "bearer" {
		t.Fatalf("bearer security scheme missing: %+v", s)
	}
}

// Every JSON field of every wire type is a property of the schema of the
// same name, []byte fields are base64 strings, and nested types are checked
// through their $ref.
func TestOpenAPISchemasMatchTypes(t *testing.T) {
	doc := loadSpec(t)
	types := []any{
		api.Error{}, api.Info{}, api.Resources{}, api.CreateSandboxRequest{}, api.Sandbox{}, api.SandboxList{},
		api.TTY{}, api.ExecRequest{}, api.ExecEvent{}, api.Process{}, api.ProcessList{}, api.SignalRequest{},
		api.FileInfo{}, api.FileList{}, api.MkdirRequest{}, api.MoveRequest{}, api.Template{}, api.TemplateList{},
		api.TemplateSpec{}, api.TemplateStep{}, api.CopyStep{}, api.BuildTemplateRequest{}, api.BuildEvent{},
		api.ExposeRequest{}, api.Exposure{}, api.ExposureList{},
	}
	timeType := reflect.TypeOf(time.Time{})
	rawJSONType := reflect.TypeOf(json.RawMessage(nil))
	for _, v := range types {
		rt, s, ok := schemaOf(t, doc, v)
		if !ok {
			continue
		}
		seen := map[string]bool{}
		for i := 0; i < rt.NumField(); i++ {
			f := rt.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			seen[name] = true
			p, ok := s.Properties[name]
			if !ok {
				t.Errorf("%s.%s: field %q not in schema", rt.Name(), f.Name, name)
				continue
			}
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch {
			case ft == timeType:
				if p.Type != "string" || p.Format != "date-time" {
					t.Errorf("%s.%s: time must be string/date-time", rt.Name(), name)
				}
			case ft == rawJSONType:
				// Embedded JSON (output_schema): a JSON value, not base64.
				if p.Type == "string" {
					t.Errorf("%s.%s: json.RawMessage is a JSON value, not a string", rt.Name(), name)
				}
			case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Uint8:
				if p.Type != "string" || p.Format != "byte" {
					t.Errorf("%s.%s: []byte must be string/byte (base64)", rt.Name(), name)
				}
			case ft.Kind() == reflect.Struct:
				if want := "#/components/schemas/" + ft.Name(); p.Ref != want {
					t.Errorf("%s.%s: $ref %q, want %q", rt.Name(), name, p.Ref, want)
				}
			case ft.Kind() == reflect.String:
				if p.Type != "string" {
					t.Errorf("%s.%s: type %q, want string", rt.Name(), name, p.Type)
				}
			case ft.Kind() == reflect.Bool:
				if p.Type != "boolean" {
					t.Errorf("%s.%s: type %q, want boolean", rt.Name(), name, p.Type)
				}
			case ft.Kind() >= reflect.Int && ft.Kind() <= reflect.Uint64:
				if p.Type != "integer" {
					t.Errorf("%s.%s: type %q, want integer", rt.Name(), name, p.Type)
				}
			case ft.Kind() == reflect.Float64:
				if p.Type != "number" {
					t.Errorf("%s.%s: type %q, want number", rt.Name(), name, p.Type)
				}
			case ft.Kind() == reflect.Slice:
				if p.Type != "array" || p.Items == nil {
					t.Errorf("%s.%s: want array with items", rt.Name(), name)
				}
			case ft.Kind() == reflect.Map:
				if p.Type != "object" {
					t.Errorf("%s.%s: want object", rt.Name(), name)
				}
			}
		}
		for name := range s.Properties {
			if !seen[name] {
				t.Errorf("schema %s has property %q that %s lacks", rt.Name(), name, rt.Name())
			}
		}
	}
}
