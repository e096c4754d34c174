package tracectx

import (
	"context"
	"testing"
)

func TestParent(t *testing.T) {
	const good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if got := Parent(WithParent(context.Background(), good)); got != good {
		t.Fatalf("Parent = %q", got)
	}
	for _, bad := range []string{"", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x"} {
		if got := Parent(WithParent(context.Background(), bad)); got != "" {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzValid(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Fuzz(func(t *testing.T, s string) {
		if Valid(s) && (len(s) != 55 || s[:3] != "00-") {
			t.Fatalf("accepted %q", s)
		}
	})
}
