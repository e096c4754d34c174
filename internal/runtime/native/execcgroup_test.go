package native

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestUnifiedDirIn(t *testing.T) {
	hybrid := "9:name=systemd:/\n6:freezer:/agentbox/abc\n0::/agentbox/.zygote-1f/exec-3\n"
	for _, c := range []struct {
		in, parent, want string
	}{
		{hybrid, "/agentbox", unifiedRoot + "/agentbox/.zygote-1f"},
		{"0::/agentbox/abc\n", "/agentbox", unifiedRoot + "/agentbox/abc"},
		{"0::/agentbox\n", "/agentbox", ""},
		{"0::/other/abc\n", "/agentbox", ""},
		{"0::/agentbox/../etc\n", "/agentbox", ""},
		{"0::/agentboxes/x\n", "/agentbox", ""},
		{"0::relative/x\n", "/agentbox", ""},
		{"1:cpu:/agentbox/x\n", "/agentbox", ""},
		{"0::/a/b/c/d\n", "/a/b", unifiedRoot + "/a/b/c"},
	} {
		if got := unifiedDirIn(c.in, c.parent); got != c.want {
			t.Errorf("unifiedDirIn(%q, %q) = %q, want %q", c.in, c.parent, got, c.want)
		}
	}
}

// FuzzUnifiedDirIn: whatever a /proc/<pid>/cgroup file holds, the result
// is "" or one clean directory directly below unifiedRoot/parent.
func FuzzUnifiedDirIn(f *testing.F) {
	f.Add("0::/agentbox/abc/exec-1\n", "/agentbox")
	f.Add("6:freezer:/agentbox/x\n0::/agentbox/.zygote-1\n", "/agentbox")
	f.Add("0::/agentbox/../../x\n", "/agentbox")
	f.Fuzz(func(t *testing.T, in, parent string) {
		got := unifiedDirIn(in, parent)
		if got == "" {
			return
		}
		base := filepath.Join(unifiedRoot, parent)
		if filepath.Clean(got) != got || filepath.Dir(got) != base || strings.Contains(filepath.Base(got), "/") || filepath.Base(got) == ".." {
			t.Fatalf("unifiedDirIn(%q, %q) = %q: not a child of %s", in, parent, got, base)
		}
	})
}

// TestReadTidsCountsExecCgroups: on v2 the CPU yield reads the threads of
// the sandbox's cgroup and of its guest's per-exec cgroups below it.
func TestReadTidsCountsExecCgroups(t *testing.T) {
	dir := t.TempDir()
	write := func(p, s string) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "cgroup.threads"), "1\n2\n")
	write(filepath.Join(dir, "exec-1", "cgroup.threads"), "10\n")
	write(filepath.Join(dir, "exec-2", "cgroup.threads"), "20\n21\n")
	got, err := readTids(filepath.Join(dir, "cgroup.threads"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want := []int{1, 2, 10, 20, 21}; !slices.Equal(got, want) {
		t.Fatalf("readTids = %v, want %v", got, want)
	}
	write(filepath.Join(dir, "tasks"), "5\n")
	if got, _ := readTids(filepath.Join(dir, "tasks")); !slices.Equal(got, []int{5}) {
		t.Fatalf("readTids(v1 tasks) = %v", got)
	}
}
