package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestGvisorCreateParts(t *testing.T) {
	log := filepath.Join(t.TempDir(), "serve.log")
	lines := []string{
		`time=2026-12-03T07:51:39.157Z level=INFO msg="sandbox created" backend=gvisor sandbox=aaa pid=1 took=400ms bundle=1ms runsc_run=300ms guest=99ms`,
		`time=2026-12-03T07:51:39.192Z level=INFO msg="sandbox created" sandbox=aaa template=busybox`,
		`time=2026-12-03T07:51:40.155Z level=INFO msg="sandbox created" backend=gvisor sandbox=bbb pid=2 took=500ms bundle=1ms runsc_run=350ms guest=149ms`,
		`time=2026-12-03T07:51:40.155Z level=INFO msg="sandbox created" backend=gvisor sandbox=warm pid=3 took=900ms bundle=1ms runsc_run=800ms guest=99ms`,
		`time=2026-12-03T07:51:40.155Z level=INFO msg="sandbox created" backend=gvisor sandbox=ccc pid=4 took=500ms`,
	}
	if err := os.WriteFile(log, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rows := measureGvisorCreateParts(log, map[string]bool{"aaa": true, "bbb": true, "ccc": true})
	if len(rows) != 2 || rows[0].Skip != "" || rows[1].Skip != "" {
		t.Fatalf("rows = %+v", rows)
	}
	if rows[0].N != 2 || rows[0].Min != 300*time.Millisecond || rows[1].Min != 99*time.Millisecond {
		t.Errorf("runsc run %+v, guest %+v: want the two timed sandboxes' values", rows[0].Summary, rows[1].Summary)
	}
	if rows := measureGvisorCreateParts(log, map[string]bool{"zzz": true}); rows[0].Skip == "" {
		t.Errorf("no matching line gave a row: %+v", rows[0])
	}
}

func FuzzLogFields(f *testing.F) {
	f.Add(`time=x level=INFO msg="sandbox created" backend=gvisor sandbox=a runsc_run=1ms`)
	f.Add("a==b =c d=")
	f.Fuzz(func(t *testing.T, line string) {
		for k, v := range logFields(line) {
			if strings.ContainsAny(k, " \t\n") || strings.ContainsAny(v, " \t\n") {
				t.Fatalf("field %q=%q holds a space", k, v)
			}
		}
	})
}
