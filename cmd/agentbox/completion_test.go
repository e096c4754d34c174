package main

import (
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/sdk/go/agentboxtest"
)

// Shell completion suggests sandbox ids and names for the verbs that take
// a sandbox (asking the daemon), only in a sandbox's position, never
// files; with no daemon it suggests nothing and says nothing.
func TestCompletionSuggestsSandboxes(t *testing.T) {
	srv := agentboxtest.NewServer(t)
	a := srv.AddSandbox(api.CreateSandboxRequest{Name: "web1"})
	b := srv.AddSandbox(api.CreateSandboxRequest{})

	complete := func(srvArgs bool, args ...string) (lines []string, directive string) {
		t.Helper()
		s := srv
		if !srvArgs {
			s = nil
		}
		out, errOut, code := cli(t, s, "", append([]string{"__complete"}, args...)...)
		if code != 0 {
			t.Fatalf("__complete %v: exit %d: %s", args, code, errOut)
		}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if strings.HasPrefix(l, ":") {
				directive = l
				continue
			}
			id, _, _ := strings.Cut(l, "\t")
			lines = append(lines, id)
		}
		return lines, directive
	}
	has := func(list []string, want ...string) bool {
		for _, w := range want {
			found := false
			for _, l := range list {
				found = found || l == w
			}
			if !found {
				return false
			}
		}
		return true
	}

	for _, verb := range [][]string{{"exec"}, {"rm"}, {"inspect"}, {"pause"}, {"ps"}, {"egress", "log"}, {"checkpoint", "create"}, {"egress", "credential", "add"}} {
		got, dir := complete(true, append(verb, "")...)
		if !has(got, a.ID(), b.ID(), "web1") || dir != ":4" {
			t.Errorf("completing %v: %v %s, want %s, %s, web1 and :4 (no files)", verb, got, dir, a.ID(), b.ID())
		}
	}
	if got, _ := complete(true, "exec", "we"); len(got) != 1 || got[0] != "web1" {
		t.Errorf("completing exec we: %v, want [web1]", got)
	}
	if got, _ := complete(true, "rm", a.ID(), ""); !has(got, b.ID()) {
		t.Errorf("rm takes many sandboxes: second argument %v", got)
	}
	if got, _ := complete(true, "exec", a.ID(), ""); len(got) != 0 {
		t.Errorf("exec's command position offered sandboxes: %v", got)
	}
	// restore SANDBOX CHECKPOINT: the second is a checkpoint (the fake
	// daemon has none), never a sandbox or a file.
	if got, dir := complete(true, "restore", a.ID(), ""); len(got) != 0 || dir != ":4" {
		t.Errorf("completing restore's checkpoint: %v %s", got, dir)
	}
	if got, _ := complete(true, "fork", ""); !has(got, a.ID(), "web1") {
		t.Errorf("fork takes a sandbox too: %v", got)
	}
	if got, _ := complete(false, "--host", "unix:///nonexistent/agentbox.sock", "exec", ""); len(got) != 0 {
		t.Errorf("no daemon: %v", got)
	}
}

// Every verb named in completionArgs exists: a renamed command must not lose
// its completion silently.
func TestSandboxArgsExist(t *testing.T) {
	root := rootCmd()
	for path := range completionArgs {
		c, rest, err := root.Find(strings.Fields(path)[1:])
		if err != nil || len(rest) != 0 || c.CommandPath() != path {
			t.Errorf("completionArgs names %q, which is no command", path)
		}
	}
}
