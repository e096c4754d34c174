package e2b

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/validate"
)

func TestCreateRequestMapping(t *testing.T) {
	s := &Server{cfg: Config{Templates: map[string]string{"base": "debian", "code-interpreter-v1": "code-interpreter"}}}
	ten := int64(10)
	for _, tc := range []struct {
		name     string
		body     newSandbox
		template string
		timeout  int64
		auto     bool
	}{
		{"no template is base", newSandbox{}, "debian", 300, false},
		{"code interpreter", newSandbox{TemplateID: "code-interpreter-v1"}, "code-interpreter", 300, false},
		{"an agentbox template", newSandbox{TemplateID: "busybox", Timeout: &ten}, "busybox", 10, false},
		{"autoPause pauses instead of killing", newSandbox{AutoPause: true, Timeout: &ten}, "debian", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := s.createRequest(tc.body)
			if err != nil {
				t.Fatal(err)
			}
			if req.Template != tc.template || req.TimeoutSeconds != tc.timeout {
				t.Errorf("template %q timeout %d, want %q %d", req.Template, req.TimeoutSeconds, tc.template, tc.timeout)
			}
			if tc.auto != (req.Idle != nil && req.Idle.PauseAfterSeconds == 10 && req.Idle.DeleteAfterSeconds == -1 && req.Lifecycle == api.LifecyclePersistent) {
				t.Errorf("autoPause %v: idle %+v lifecycle %q", tc.auto, req.Idle, req.Lifecycle)
			}
		})
	}
	zero := int64(0)
	if _, err := s.createRequest(newSandbox{Timeout: &zero}); err == nil {
		t.Error("timeout 0 accepted")
	}
	m, err := ParseTemplateMap([]string{"base=busybox", "mine = custom"})
	if err != nil || m["base"] != "busybox" || m["mine"] != "custom" || m["code-interpreter-v1"] != "code-interpreter" {
		t.Errorf("ParseTemplateMap: %v %v", m, err)
	}
	if _, err := ParseTemplateMap([]string{"base"}); err == nil {
		t.Error("a mapping without = accepted")
	}
}

func TestMetadataRoundTrip(t *testing.T) {
	md := map[string]string{"a": "1", "with space": "x y", "dots.and/slashes": ""}
	labels, err := metadataLabels(md)
	if err != nil {
		t.Fatal(err)
	}
	labels["other"] = "not metadata"
	back := metadataOf(labels)
	if len(back) != len(md) || back["with space"] != "x y" {
		t.Errorf("metadata %v -> %v -> %v", md, labels, back)
	}
	for k := range labels {
		if !labelKeyOK(k) {
			t.Errorf("label key %q is not a valid label key", k)
		}
	}
	if _, err := metadataLabels(map[string]string{"": "v"}); err == nil {
		t.Error("empty metadata key accepted")
	}
}

