package audit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/api"
)

// A sandbox that swaps a directory of its writable layer for a link to a
// host path, between the recorder's listing and its reads, gets nothing
// of the host's file into its record: no hash, no size read, no package
// version, no link target through the link.
func TestReadsNeverFollowLinks(t *testing.T) {
	host := t.TempDir()
	os.MkdirAll(filepath.Join(host, "var/lib/dpkg/info"), 0o755)
	os.WriteFile(filepath.Join(host, "secret.txt"), []byte("host secret"), 0o600)
	os.WriteFile(filepath.Join(host, "var/lib/dpkg/status"), []byte("Package: hostpkg\nStatus: install ok installed\nVersion: 9.9-host\n\n"), 0o644)
	os.Symlink("/etc/hostname", filepath.Join(host, "link"))

	upper := t.TempDir()
	// The listing saw real directories and files...
	changes := []fileChange{
		{rel: "d/secret.txt", change: api.FileCreated, st: fileState{mode: 0o644, size: 11}},
		{rel: "d/link", change: api.FileCreated, st: fileState{mode: os.ModeSymlink | 0o777}},
		{rel: "var/lib/dpkg/info/hostpkg.list", change: api.FileCreated, st: fileState{mode: 0o644}},
	}
	// ...which the sandbox then replaced with links to the host.
	os.Symlink(host, filepath.Join(upper, "d"))
	os.Symlink(filepath.Join(host, "var"), filepath.Join(upper, "var"))

	budget := int64(1 << 20)
	for _, c := range changes[:2] {
		ev := fileEvent(upper, c, defaultScanLimits, &budget)
		if ev.SHA256 != "" || ev.Target != "" {
			t.Errorf("%s: read through a link: %+v", c.rel, ev)
		}
	}
	for _, p := range packageChanges(upper, changes, nil) {
		if p.Version != "" {
			t.Errorf("package version read through a link: %+v", p)
		}
	}
	if b := readBounded(upper, "d/secret.txt"); b != nil {
		t.Errorf("readBounded followed a link: %q", b)
	}
	if _, err := openBeneath(upper, "../"+filepath.Base(host)+"/secret.txt"); err == nil {
		t.Error("openBeneath accepted ..")
	}
	// Without links the same reads work.
	os.Remove(filepath.Join(upper, "d"))
	os.MkdirAll(filepath.Join(upper, "d"), 0o755)
	os.WriteFile(filepath.Join(upper, "d/secret.txt"), []byte("sandbox one"), 0o644)
	os.Symlink("/etc/hostname", filepath.Join(upper, "d/link"))
	if ev := fileEvent(upper, changes[0], defaultScanLimits, &budget); ev.SHA256 == "" {
		t.Errorf("a plain file was not hashed: %+v", ev)
	}
	if ev := fileEvent(upper, changes[1], defaultScanLimits, &budget); ev.Target != "/etc/hostname" {
		t.Errorf("a plain link's target: %+v", ev)
	}
}
