package main

import (
	"strings"
	"testing"
	"time"
)

func row(key, group string, median time.Duration) result {
	return result{Key: key, Group: group, Name: key, Summary: Summary{N: 30, Median: median, P90: median, Min: median, Max: median}}
}

func findRatio(t *testing.T, lines []ratioLine, num, den string) ratioLine {
	t.Helper()
	for _, l := range lines {
		if l.Num == num && l.Den == den {
			return l
		}
	}
	t.Fatalf("no ratio %s/%s", num, den)
	return ratioLine{}
}

func TestEvalRatios(t *testing.T) {
	ms := time.Millisecond
	results := []result{
		row(keyABCreate, groupCreate, 10*ms),
		row(keyCrunRun, groupCreate, 50*ms), // 0.2 ≤ 1/3: met
		row(keyFloor, groupCreate, 2*ms),    // 5 > 3: missed
		row(keyABExec, groupExec, 2*ms),
		row(keyForkExec, groupExec, 1*ms),  // 2 > 1.5: missed
		row(keyRuncExec, groupExec, 50*ms), // 25 ≥ 20: met
		{Key: keyRuncRun, Group: groupCreate, Skip: "runc not on PATH"},
	}
	lines := evalRatios(results)
	for _, c := range []struct {
		num, den, status string
		value            float64
	}{
		{keyABCreate, keyCrunRun, "met", 0.2},
		{keyABCreate, keyFloor, "MISSED", 5},
		{keyABExec, keyForkExec, "MISSED", 2},
		{keyRuncExec, keyABExec, "met", 25},
		{keyABCreate, keyRuncRun, "not measured (" + keyRuncRun + ")", 0},
		{keyABCreate, keyUnshare, "not measured", 0},
	} {
		l := findRatio(t, lines, c.num, c.den)
		if l.Status != c.status || l.Value != c.value {
			t.Errorf("%s/%s = %v %q, want %v %q", c.num, c.den, l.Value, l.Status, c.value, c.status)
		}
	}
}

func TestMarkdownHasMachineTableAndRatios(t *testing.T) {
	m := machine{Kernel: "6.18.0", CPU: "Test CPU | 2.0GHz", NProc: 2, Memory: "24.0 GiB", Cgroup: "hybrid", Date: "2026-01-01 00:00 UTC", Go: "go1.26"}
	results := []result{
		row(keyFloor, groupCreate, 2*time.Millisecond),
		{Key: keyCrunRun, Group: groupCreate, Name: "crun run", Skip: "crun not on PATH"},
		row(keyForkExec, groupExec, time.Millisecond),
	}
	md := markdown(m, 30, 3, results, evalRatios(results))
	for _, want := range []string{
		"| Kernel (`uname -r`) | 6.18.0 |",
		`| CPU | Test CPU \| 2.0GHz |`,
		"| cgroup mode | hybrid |",
		"| floor | 2.00 ms | 2.00 ms | 2.00 ms | 30 |",
		"| crun run | — | — | — | 0 | skipped: crun not on PATH |",
		"## Ratios (medians, same run)",
		"## Method",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
