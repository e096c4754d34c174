package httpapi

import (
	"context"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/agentbox/agentbox/api"
)

// api/openapi.yaml is a valid OpenAPI 3.1 document, as a real validator
// (kin-openapi's loader and Validate, with JSON Schema 2020-12 for 3.1)
// sees it: every $ref resolves, every schema and example is well formed,
// operation ids are unique, path parameters are declared.
func TestOpenAPIValid(t *testing.T) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatalf("loading api/openapi.yaml: %v", err)
	}
	if !doc.IsOpenAPI31OrLater() || doc.IsOpenAPI32OrLater() {
		t.Fatalf("api/openapi.yaml is OpenAPI %s, want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("api/openapi.yaml is not valid OpenAPI: %v", err)
	}
}
