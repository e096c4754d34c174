package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/testutil"
)

func quickBench(t *testing.T) (*bench, string) {
	t.Helper()
	dir := t.TempDir()
	return &bench{n: 2, warmup: 1, bundle: filepath.Join(dir, "true-bundle"), prefix: "abbench-test-" + strings.ReplaceAll(t.Name(), "/", "-")}, dir
}

func requireMeasured(t *testing.T, r result) {
	t.Helper()
	if r.Skip != "" {
		t.Fatalf("%s not measured: %s", r.Key, r.Skip)
	}
	if r.N != 2 || r.Median <= 0 || r.P90 < r.Median {
		t.Fatalf("%s: implausible summary %+v", r.Key, r.Summary)
	}
}

func TestMeasureFloorAndForkExec(t *testing.T) {
	testutil.RequiresRoot(t)
	b, _ := quickBench(t)
	requireMeasured(t, measureFloor(context.Background(), b))
	requireMeasured(t, measureForkExec(context.Background(), b))
}

func TestRuntimePeersCleanUp(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	testutil.RequiresBinary(t, "crun")
	testutil.RequiresBinary(t, "nsenter")
	testutil.RequiresFile(t, "/bin/busybox", "package busybox-static")
	ctx := context.Background()
	b, dir := quickBench(t)
	if err := makeBundle(ctx, b.bundle, []string{"/bin/true"}); err != nil {
		t.Fatal(err)
	}
	requireMeasured(t, measureRuncRun(ctx, b))
	requireMeasured(t, measureCrunRun(ctx, b, false))
	requireMeasured(t, measureRuncExec(ctx, b, dir))
	requireMeasured(t, measureNsenter(ctx, b))

	// No container of this test may survive it, in either runtime.
	for _, rt := range []string{"runc", "crun"} {
		out, err := exec.Command(rt, "list", "-q").CombinedOutput()
		if err != nil {
			t.Fatalf("%s list: %v: %s", rt, err, out)
		}
		if strings.Contains(string(out), b.prefix) {
			t.Errorf("%s still lists containers of this test:\n%s", rt, out)
		}
	}
	// The private mount namespace of crun must not have leaked to the host.
	if cgroupMode() == "hybrid" {
		if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.controllers"); err != nil {
			t.Errorf("/sys/fs/cgroup/unified unmounted on the host: %v", err)
		}
	}
}

func TestMountsUnder(t *testing.T) {
	if got := mountsUnder("/proc"); len(got) == 0 || got[0] != "/proc" {
		t.Fatalf("mountsUnder(/proc) = %v, want /proc first", got)
	}
	if got := mountsUnder(t.TempDir()); len(got) != 0 {
		t.Fatalf("mountsUnder(fresh temp dir) = %v, want none", got)
	}
}
