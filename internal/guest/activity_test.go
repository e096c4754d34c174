package guest

import (
	"os"
	"path/filepath"
	"testing"
)

// countProcs counts every process of a procfs but itself and zombies,
// reading names with spaces and parentheses.
func TestCountProcs(t *testing.T) {
	dir := t.TempDir()
	for pid, stat := range map[string]string{
		"1":    "1 (agentbox) S 0 1 1",
		"7":    "7 (sleep) S 1 7 7",
		"9":    "9 (my (odd) name) R 1 9 9",
		"12":   "12 (defunct) Z 1 12 12",
		"self": "x",
	} {
		if err := os.MkdirAll(filepath.Join(dir, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, pid, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := countProcs(dir, 1)
	if r.Processes != 2 || len(r.Sample) != 2 {
		t.Fatalf("countProcs = %+v, want 2 processes (7 and 9)", r)
	}
	for _, want := range []string{"7 sleep", "9 my (odd) name"} {
		found := false
		for _, s := range r.Sample {
			found = found || s == want
		}
		if !found {
			t.Errorf("sample %q lacks %q", r.Sample, want)
		}
	}
}
