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
	// The code interpreter's server and its interpreters are not activity.
	for pid, stat := range map[string][2]string{
		"20": {"20 (agentbox) S 1 20 20", "/.agentbox/agentbox\x00guest\x00code-server\x00--addr\x00127.0.0.1:49999\x00"},
		"21": {"21 (python3) S 20 21 21", "python3\x00-u\x00-c\x00..."},
		"22": {"22 (sh) S 21 21 21", "sh\x00"},
		"30": {"30 (agentbox) S 1 30 30", "/.agentbox/agentbox\x00guest\x00code-client\x00execute\x00"},
	} {
		if err := os.MkdirAll(filepath.Join(dir, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, pid, "stat"), []byte(stat[0]), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, pid, "cmdline"), []byte(stat[1]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := countProcs(dir, 1)
	if r.Processes != 3 || len(r.Sample) != 3 {
		t.Fatalf("countProcs = %+v, want 3 processes (7, 9 and 30)", r)
	}
	for _, want := range []string{"7 sleep", "9 my (odd) name", "30 agentbox"} {
		found := false
		for _, s := range r.Sample {
			found = found || s == want
		}
		if !found {
			t.Errorf("sample %q lacks %q", r.Sample, want)
		}
	}
}
