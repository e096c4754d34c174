package config

import (
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// TestRuntimeSetting: the default backend is native, AGENTBOX_RUNTIME
// sets it, and a name no backend can have is refused.
func TestRuntimeSetting(t *testing.T) {
	c := Default()
	if c.Runtime != "native" {
		t.Fatalf("default runtime %q", c.Runtime)
	}
	t.Setenv(EnvRuntime, "gvisor")
	c.ApplyEnv()
	if c.Runtime != "gvisor" {
		t.Fatalf("runtime from %s: %q", EnvRuntime, c.Runtime)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("runtime gvisor: %v", err)
	}
	c.Runtime = "Not/A name"
	err := c.Validate()
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `runtime "Not/A name" must be a backend name`) {
		t.Fatalf("bad runtime name: %v", err)
	}
}
