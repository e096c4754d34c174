package httpapi

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/agentbox/agentbox/api"
)

var updateDocs = flag.Bool("update", false, "rewrite docs/CONTRACTS.md's route list from api/openapi.yaml")

// contractsPath is the document whose route list is generated.
var contractsPath = filepath.Join("..", "..", "docs", "CONTRACTS.md")

// The route list of docs/CONTRACTS.md is generated from api/openapi.yaml,
// so it names every route the daemon serves (TestOpenAPIMatchesRoutes
// holds the spec to the mux) and nothing else.
func TestContractsRouteList(t *testing.T) {
	b, err := os.ReadFile(contractsPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	const heading = "## HTTP API v1 routes"
	h := strings.Index(doc, heading)
	if h < 0 {
		t.Fatalf("%s lacks %q", contractsPath, heading)
	}
	open := strings.Index(doc[h:], "```\n")
	if open < 0 {
		t.Fatalf("%s: no route block after %q", contractsPath, heading)
	}
	i := h + open + len("```\n")
	j := strings.Index(doc[i:], "```\n")
	if j < 0 {
		t.Fatalf("%s: the route block is not closed", contractsPath)
	}
	j += i
	gen := routeList(t)
	if doc[i:j] == gen {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(contractsPath, []byte(doc[:i]+gen+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	have, want := routesIn(doc[i:j]), routesIn(gen)
	for _, r := range want {
		if !slices.Contains(have, r) {
			t.Errorf("%s does not list %s", contractsPath, r)
		}
	}
	for _, r := range have {
		if !slices.Contains(want, r) {
			t.Errorf("%s lists %s, which api/openapi.yaml does not have", contractsPath, r)
		}
	}
	t.Errorf("%s's route list is out of date: go test ./internal/httpapi -run TestContractsRouteList -update", contractsPath)
}

// routesIn returns "METHOD PATH" of every route line of a route list
// (query strings dropped, a|b|c alternatives of the last segment expanded).
func routesIn(list string) []string {
	var out []string
	for _, line := range strings.Split(list, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !slices.Contains([]string{"GET", "PUT", "POST", "PATCH", "DELETE", "HEAD", "OPTIONS"}, f[0]) {
			continue
		}
		p, _, _ := strings.Cut(f[1], "?")
		dir, last := p[:strings.LastIndex(p, "/")+1], p[strings.LastIndex(p, "/")+1:]
		for _, alt := range strings.Split(last, "|") {
			out = append(out, f[0]+" "+dir+alt)
		}
	}
	return out
}

// routeList renders api/openapi.yaml's operations as the route list:
// one line per operation, sorted by path then method, with its query
// parameters, success statuses and bodies, and its summary.
func routeList(t *testing.T) string {
	t.Helper()
	spec, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatalf("loading api/openapi.yaml: %v", err)
	}
	paths := spec.Paths.InMatchingOrder()
	slices.Sort(paths)
	var sb strings.Builder
	for _, p := range paths {
		item := spec.Paths.Value(p)
		for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
			op := item.GetOperation(m)
			if op == nil {
				continue
			}
			var query []string
			for _, pr := range slices.Concat(item.Parameters, op.Parameters) {
				if pr.Value != nil && pr.Value.In == openapi3.ParameterInQuery {
					query = append(query, pr.Value.Name+"=")
				}
			}
			route := p
			if len(query) > 0 {
				route += "?" + strings.Join(query, "&")
			}
			var codes []string
			resp := ""
			for code, r := range op.Responses.Map() {
				if len(code) == 3 && code[0] == '2' {
					codes = append(codes, code)
				}
				_ = r
			}
			slices.Sort(codes)
			if len(codes) > 0 {
				resp = content(op.Responses.Value(codes[0]).Value.Content)
			}
			line := fmt.Sprintf("%-6s %-52s %s", m, route, strings.Join(codes, "|"))
			if resp != "" {
				line += " " + resp
			}
			if op.RequestBody != nil && op.RequestBody.Value != nil {
				if req := content(op.RequestBody.Value.Content); req != "" {
					line += "  body " + req
				}
			}
			if op.Summary != "" {
				line += "  — " + op.Summary
			}
			sb.WriteString(strings.TrimRight(line, " ") + "\n")
		}
	}
	return sb.String()
}

// content names a body: the schema of a JSON body (api.<Name>), else its
// media types.
func content(c openapi3.Content) string {
	if len(c) == 0 {
		return ""
	}
	var types []string
	for mt, m := range c {
		if mt == "application/json" && m.Schema != nil && m.Schema.Ref != "" {
			types = append(types, "api."+m.Schema.Ref[strings.LastIndex(m.Schema.Ref, "/")+1:])
			continue
		}
		types = append(types, mt)
	}
	slices.Sort(types)
	return strings.Join(types, " | ")
}
