package config

import (
	"strings"
	"testing"
)

// FuzzWarmPools: what AGENTBOX_WARM_POOLS parses into is accepted by
// Validate only when every pool is TEMPLATE or TEMPLATE:RUNTIME with a
// size in range, and no key is invented: each accepted key is spelled in
// the variable.
func FuzzWarmPools(f *testing.F) {
	for _, s := range []string{"busybox=2", "busybox=2, debian=1", "busybox:gvisor=1", "busybox:=1", "a:b:c=1", "x@v1:gvisor=3", "=1", ",,", "busybox=lots", "Bad:gvisor=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		c := Default()
		c.WarmPools = parseWarmPools(v)
		if len(c.validateLimits()) != 0 {
			return
		}
		for key, n := range c.WarmPools {
			if n < 0 || n > maxWarmPool {
				t.Fatalf("%q: pool %q size %d accepted", v, key, n)
			}
			name, rt, hasRuntime := strings.Cut(key, ":")
			if !poolTemplateRE.MatchString(name) || hasRuntime && (rt == "" || strings.ContainsAny(rt, ":,= \t")) {
				t.Fatalf("%q: pool key %q accepted", v, key)
			}
			if !strings.Contains(v, key) {
				t.Fatalf("%q: pool key %q is not one of the entries", v, key)
			}
		}
	})
}
