package native

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runtimetest"
)

// TestIDMappedRootfs: a sandbox whose range differs from the layers'
// (spec.LayerIDs) sees the canonical files as its own, runs as its own host
// ids, stores what it writes back in the canonical range, and leaves no
// mount on the host.
func TestIDMappedRootfs(t *testing.T) {
	f := fixture(t)
	for _, name := range []string{"cold", "forker", "staged"} {
		t.Run(name, func(t *testing.T) {
			if name == "staged" {
				// The path of kernels before 6.8 (see overlayTakesFds).
				forceStagedOverlay = true
				t.Cleanup(func() { forceStagedOverlay = false })
			}
			b := newBackendTB(t)
			if name == "forker" {
				b.forker = newGuestForker(filepath.Join(f.RunnerDir, "agentbox"), b.log)
				b.idmaps.forker = b.forker
			}
			defer b.Close()
			spec := runtimetest.NewSpec(t, "idmap-"+name, f.Layer, f.RunnerDir)
			own := runtime.IDMap{HostID: runtimetest.TestIDMap.HostID + 7*65536, Size: 65536}
			spec.LayerIDs, spec.UIDMap, spec.GIDMap = runtimetest.TestIDMap, own, own
			ctx := context.Background()
			sb, err := b.Create(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Destroy(ctx)
			out, code := runtimetest.MustExec(t, sb.SocketPath(), "cat /proc/self/uid_map; stat -c %u:%g /bin/busybox /; echo x > /new && stat -c %u:%g /new")
			if code != 0 {
				t.Fatalf("exec: %d %s", code, out)
			}
			fields := strings.Fields(out)
			if len(fields) != 6 || fields[0] != "0" || fields[1] != strconv.FormatUint(uint64(own.HostID), 10) || fields[3] != "0:0" || fields[4] != "0:0" || fields[5] != "0:0" {
				t.Fatalf("inside: %q, want uid_map 0 %d 65536 and every file 0:0", out, own.HostID)
			}
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(spec.UpperDir, "new"), &st); err != nil {
				t.Fatal(err)
			}
			if st.Uid != runtimetest.TestIDMap.HostID || st.Gid != runtimetest.TestIDMap.HostID {
				t.Errorf("file written inside is %d:%d on disk, want the canonical %d", st.Uid, st.Gid, runtimetest.TestIDMap.HostID)
			}
			if err := sb.Destroy(ctx); err != nil {
				t.Fatal(err)
			}
			mi, err := os.ReadFile("/proc/self/mountinfo")
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(mi), filepath.Dir(spec.UpperDir)) || strings.Contains(string(mi), f.Layer) {
				t.Errorf("a mount of the sandbox is left in the host's mount table:\n%s", mi)
			}
		})
	}
}

// BenchmarkIDMapNamespace is the cost of making one range's idmap user
// namespace (a helper's start), paid once per range per daemon.
func BenchmarkIDMapNamespace(b *testing.B) {
	runner := filepath.Join(runtimetest.RunnerDir(b), "agentbox")
	for _, name := range []string{"in-process", "forker"} {
		b.Run(name, func(b *testing.B) {
			c := &idmapCache{}
			if name == "forker" {
				c.forker = newGuestForker(runner, testLogger())
				defer c.forker.close()
			}
			for i := 0; b.Loop(); i++ {
				r := runtime.IDMap{HostID: runtimetest.TestIDMap.HostID + uint32(1+i%1000)*65536, Size: 65536}
				fd, err := c.make(runner, runtimetest.TestIDMap, r, r)
				if err != nil {
					b.Fatal(err)
				}
				_ = syscall.Close(fd)
			}
		})
	}
}

// BenchmarkBuildMounts is the host side of a create's filesystem: the
// overlay (idmapped, its namespace cached) and the runner bind.
func BenchmarkBuildMounts(b *testing.B) {
	layer := runtimetest.SharedLayer(b)
	runnerDir := runtimetest.RunnerDir(b)
	bk := newBackendTB(b)
	defer bk.Close()
	spec := runtimetest.NewSpec(b, "bench", layer, runnerDir)
	own := runtime.IDMap{HostID: runtimetest.TestIDMap.HostID + 9*65536, Size: 65536}
	for _, ids := range []runtime.IDMap{runtimetest.TestIDMap, own} {
		name := "shared-range"
		if ids != runtimetest.TestIDMap {
			name = "own-range"
		}
		spec.LayerIDs, spec.UIDMap, spec.GIDMap = runtimetest.TestIDMap, ids, ids
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				m, err := bk.buildMounts(spec)
				if err != nil {
					b.Fatal(err)
				}
				m.close()
			}
		})
	}
}
