package procwatch

import (
	"os"
	"strconv"
	"testing"
)

func TestStartTime(t *testing.T) {
	a, err := StartTime(os.Getpid())
	if err != nil || a == 0 {
		t.Fatalf("StartTime(self) = %d, %v", a, err)
	}
	if _, err := StartTime(1 << 30); err == nil {
		t.Error("StartTime of a missing pid succeeded")
	}
	// comm may hold spaces and parentheses.
	stat := "42 (a) b (c) S 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 12345 0 0"
	if n, err := parseStartTime([]byte(stat)); err != nil || n != 12345 {
		t.Errorf("parseStartTime(%q) = %d, %v; want 12345", stat, n, err)
	}
	for _, bad := range []string{"", "42 no parenthesis", "42 (x) S 1 2", "42 (x) S 1 42 42 0 -1 4 1 0 0 0 0 0 0 0 20 0 1 0 -7 0"} {
		if n, err := parseStartTime([]byte(bad)); err == nil {
			t.Errorf("parseStartTime(%q) = %d, want an error", bad, n)
		}
	}
}

// FuzzParseStartTime: any line is parsed without a panic, and a field 22
// written after any comm is read back.
func FuzzParseStartTime(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 7 0"), uint64(7))
	f.Add([]byte("9 ((x) y)) R"), uint64(0))
	f.Fuzz(func(t *testing.T, stat []byte, start uint64) {
		_, _ = parseStartTime(stat)
		line := "9 (" + string(stat) + ") S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 " + strconv.FormatUint(start, 10) + " 0"
		if n, err := parseStartTime([]byte(line)); err != nil || n != start {
			t.Fatalf("parseStartTime(%q) = %d, %v; want %d", line, n, err, start)
		}
	})
}
