package sandbox

import (
	"testing"

	"github.com/agentbox/agentbox/internal/testutil/deptest"
)

// coreImports are the packages of this module the sandbox core may import
// directly. Features (checkpoints, pools, upgrade, network edge, secrets,
// events, ...) live in packages above the core and attach through its
// extension points; the core never imports them. When a feature moves out
// of the core, delete the entries it alone needed; add an entry only for a
// package below the core (contracts, leaf helpers), never for a feature.
var coreImports = []string{
	deptest.Module + "/api",
	deptest.Module + "/internal/clock",
	deptest.Module + "/internal/diskquota",
	deptest.Module + "/internal/errdefs",
	deptest.Module + "/internal/execstream",
	deptest.Module + "/internal/guest/client",
	deptest.Module + "/internal/identity",
	deptest.Module + "/internal/layers",
	deptest.Module + "/internal/lazyregexp",
	deptest.Module + "/internal/oci",
	deptest.Module + "/internal/runner",
	deptest.Module + "/internal/runtime",
	deptest.Module + "/internal/store",
	deptest.Module + "/internal/templates",
	deptest.Module + "/internal/tenant",
	deptest.Module + "/internal/validate",
}

func TestDeps(t *testing.T) {
	deptest.CheckDirectAllowed(t, deptest.Module+"/internal/sandbox", coreImports,
		"the core imports only the packages below it; a feature attaches through the extension points, registered by the daemon")
	m := deptest.Module + "/internal/"
	deptest.Check(t, deptest.Module+"/internal/sandbox", []deptest.Rule{
		{Path: m + "daemon", Reason: "the daemon is the composition root: it builds the core, not the other way round"},
		{Path: m + "httpapi", Reason: "HTTP is an edge above the core; errors map to status only there"},
		{Path: m + "runtime/native", Exact: true, Reason: "the core dispatches to backends through the runtime contract; the daemon registers them"},
		{Path: m + "egress", Reason: "the network edge is a feature; the core reaches it through an extension point"},
		{Path: m + "bridge", Reason: "the API bridge is a feature wired by the daemon"},
		{Path: m + "pipeline", Reason: "the execution pipeline runs on top of the core"},
		{Path: m + "config", Reason: "the core takes its settings as constructor arguments; only the daemon reads config"},
		{Path: m + "runsecrets", Reason: "secrets, run tokens and redaction are a feature attached as an Extension"},
		{Path: m + "secrets", Reason: "the secret store is reached only through the runsecrets feature"},
		{Path: m + "sandboxevents", Reason: "events are a feature attached as an Extension"},
		{Path: m + "sandboxnet", Reason: "the network is a feature attached as an Extension"},
		{Path: m + "tunnel", Reason: "tunnels are a feature attached as an Extension"},
		{Path: m + "snapshot", Reason: "checkpoints, restore, fork, transactions, diff and merge are a feature above the core"},
		{Path: m + "tenant/registry", Reason: "quotas reach the core through its Quotas interface"},
	})
}
