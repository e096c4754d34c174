package runner

import (
	"os"
	"path/filepath"
	"testing"
)

// Install puts a binary into a content-addressed, read-only directory;
// installing it again changes nothing, another binary gets another
// directory.
func TestInstall(t *testing.T) {
	root := filepath.Join(t.TempDir(), "runner")
	src := filepath.Join(t.TempDir(), "agentbox")
	if err := os.WriteFile(src, []byte("one"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := Install(root, src)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(dir) != root || len(filepath.Base(dir)) != 16 {
		t.Fatalf("Install = %s, want a 16-character hash below %s", dir, root)
	}
	st, err := os.Stat(filepath.Join(dir, "agentbox"))
	if err != nil || st.Mode().Perm() != 0o555 {
		t.Fatalf("installed binary: %v, %v", st, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "agentbox")); string(b) != "one" {
		t.Fatalf("installed binary holds %q", b)
	}
	again, err := Install(root, src)
	if err != nil || again != dir {
		t.Fatalf("second Install = %s, %v; want %s", again, err, dir)
	}
	if err := os.WriteFile(src, []byte("two"), 0o755); err != nil {
		t.Fatal(err)
	}
	other, err := Install(root, src)
	if err != nil || other == dir {
		t.Fatalf("Install of another binary = %s, %v", other, err)
	}
	ents, _ := os.ReadDir(root)
	if len(ents) != 2 {
		t.Fatalf("runner dir holds %d entries, want 2 (no temporary dir left)", len(ents))
	}
	if _, err := Install(root, filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("Install of a missing binary succeeded")
	}
}
