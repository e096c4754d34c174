package lazyregexp

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestMatchString(t *testing.T) {
	r := &Regexp{str: `^[a-z0-9][a-z0-9-]{0,63}$`} // not compiled yet, unlike New in a test
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !r.MatchString("abc-1") || r.MatchString("-abc") {
				t.Error("wrong match")
			}
		}()
	}
	wg.Wait()
	if r.String() != `^[a-z0-9][a-z0-9-]{0,63}$` {
		t.Errorf("String() = %q", r.String())
	}
}

func TestNewPanicsOnBadPatternInTests(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("New of a bad pattern did not panic in a test binary")
		}
	}()
	New(`[`)
}

// The binary's packages declare their patterns with New: a pattern
// compiled at init is paid by every process started from the binary,
// every sandbox's guest included.
func TestNoEagerPatterns(t *testing.T) {
	root := filepath.Join("..", "..")
	for _, dir := range []string{"api", "cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if bytes.Contains(b, []byte("regexp.MustCompile(")) && !strings.HasSuffix(path, filepath.Join("lazyregexp", "lazyregexp.go")) {
				t.Errorf("%s: regexp.MustCompile: declare patterns with lazyregexp.New", path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
