package nsinit

import (
	"strings"
	"testing"
)

func TestParseHighestMappedID(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"         0     100000      65536\n", 65535, true},
		{"0 0 4294967295\n", 4294967294, true},
		{"0 1000 1\n1 100000 65536\n", 65536, true},
		{"5 5 0\n", 0, false},
		{"", 0, false},
		{"a b c\n0 1\n", 0, false},
		{"0 0 1\n", 0, true},
	} {
		got, err := parseHighestMappedID(strings.NewReader(c.in))
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseHighestMappedID(%q) = %d, %v; want %d, ok %v", c.in, got, err, c.want, c.ok)
		}
	}
}

// FuzzParseHighestMappedID: any input parses without panic, and a result
// is an id of a 32-bit id space (inside + count - 1 of 32-bit values).
func FuzzParseHighestMappedID(f *testing.F) {
	f.Add("0 100000 65536\n")
	f.Add("0 0 4294967295\n")
	f.Add("1 2 3\n4 5 6\n")
	f.Fuzz(func(t *testing.T, in string) {
		hi, err := parseHighestMappedID(strings.NewReader(in))
		if err == nil && hi >= 1<<33 {
			t.Fatalf("highest id %d out of range", hi)
		}
	})
}
