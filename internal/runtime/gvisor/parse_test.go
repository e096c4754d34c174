package gvisor

import (
	"strconv"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func FuzzParseState(f *testing.F) {
	f.Add([]byte(`{"pid":42,"start_time":7,"container_id":"abc","root":"/r","bundle":"/r/b/abc","cgroup":"/p/abc"}`), "abc")
	f.Add([]byte(`{"pid":1,"container_id":"abc"}`), "abc")
	f.Add([]byte(`{}`), "abc")
	f.Add([]byte(`not json`), "x")
	f.Fuzz(func(t *testing.T, raw []byte, id string) {
		st, err := parseState(raw, id)
		if err != nil {
			if !errdefs.IsNotFound(err) {
				t.Fatalf("parseState error %v is not ErrNotFound", err)
			}
			return
		}
		if st.Pid <= 1 || st.ContainerID != id {
			t.Fatalf("accepted %+v for %q", st, id)
		}
	})
}

func FuzzQuoteGuestLog(f *testing.F) {
	f.Add([]byte(`{"error":"listening on /dev/.agentbox-run/guest.sock: permission denied"}`))
	f.Add([]byte("plain text\n\x00\xff"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		q := quoteGuestLog(b)
		if q == "" {
			if strings.TrimSpace(string(b[max(0, len(b)-2048):])) != "" {
				t.Fatalf("non-empty log rendered empty")
			}
			return
		}
		inner, ok := strings.CutPrefix(q, " (guest log: ")
		if !ok || !strings.HasSuffix(inner, ")") {
			t.Fatalf("bad frame %q", q)
		}
		s, err := strconv.Unquote(strings.TrimSuffix(inner, ")"))
		if err != nil || len(s) > 2048 {
			t.Fatalf("not one quoted string of at most 2 KiB: %q (%v)", q, err)
		}
	})
}

func TestParseState(t *testing.T) {
	if _, err := parseState([]byte(`{"pid":42,"container_id":"other"}`), "abc"); !errdefs.IsNotFound(err) {
		t.Errorf("another container's state: %v", err)
	}
	st, err := parseState([]byte(`{"pid":42,"start_time":7,"container_id":"abc","future_field":1}`), "abc")
	if err != nil || st.Pid != 42 || st.StartTime != 7 {
		t.Errorf("a state with a field of a later release: %+v, %v", st, err)
	}
}
