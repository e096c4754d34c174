package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// runUnder runs sub as a sub-command of a root with agentbox's persistent
// flags (what rootGlobals reads) and returns stdout, stderr and the error.
func runUnder(t *testing.T, sub *cobra.Command, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := &cobra.Command{Use: "agentbox", SilenceErrors: true, SilenceUsage: true}
	pf := root.PersistentFlags()
	pf.String("host", "unix:///nonexistent/agentbox.sock", "")
	pf.String("api-key", "", "")
	pf.Bool("json", false, "")
	root.AddCommand(sub)
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs(args)
	err = root.ExecuteContext(context.Background())
	return out.String(), errb.String(), err
}

type testItem struct {
	Name string `json:"name"`
	N    int    `json:"n"`
}

type testItemList struct {
	Items []testItem `json:"items"`
}

func TestListing(t *testing.T) {
	items := []testItem{{"a", 1}, {"longer-name", 22}}
	var gotArgs []string
	l := listing[testItem]{
		fetch: func(_ context.Context, c *agentbox.Client, args []string) ([]testItem, error) {
			if c == nil {
				t.Error("fetch got no client")
			}
			gotArgs = args
			if len(args) > 0 && args[0] == "fail" {
				return nil, errors.New("boom")
			}
			if len(args) > 0 && args[0] == "none" {
				return nil, nil
			}
			return items, nil
		},
		doc:    func(is []testItem) any { return testItemList{Items: is} },
		header: "NAME\tN",
		row:    func(i testItem) string { return fmt.Sprintf("%s\t%d", i.Name, i.N) },
	}
	cmd := func(l listing[testItem]) *cobra.Command {
		return &cobra.Command{Use: "items [X]", Args: cobra.MaximumNArgs(1), RunE: l.run}
	}

	// The table: columns 3 spaces apart by default, pad when set.
	out, _, err := runUnder(t, cmd(l), "items", "x")
	if err != nil || out != "NAME          N\na             1\nlonger-name   22\n" {
		t.Fatalf("table = %q, %v", out, err)
	}
	if len(gotArgs) != 1 || gotArgs[0] != "x" {
		t.Fatalf("fetch got args %q, want [x]", gotArgs)
	}
	narrow := l
	narrow.pad = 2
	if out, _, _ := runUnder(t, cmd(narrow), "items"); out != "NAME         N\na            1\nlonger-name  22\n" {
		t.Fatalf("table with pad 2 = %q", out)
	}
	if out, _, _ := runUnder(t, cmd(l), "items", "none"); out != "NAME   N\n" {
		t.Fatalf("empty table = %q, want the header alone", out)
	}

	// --json: the wrapper of doc, or the bare array without it; never null.
	if out, _, _ := runUnder(t, cmd(l), "--json", "items"); out != "{\n  \"items\": [\n    {\n      \"name\": \"a\",\n      \"n\": 1\n    },\n    {\n      \"name\": \"longer-name\",\n      \"n\": 22\n    }\n  ]\n}\n" {
		t.Fatalf("--json = %q", out)
	}
	if out, _, _ := runUnder(t, cmd(l), "--json", "items", "none"); out != "{\n  \"items\": []\n}\n" {
		t.Fatalf("--json of no items = %q, want an empty array", out)
	}
	bare := l
	bare.doc = nil
	if out, _, _ := runUnder(t, cmd(bare), "--json", "items", "none"); out != "[]\n" {
		t.Fatalf("bare --json of no items = %q, want []", out)
	}

	// A fetch error is returned, nothing printed.
	if out, _, err := runUnder(t, cmd(l), "items", "fail"); err == nil || err.Error() != "boom" || out != "" {
		t.Fatalf("failing fetch: %q, %v", out, err)
	}
}

func TestLsCommandAndNoArgs(t *testing.T) {
	list := func(_ *agentbox.Client, _ context.Context) ([]testItem, error) { return []testItem{{"a", 1}}, nil }
	ls := lsCommand("List items", listing[testItem]{fetch: noArgs(list), header: "NAME\tN", row: func(i testItem) string { return i.Name + "\t" + fmt.Sprint(i.N) }})
	if ls.Use != "ls" || ls.Short != "List items" || len(ls.Aliases) != 1 || ls.Aliases[0] != "list" {
		t.Fatalf("lsCommand built %q %q %q", ls.Use, ls.Short, ls.Aliases)
	}
	if out, _, err := runUnder(t, ls, "list"); err != nil || out != "NAME   N\na      1\n" {
		t.Fatalf("ls = %q, %v", out, err)
	}
	if _, _, err := runUnder(t, ls, "ls", "extra"); err == nil {
		t.Fatal("ls accepted an argument")
	}
}

func TestPrintResult(t *testing.T) {
	for _, tc := range []struct {
		asJSON bool
		want   string
	}{
		{false, "id-1\n"},
		{true, "{\n  \"name\": \"x\",\n  \"n\": 2\n}\n"},
	} {
		var out bytes.Buffer
		cmd := &cobra.Command{}
		cmd.SetOut(&out)
		if err := printResult(cmd, tc.asJSON, testItem{"x", 2}, "id-1"); err != nil || out.String() != tc.want {
			t.Errorf("printResult(json=%v) = %q, %v; want %q", tc.asJSON, out.String(), err, tc.want)
		}
	}
}

func TestRemoveCommand(t *testing.T) {
	var called []string
	del := func(c *agentbox.Client, _ context.Context, id string) error {
		if c == nil {
			t.Error("del got no client")
		}
		called = append(called, id)
		if strings.HasPrefix(id, "bad") {
			return fmt.Errorf("deleting %s: not found", id)
		}
		return nil
	}

	rm := removeCommand("rm ID...", "Delete things", removeQuiet, del)
	if rm.Use != "rm ID..." || rm.Short != "Delete things" || len(rm.Aliases) != 1 || rm.Aliases[0] != "delete" {
		t.Fatalf("removeCommand built %q %q %q", rm.Use, rm.Short, rm.Aliases)
	}
	out, errOut, err := runUnder(t, rm, "delete", "a", "bad1", "b", "bad2")
	if strings.Join(called, " ") != "a bad1 b bad2" {
		t.Fatalf("del called for %q, want every id in order", called)
	}
	if out != "" || errOut != "" || err == nil || err.Error() != "deleting bad1: not found\ndeleting bad2: not found" {
		t.Fatalf("quiet rm: stdout %q, stderr %q, err %v; want nothing printed and the failures joined", out, errOut, err)
	}
	if _, _, err := runUnder(t, rm, "rm"); err == nil {
		t.Fatal("rm without ids accepted")
	}

	called = nil
	rm = removeCommand("rm ID...", "Delete things", removeEcho, del)
	out, errOut, err = runUnder(t, rm, "rm", "a", "bad1", "b", "bad2")
	if strings.Join(called, " ") != "a bad1 b bad2" {
		t.Fatalf("del called for %q, want every id in order", called)
	}
	if out != "a\nb\n" || errOut != "agentbox: deleting bad1: not found\n" || err == nil || err.Error() != "deleting bad2: not found" {
		t.Fatalf("echo rm: stdout %q, stderr %q, err %v; want the ids removed, all failures but the last printed, the last returned", out, errOut, err)
	}
	if out, _, err := runUnder(t, rm, "rm", "a"); err != nil || out != "a\n" {
		t.Fatalf("echo rm a: %q, %v", out, err)
	}
}
