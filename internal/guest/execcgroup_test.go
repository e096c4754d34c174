package guest

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

func TestPopulatedZero(t *testing.T) {
	for in, want := range map[string]bool{
		"populated 0\nfrozen 0\n": true,
		"populated 1\nfrozen 0\n": false,
		"frozen 0\npopulated 0":   true,
		"":                        false,
		"populated 01\n":          false,
	} {
		if got := populatedZero([]byte(in)); got != want {
			t.Errorf("populatedZero(%q) = %v", in, got)
		}
	}
}

// TestExecCgroupsReuse drives execCgroups on a plain directory standing in
// for the delegated cgroup: a cgroup is reused only once its cgroup.events
// says it is empty, and a busy one lingers until sweep finds it empty.
func TestExecCgroupsReuse(t *testing.T) {
	dir := t.TempDir()
	root, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	c := newExecCgroups(root, slog.New(slog.DiscardHandler))
	events := func(name, v string) {
		if err := os.WriteFile(filepath.Join(dir, name, "cgroup.events"), []byte("populated "+v+"\nfrozen 0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	name, fd := c.create()
	if name != "exec-1" || fd < 0 {
		t.Fatalf("create = %q, %d", name, fd)
	}
	closeFD(fd)
	events(name, "1")
	c.release(name) // still busy: lingers
	if n2, fd2 := c.create(); n2 == name {
		t.Fatalf("a busy cgroup was handed out again")
	} else {
		closeFD(fd2)
		events(n2, "0")
		c.release(n2)
	}
	events(name, "0")
	c.sweep()
	if len(c.lingering) != 0 || len(c.idle) != 2 {
		t.Fatalf("after sweep: lingering %v, idle %v", c.lingering, c.idle)
	}
	n3, fd3 := c.create()
	closeFD(fd3)
	if n3 != name && n3 != "exec-2" {
		t.Fatalf("create did not reuse an idle cgroup: %q", n3)
	}
	if err := os.WriteFile(filepath.Join(dir, n3, "cgroup.kill"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.kill(n3); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, n3, "cgroup.kill")); string(b) != "1" {
		t.Fatalf("cgroup.kill = %q", b)
	}
	// A killed cgroup is never handed out again (it is removed instead;
	// here rmdir fails on the stand-in files, so it lingers).
	c.release(n3)
	for range maxIdle + 1 {
		n, fd := c.create()
		closeFD(fd)
		if n == n3 {
			t.Fatalf("killed cgroup %s was reused", n3)
		}
	}

	// Without a delegated cgroup, execs get none.
	none := newExecCgroups(nil, slog.New(slog.DiscardHandler))
	if n, fd := none.create(); n != "" || fd != -1 {
		t.Fatalf("create without root = %q, %d", n, fd)
	}
	none.release("")
	none.sweep()
}

func closeFD(fd int) {
	if fd >= 0 {
		_ = os.NewFile(uintptr(fd), "").Close()
	}
}
