// Package deptest guards the shape of the import graph: a package's
// deps_test.go lists the imports it must never have, each with the reason,
// and fails when one appears (after Tailscale's tstest/deptest).
//
// The graph is read from `go list -deps -json` of the guarded packages
// (their non-test code, for the host's GOOS and GOARCH), so a forbidden
// package reached through any chain of imports fails the test, and the
// failure names that chain.
package deptest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Module is the import path of this module.
const Module = "github.com/agentbox/agentbox"

// Rule is one forbidden import: the package Path and, unless Exact, its
// subpackages (import paths starting with Path + "/"), and why they are
// forbidden.
type Rule struct {
	Path   string
	Reason string
	Exact  bool
}

// CheckOnly fails t when a package matched by pattern imports, directly or
// through other packages, a package outside the standard library that no
// rule of allowed matches (for a leaf package: what it may depend on at
// all, each with the reason it may). Packages matched by pattern are
// always allowed.
func CheckOnly(t *testing.T, pattern string, allowed []Rule) {
	t.Helper()
	g := load(t, pattern)
	ok := func(p string) bool {
		// "C" is cgo's pseudo-package (os/user, net): part of the toolchain.
		if g.standard[p] || p == "C" || g.isRoot(p) {
			return true
		}
		for _, r := range allowed {
			if r.matches(p) {
				return true
			}
		}
		return false
	}
	for _, root := range g.roots {
		if chain := g.path(root, func(p string) bool { return !ok(p) }); chain != nil {
			t.Errorf("%s imports %s (%s), which is not on its allow-list", root, chain[len(chain)-1], strings.Join(chain, " -> "))
		}
	}
}

func (r Rule) matches(pkg string) bool {
	return pkg == r.Path || !r.Exact && strings.HasPrefix(pkg, r.Path+"/")
}

// Check fails t when a package matched by pattern (a `go list` pattern such
// as Module+"/internal/guest/...") imports, directly or through other
// packages, a package a rule forbids. Packages matched by pattern itself are
// never forbidden.
func Check(t *testing.T, pattern string, rules []Rule) {
	t.Helper()
	g := load(t, pattern)
	for _, root := range g.roots {
		for _, r := range rules {
			if chain := g.path(root, func(p string) bool { return r.matches(p) && !g.isRoot(p) }); chain != nil {
				t.Errorf("%s imports %s (%s): %s", root, chain[len(chain)-1], strings.Join(chain, " -> "), r.Reason)
			}
		}
	}
}

// CheckDirectAllowed fails t when a package matched by pattern directly
// imports a package of this module that is neither matched by pattern nor
// in allowed (import paths, without subpackages). why says what the
// allow-list stands for. Imports from outside the module are not checked.
func CheckDirectAllowed(t *testing.T, pattern string, allowed []string, why string) {
	t.Helper()
	g := load(t, pattern)
	for _, root := range g.roots {
		for _, imp := range g.imports[root] {
			if !(Rule{Path: Module}).matches(imp) || g.isRoot(imp) || slices.Contains(allowed, imp) {
				continue
			}
			t.Errorf("%s imports %s, which is not on its allow-list: %s", root, imp, why)
		}
	}
}

type graph struct {
	roots    []string            // the packages matched by the pattern
	imports  map[string][]string // every package's direct imports
	standard map[string]bool     // packages of the standard library
}

func (g *graph) isRoot(p string) bool { return slices.Contains(g.roots, p) }

// path returns the shortest chain of imports from root to a package that
// satisfies bad, or nil.
func (g *graph) path(root string, bad func(string) bool) []string {
	prev := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, imp := range g.imports[p] {
			if _, seen := prev[imp]; seen {
				continue
			}
			prev[imp] = p
			if bad(imp) {
				chain := []string{imp}
				for q := p; q != ""; q = prev[q] {
					chain = append(chain, q)
				}
				slices.Reverse(chain)
				return chain
			}
			queue = append(queue, imp)
		}
	}
	return nil
}

func load(t *testing.T, pattern string) *graph {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		root := os.Getenv("GOROOT")
		if root == "" {
			t.Fatalf("no go command on PATH and GOROOT unset: %v", err)
		}
		goBin = filepath.Join(root, "bin", "go")
	}
	cmd := exec.Command(goBin, "list", "-deps", "-json=ImportPath,Imports,DepOnly,Standard,Error", pattern)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pattern, err, stderr.String())
	}
	g := &graph{imports: map[string][]string{}, standard: map[string]bool{}}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
			DepOnly    bool
			Standard   bool
			Error      *struct{ Err string }
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list -deps %s: decoding: %v", pattern, err)
		}
		if p.Error != nil {
			t.Fatalf("go list -deps %s: %s: %s", pattern, p.ImportPath, p.Error.Err)
		}
		g.imports[p.ImportPath] = p.Imports
		g.standard[p.ImportPath] = p.Standard
		if !p.DepOnly {
			g.roots = append(g.roots, p.ImportPath)
		}
	}
	if len(g.roots) == 0 {
		t.Fatalf("go list -deps %s: no package matched", pattern)
	}
	return g
}
