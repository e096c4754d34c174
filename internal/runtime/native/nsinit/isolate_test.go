package nsinit

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseKeep(t *testing.T) {
	for _, ok := range []string{`["/var/lib/agentbox"]`, `["/tmp","/srv/a"]`, `["/a/b","/a/bc"]`} {
		if _, err := ParseKeep(ok); err != nil {
			t.Errorf("ParseKeep(%s): %v", ok, err)
		}
	}
	for _, bad := range []string{
		``, `null`, `[]`, `"/tmp"`, `["/"]`, `["tmp"]`, `["/tmp/"]`, `["/tmp/../etc"]`, `["/a","/a/b"]`,
		`["/a","/a"]`, `["/a\u0000b"]`, `[1]`,
		`["/1","/2","/3","/4","/5","/6","/7","/8","/9","/10","/11","/12","/13","/14","/15","/16","/17"]`,
	} {
		if keep, err := ParseKeep(bad); err == nil {
			t.Errorf("ParseKeep(%s) = %q, want an error", bad, keep)
		}
	}
}

func TestUnder(t *testing.T) {
	keep := []string{"/data", "/srv/x"}
	for p, want := range map[string]bool{
		"/data": true, "/data/layers/a": true, "/srv/x/y": true,
		"/data2": false, "/srv": false, "/srv/xy": false, "/": false, "/etc": false,
	} {
		if got := Under(p, keep); got != want {
			t.Errorf("Under(%s) = %v, want %v", p, got, want)
		}
	}
}

// FuzzParseKeep: whatever ParseKeep accepts is 1 to 16 absolute, clean
// paths below /, none within another; it never panics.
func FuzzParseKeep(f *testing.F) {
	for _, s := range []string{`["/var/lib/agentbox"]`, `["/tmp","/srv/a"]`, `["/a","/a/b"]`, `["/"]`, `[]`, `{"a":1}`, `["/a/../b"]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		keep, err := ParseKeep(v)
		if err != nil {
			return
		}
		if len(keep) == 0 || len(keep) > maxKeep {
			t.Fatalf("accepted %d directories", len(keep))
		}
		for i, k := range keep {
			if !filepath.IsAbs(k) || filepath.Clean(k) != k || k == "/" || strings.ContainsRune(k, 0) {
				t.Fatalf("accepted %q", k)
			}
			for j, o := range keep {
				if i != j && Under(k, []string{o}) {
					t.Fatalf("accepted %q within %q", k, o)
				}
			}
		}
		if _, err := json.Marshal(keep); err != nil {
			t.Fatal(err)
		}
	})
}
