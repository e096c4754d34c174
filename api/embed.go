package api

import _ "embed"

// OpenAPI is the OpenAPI 3.1 description of API v1, served by the daemon at
// GET /v1/openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte
