package sandbox

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestCoreImportsNoFeature keeps the core below its features: they attach
// through the extension points of hooks.go, so the core importing one
// would close a cycle of calls the extension points exist to avoid.
func TestCoreImportsNoFeature(t *testing.T) {
	forbidden := map[string]string{
		"internal/runsecrets":      "secrets, run tokens and redaction attach as an exec and stream wrapper",
		"internal/sandboxevents":   "events attach as an observer",
		"internal/sandboxnet":      "network policy attaches through prepare, create, start and exec hooks",
		"internal/sandboxfiles":    "file and guest process calls go through WithGuest",
		"internal/tunnel":          "tunnels attach through start, stop and delete hooks",
		"internal/snapshot":        "diff, tree hash and merge read sandboxes through ReadFS, CheckpointDirs and ResolveTemplate",
		"internal/templatesvc":     "the template API is above the core; it saves through LockRunning and Handle.Frozen",
		"internal/layergc":         "the collector is above the core; it asks for LayersInUse",
		"internal/upgrade":         "runner staging and upgrade requests are above the core; the swap is UpgradeGuest",
		"internal/warmpool":        "warm pools attach as a create interceptor over the core's hidden sandboxes",
		"internal/egress":          "the egress proxy is sandboxnet's, reached through its NetworkEdge",
		"internal/bridge":          "the API bridge is a tunnel route registered by the daemon",
		"internal/secrets":         "the secret store and token minter are runsecrets'",
		"internal/pipeline":        "the pipeline is above the core and calls it",
		"internal/httpapi":         "the HTTP edge is above the core",
		"internal/daemon":          "the daemon is the composition root",
		"internal/tenant/registry": "quota admission is the Quotas interface the daemon hands over; the registry's meters read the core",
		"internal/runtime/native":  "backends come from the runtime.Registry the daemon builds; the core knows only the runtime contract",
		"internal/runtime/inproc":  "the in-process backend is for tests, handed over like any backend",
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for pkg, why := range forbidden {
				if strings.HasSuffix(path, "/"+pkg) || strings.Contains(path, "/"+pkg+"/") {
					t.Errorf("%s imports %s: %s", f, path, why)
				}
			}
		}
	}
}
