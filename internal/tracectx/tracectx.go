// Package tracectx carries a caller's W3C trace context (the traceparent
// header of an exec request) from the API edge to the flight recorder,
// which makes the run's span a child of it (docs/AUDIT.md). It holds no
// tracing library: the value is checked for shape and passed on as text.
package tracectx

import "context"

type parentKey struct{}

// WithParent returns ctx carrying traceparent when it is a well-formed
// W3C traceparent value (version 00: "00-" 32 hex "-" 16 hex "-" 2 hex,
// trace and parent ids not all zeros); otherwise ctx unchanged.
func WithParent(ctx context.Context, traceparent string) context.Context {
	if !Valid(traceparent) {
		return ctx
	}
	return context.WithValue(ctx, parentKey{}, traceparent)
}

// Parent returns the traceparent ctx carries, or "".
func Parent(ctx context.Context) string {
	s, _ := ctx.Value(parentKey{}).(string)
	return s
}

// Valid reports whether s is a well-formed version-00 traceparent.
func Valid(s string) bool {
	if len(s) != 55 || s[:3] != "00-" || s[35] != '-' || s[52] != '-' {
		return false
	}
	return lowerHex(s[3:35]) && lowerHex(s[36:52]) && lowerHex(s[53:55]) &&
		s[3:35] != "00000000000000000000000000000000" && s[36:52] != "0000000000000000"
}

func lowerHex(s string) bool {
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
