package validate

import (
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestRules(t *testing.T) {
	many := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m["K"+strings.Repeat("x", i%100)+string(rune('A'+i/100))] = "v"
		}
		return m
	}
	for _, tc := range []struct {
		name  string
		check func(map[string]string) error
		in    map[string]string
		want  string // "" for valid, else a substring of the error
	}{
		{"env nil", Env, nil, ""},
		{"env ok", Env, map[string]string{"PATH": "/bin", "_x1": ""}, ""},
		{"env equals", Env, map[string]string{"A=B": "c"}, "variable name"},
		{"env dash", Env, map[string]string{"A-B": "c"}, "variable name"},
		{"env digit first", Env, map[string]string{"1A": "c"}, "variable name"},
		{"env empty name", Env, map[string]string{"": "c"}, "variable name"},
		{"env long name", Env, map[string]string{strings.Repeat("A", MaxKeyLen+1): "c"}, "variable name"},
		{"env NUL value", Env, map[string]string{"A": "a\x00"}, "value is not valid"},
		{"env long value", Env, map[string]string{"A": strings.Repeat("v", MaxValueLen+1)}, "value is not valid"},
		{"env too many", Env, many(MaxEnv + 1), "at most 256"},
		{"environ dash", Environ, map[string]string{"A-B.c": "x"}, ""},
		{"environ long", Environ, map[string]string{strings.Repeat("A", 1000): strings.Repeat("v", MaxValueLen+1)}, ""},
		{"environ equals", Environ, map[string]string{"A=B": "c"}, "variable name"},
		{"environ empty", Environ, map[string]string{"": "c"}, "variable name"},
		{"environ NUL name", Environ, map[string]string{"A\x00": "c"}, "variable name"},
		{"environ NUL value", Environ, map[string]string{"A": "\x00"}, "value is not valid"},
		{"labels ok", Labels, map[string]string{"a": "", "example.com/x_y-z": "v"}, ""},
		{"labels key", Labels, map[string]string{"-a": "v"}, "label key"},
		{"labels empty key", Labels, map[string]string{"": "v"}, "label key"},
		{"labels long key", Labels, map[string]string{strings.Repeat("a", MaxKeyLen+1): "v"}, "label key"},
		{"labels long value", Labels, map[string]string{"a": strings.Repeat("v", MaxLabelValueLen+1)}, "value is not valid"},
		{"labels NUL value", Labels, map[string]string{"a": "\x00"}, "value is not valid"},
		{"labels too many", Labels, many(MaxLabels + 1), "at most 64"},
	} {
		err := tc.check(tc.in)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (!errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an invalid argument containing %q", tc.name, err, tc.want)
		}
	}
}

func TestClippedKey(t *testing.T) {
	err := EnvName(strings.Repeat("-", 10000))
	if err == nil || len(err.Error()) > 200 {
		t.Errorf("error for a 10000-byte name: %d bytes", len(err.Error()))
	}
}
