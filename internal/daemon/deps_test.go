package daemon

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The daemon builds one logger from the configuration and hands it to every
// package it composes; library code never logs through slog's process-wide
// default, where the configured level, format and destination do not apply.
// A constructor given no logger discards.
func TestNoDefaultLogger(t *testing.T) {
	re := regexp.MustCompile(`\bslog\.(Default|Debug|Info|Warn|Error|Log|LogAttrs)(Context)?\(`)
	for _, root := range []string{"../../internal", "../../sdk"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i, line := range strings.Split(string(b), "\n") {
				if re.MatchString(line) {
					t.Errorf("%s:%d uses slog's default logger; take a *slog.Logger from the constructor: %s", path, i+1, strings.TrimSpace(line))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
