package config

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/lazyregexp"
	"github.com/agentbox/agentbox/internal/runtime"
)

// EnvWarmPools sets Config.WarmPools: "busybox=2,debian=1,busybox:gvisor=1".
const EnvWarmPools = "AGENTBOX_WARM_POOLS"

// maxWarmPool bounds one template's configured pool.
const maxWarmPool = 64

var poolTemplateRE = lazyregexp.New(`^[a-z0-9][a-z0-9._-]{0,127}(@[a-z0-9]{1,64})?$`)

// parseWarmPools parses EnvWarmPools ("busybox=2,debian=1"); a malformed
// entry becomes a negative size that Validate refuses.
func parseWarmPools(v string) map[string]int {
	pools := map[string]int{}
	for _, kv := range strings.Split(v, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		name, size, _ := strings.Cut(kv, "=")
		n, err := strconv.Atoi(size)
		if err != nil {
			n = -1
		}
		pools[strings.TrimSpace(name)] = n
	}
	return pools
}

func (c *Config) validateLimits() []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...))
	}
	for spelled, n := range c.WarmPools {
		name, rt, hasRuntime := strings.Cut(spelled, ":")
		if !poolTemplateRE.MatchString(name) {
			bad("warm pool template %q is not a valid name", name)
		}
		if hasRuntime && !runtime.ValidName(rt) {
			bad("warm pool %q: runtime %q is not a backend name", spelled, rt)
		}
		if n < 0 || n > maxWarmPool {
			bad("warm pool %q size %d must be between 0 and %d", spelled, n, maxWarmPool)
		}
	}
	r := c.DefaultResources
	if r.DiskBytes < 0 || r.DiskInodes < 0 || r.OpenFiles < 0 {
		bad("default disk_bytes, disk_inodes and open_files must not be negative")
	}
	if r.DiskBytes != 0 && r.DiskBytes < 16<<20 {
		bad("default disk_bytes %d must be at least 16 MiB", r.DiskBytes)
	}
	if r.DiskInodes != 0 && r.DiskInodes < 1024 {
		bad("default disk_inodes %d must be at least 1024", r.DiskInodes)
	}
	if c.MaxDiskBytes < 0 || c.MaxDiskInodes < 0 {
		bad("max_disk_bytes and max_disk_inodes must not be negative")
	}
	if c.MaxDiskBytes != 0 && (r.DiskBytes == 0 || c.MaxDiskBytes < r.DiskBytes) {
		bad("max_disk_bytes %d must be at least the default disk_bytes %d (and needs one)", c.MaxDiskBytes, r.DiskBytes)
	}
	if c.MaxDiskInodes != 0 && (r.DiskInodes == 0 || c.MaxDiskInodes < r.DiskInodes) {
		bad("max_disk_inodes %d must be at least the default disk_inodes %d (and needs one)", c.MaxDiskInodes, r.DiskInodes)
	}
	if r.OpenFiles != 0 && r.OpenFiles < 64 {
		bad("default open_files %d must be at least 64", r.OpenFiles)
	}
	return errs
}