func TestParseListQuery(t *testing.T) {
	q := url.Values{"metadata": {url.Values{"k": {"v 1"}, "x&y": {"="}}.Encode()}, "state": {"running,paused"}, "limit": {"5"}}
	lq, err := parseListQuery(q)
	if err != nil {
		t.Fatal(err)
	}
	if lq.labels[MetadataPrefix+"k"] != "v 1" || lq.labels[MetadataPrefix+"x_26y"] != "=" || lq.limit != 5 || !lq.states["paused"] || !lq.states["running"] {
		t.Errorf("parsed %+v", lq)
	}
	for _, bad := range []url.Values{{"state": {"dead"}}, {"limit": {"0"}}, {"limit": {"x"}}, {"nextToken": {"!!"}}, {"metadata": {"%zz"}}} {
		if _, err := parseListQuery(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestPageToken(t *testing.T) {
	tok := pageToken{created: time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC), id: "abc"}
	back, err := parsePageToken(tok.String())
	if err != nil || !back.created.Equal(tok.created) || back.id != "abc" {
		t.Errorf("round trip %v: %v %v", tok, back, err)
	}
	for _, bad := range []string{"", "x", "MTIz", "MTIzLw"} {
		if _, err := parsePageToken(bad); err == nil {
			t.Errorf("token %q accepted", bad)
		}
	}
}

func TestResolvePath(t *testing.T) {
	for _, tc := range []struct{ in, user, want string }{
		{"", "user", "/home/user"},
		{"~", "root", "/root"},
		{"~/a", "user", "/home/user/a"},
		{"a/../b", "user", "/home/user/b"},
		{"/etc/../x", "user", "/x"},
		{"../../etc", "user", "/etc"},
		{"/a//b/", "root", "/a/b"},
	} {
		if got, err := resolvePath(tc.in, tc.user); err != nil || got != tc.want {
			t.Errorf("resolvePath(%q, %q) = %q, %v; want %q", tc.in, tc.user, got, err, tc.want)
		}
	}
	if _, err := resolvePath("a\x00b", "user"); err == nil {
		t.Error("NUL accepted")
	}
}

func TestUserOfHeader(t *testing.T) {
	for _, tc := range []struct{ h, want string }{
		{"", "user"},
		{"Basic cm9vdDo=", "root"},
		{"basic dXNlcjo=", "user"},
		{"Basic Og==", "user"},
	} {
		h := http.Header{}
		if tc.h != "" {
			h.Set("Authorization", tc.h)
		}
		if got, err := userOfHeader(h); err != nil || got != tc.want {
			t.Errorf("%q: %q %v, want %q", tc.h, got, err, tc.want)
		}
	}
	for _, bad := range []string{"Bearer x", "Basic !!", "Basic " + "Li4vZXRjOg=="} {
		h := http.Header{"Authorization": {bad}}
		if u, err := userOfHeader(h); err == nil {
			t.Errorf("%q accepted as %q", bad, u)
		}
	}
}

func TestEndEvents(t *testing.T) {
	three, minus := 3, -1
	for _, tc := range []struct {
		ev   api.ExecEvent
		want endEvent
	}{
		{api.ExecEvent{Type: api.EventExit, ExitCode: &three}, endEvent{ExitCode: 3, Exited: true, Status: "exit status 3"}},
		{api.ExecEvent{Type: api.EventExit, ExitCode: &minus, Signal: "KILL"}, endEvent{ExitCode: -1, Status: "signal: killed"}},
		{api.ExecEvent{Type: api.EventExit, ExitCode: &minus, Signal: "TERM"}, endEvent{ExitCode: -1, Status: "signal: terminated"}},
	} {
		got := endOf(tc.ev)
		if got.ExitCode != tc.want.ExitCode || got.Exited != tc.want.Exited || got.Status != tc.want.Status {
			t.Errorf("%+v: %+v, want %+v", tc.ev, got, tc.want)
		}
	}
	// A PTY's output is pty data; stderr never is.
	pe, _ := eventOf(api.ExecEvent{Type: api.EventStdout, Data: []byte("x")}, true)
	if string(pe.Data.Pty) != "x" || pe.Data.Stdout != nil {
		t.Errorf("tty stdout %+v", pe.Data)
	}
	// The protobuf JSON form: oneof as the one set field, bytes base64.
	b, _ := json.Marshal(processEventResponse{Event: &processEvent{Data: &dataEvent{Stdout: []byte("hi")}}})
	if string(b) != `{"event":{"data":{"stdout":"aGk="}}}` {
		t.Errorf("json %s", b)
	}
}

func TestSignalJSON(t *testing.T) {
	for in, want := range map[string]signal{`"SIGNAL_SIGKILL"`: signalKill, `"SIGNAL_SIGTERM"`: signalTerm, `9`: signalKill, `15`: signalTerm, `"SIGNAL_UNSPECIFIED"`: 0} {
		var s signal
		if err := json.Unmarshal([]byte(in), &s); err != nil || s != want {
			t.Errorf("%s: %v %v", in, s, err)
		}
	}
	var s signal
	if err := json.Unmarshal([]byte(`"SIGINT"`), &s); err == nil {
		t.Error("unknown signal name accepted")
	}
}

func TestTokens(t *testing.T) {
	tk := tokens{key: []byte("0123456789abcdef0123456789abcdef")}
	tok := tk.mint("acme", "sbx1")
	if owner, err := tk.check(tok, "sbx1"); err != nil || owner != "acme" {
		t.Errorf("check: %q %v", owner, err)
	}
	if _, err := tk.check(tok, "sbx2"); err == nil {
		t.Error("token of another sandbox accepted")
	}
	other := tokens{key: []byte("fedcba9876543210fedcba9876543210")}
	if _, err := other.check(tok, "sbx1"); err == nil {
		t.Error("token of another key accepted")
	}
}

// labelKeyOK is the label key shape of internal/validate.
func labelKeyOK(k string) bool {
	return validate.Labels(map[string]string{k: ""}) == nil
}

func FuzzMetaKey(f *testing.F) {
	f.Add("with space & = / _")
	f.Fuzz(func(t *testing.T, k string) {
		if k == "" {
			return
		}
		e := metaKey(k)
		if back, ok := unMetaKey(e); !ok || back != k {
			t.Fatalf("%q -> %q -> %q", k, e, back)
		}
		if len(MetadataPrefix+e) <= validate.MaxKeyLen && !labelKeyOK(MetadataPrefix+e) {
			t.Fatalf("%q -> label key %q is not valid", k, MetadataPrefix+e)
		}
	})
}
