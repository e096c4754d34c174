package test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func changesByPath(d agentbox.Diff) map[string]api.DiffChange {
	out := map[string]api.DiffChange{}
	for _, c := range d.Changes {
		out[c.Path] = c
	}
	return out
}

func wantChange(t *testing.T, ch map[string]api.DiffChange, path, kind string) api.DiffChange {
	t.Helper()
	c, ok := ch[path]
	if !ok {
		t.Fatalf("no change at %s (changes: %v)", path, keys(ch))
	}
	if c.Change != kind {
		t.Fatalf("%s: %s, want %s", path, c.Change, kind)
	}
	return c
}

func keys(m map[string]api.DiffChange) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestDiff compares a sandbox with its checkpoint and its template after
// files were added, modified and deleted (a template file included), and
// checks that a symlink planted inside is reported, never followed.
func TestDiff(t *testing.T) { diff(t, "native") }

// TestDiffGvisor: the same on the gvisor backend.
func TestDiffGvisor(t *testing.T) {
	requiresRunsc(t)
	diff(t, "gvisor")
}

func diff(t *testing.T, rt string) {
	d := newDaemon(t)
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{Template: "busybox", Runtime: rt})
	mustRun(t, sb, "mkdir -p /root/app && echo hello > /root/app/a.txt && printf 'one\\ntwo\\nthree\\n' > /root/m.txt && echo bye > /root/gone.txt")
	ck, err := sb.Checkpoint(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, sb, "printf 'one\\nTWO\\nthree\\n' > /root/m.txt && rm /root/gone.txt && echo new > /root/new.txt && chmod 600 /root/app/a.txt && rm /bin/ls"+
		" && ln -s / /root/rootlink && ln -s /etc/shadow /root/evil")

	df, err := d.client.Diff(ctx, "checkpoint:"+ck.ID, "sandbox:"+sb.ID(), true)
	if err != nil {
		t.Fatal(err)
	}
	ch := changesByPath(df)
	m := wantChange(t, ch, "/root/m.txt", api.ChangeModified)
	if m.From.SHA256 != sha("one\ntwo\nthree\n") || m.To.SHA256 != sha("one\nTWO\nthree\n") {
		t.Errorf("m.txt hashes %s -> %s", m.From.SHA256, m.To.SHA256)
	}
	if !strings.Contains(m.Unified, "-two") || !strings.Contains(m.Unified, "+TWO") || !strings.Contains(m.Unified, " one") {
		t.Errorf("unified diff of m.txt:\n%s", m.Unified)
	}
	wantChange(t, ch, "/root/gone.txt", api.ChangeDeleted)
	if c := wantChange(t, ch, "/root/new.txt", api.ChangeAdded); c.To.Size != 4 || c.To.Type != "file" || c.To.UID != 0 {
		t.Errorf("new.txt meta %+v", c.To)
	}
	if c := wantChange(t, ch, "/root/app/a.txt", api.ChangeModified); c.From.Mode != 0o644 || c.To.Mode != 0o600 {
		t.Errorf("a.txt modes %o -> %o", c.From.Mode, c.To.Mode)
	}
	wantChange(t, ch, "/bin/ls", api.ChangeDeleted)
	if c := wantChange(t, ch, "/root/rootlink", api.ChangeAdded); c.To.Type != "symlink" || c.To.Target != "/" {
		t.Errorf("rootlink %+v", c.To)
	}
	if c := wantChange(t, ch, "/root/evil", api.ChangeAdded); c.To.Type != "symlink" || c.To.Target != "/etc/shadow" || c.To.Size == 0 && c.To.SHA256 != "" {
		t.Errorf("evil %+v", c.To)
	}
	for p := range ch {
		if strings.HasPrefix(p, "/root/rootlink/") || strings.HasPrefix(p, "/root/evil/") {
			t.Fatalf("diff followed a symlink: %s", p)
		}
	}
	if df.Added != 3 || df.Deleted != 2 || df.Modified < 2 {
		t.Errorf("counts: %d added, %d modified, %d deleted", df.Added, df.Modified, df.Deleted)
	}

	// Against the template: everything since creation, the template file
	// deletion included; bare refs resolve too.
	dt, err := d.client.Diff(ctx, "busybox", sb.ID(), false)
	if err != nil {
		t.Fatal(err)
	}
	if dt.From != "template:busybox" || dt.To != "sandbox:"+sb.ID() {
		t.Errorf("resolved refs %s %s", dt.From, dt.To)
	}
	ch = changesByPath(dt)
	wantChange(t, ch, "/bin/ls", api.ChangeDeleted)
	wantChange(t, ch, "/root/app/a.txt", api.ChangeAdded)
	wantChange(t, ch, "/root/m.txt", api.ChangeAdded)
	if _, ok := ch["/root/gone.txt"]; ok {
		t.Error("gone.txt is in the diff against the template")
	}
	// A checkpoint against itself: nothing.
	if same, err := d.client.Diff(ctx, ck.ID, "checkpoint:c1", false); err != nil || len(same.Changes) != 0 {
		t.Fatalf("checkpoint vs itself: %v %+v", err, same)
	}
	if _, err := d.client.Diff(ctx, "sandbox:nosuch", ck.ID, false); !agentbox.IsNotFound(err) {
		t.Fatalf("unknown sandbox: %v", err)
	}
}

// TestMerge merges a fork back into its parent without conflicts (the
// fork's files arrive byte-identical), then with a conflict (409, nothing
// applied: same tree hash), then with a strategy.
func TestMerge(t *testing.T) { merge(t, "native") }

// TestMergeGvisor: the same on the gvisor backend.
func TestMergeGvisor(t *testing.T) {
	requiresRunsc(t)
	merge(t, "gvisor")
}

func merge(t *testing.T, rt string) {
	d := newDaemon(t)
	ctx := context.Background()
	parent := d.create(t, agentbox.SandboxSpec{Template: "busybox", Runtime: rt})
	mustRun(t, parent, "mkdir -p /root/proj && echo base > /root/proj/shared.txt && echo old > /root/proj/gone.txt && echo keep > /root/proj/p.txt")
	forks, err := parent.Fork(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	fork := forks[0]
	mustRun(t, fork, "mkdir -p /root/proj/feature && dd if=/dev/urandom of=/root/proj/feature/blob bs=1k count=300 2>/dev/null"+
		" && echo fork-edit > /root/proj/f.txt && rm /root/proj/gone.txt && ln -s feature/blob /root/proj/link && chmod 750 /root/proj/feature")
	mustRun(t, parent, "echo parent-edit > /root/proj/p.txt")

	res, err := parent.Merge(ctx, fork.ID(), agentbox.MergeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Conflicts) != 0 || res.Base == "" || res.Checkpoint == "" {
		t.Fatalf("merge result %+v", res)
	}
	applied := map[string]bool{}
	for _, a := range res.Applied {
		applied[a.Path] = true
	}
	for _, p := range []string{"/root/proj/feature", "/root/proj/feature/blob", "/root/proj/f.txt", "/root/proj/gone.txt", "/root/proj/link"} {
		if !applied[p] {
			t.Errorf("%s not applied (applied: %v)", p, res.Applied)
		}
	}
	sum := "sha256sum /root/proj/feature/blob /root/proj/f.txt && stat -c '%a %U' /root/proj/feature && readlink /root/proj/link"
	if got, want := mustRun(t, parent, sum), mustRun(t, fork, sum); got != want {
		t.Fatalf("merged files differ:\nparent: %s\nfork:   %s", got, want)
	}
	if out := run(t, parent, "cat /root/proj/gone.txt"); out.ExitCode == 0 {
		t.Error("gone.txt survived the merge")
	}
	if got := mustRun(t, parent, "cat /root/proj/p.txt"); got != "parent-edit\n" {
		t.Errorf("the parent's own change was lost: %q", got)
	}

	// Both change shared.txt: a conflict, and nothing is applied.
	mustRun(t, parent, "echo parent-version > /root/proj/shared.txt")
	mustRun(t, fork, "echo fork-version > /root/proj/shared.txt && echo more > /root/proj/more.txt")
	before, err := parent.TreeHash(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = parent.Merge(ctx, fork.ID(), agentbox.MergeOptions{})
	var mce *agentbox.MergeConflictError
	if !errors.As(err, &mce) || !agentbox.IsConflict(err) {
		t.Fatalf("conflicting merge: %v", err)
	}
	if len(mce.Conflicts) != 1 || mce.Conflicts[0].Path != "/root/proj/shared.txt" ||
		mce.Conflicts[0].Ours.SHA256 != sha("parent-version\n") || mce.Conflicts[0].Theirs.SHA256 != sha("fork-version\n") {
		t.Fatalf("conflicts %+v", mce.Conflicts)
	}
	after, err := parent.TreeHash(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Fatal("a refused merge changed the target")
	}
	if out := run(t, parent, "cat /root/proj/more.txt"); out.ExitCode == 0 {
		t.Fatal("a refused merge applied a non-conflicting change")
	}

	// A dry run reports; "theirs" takes the fork's version.
	dry, err := parent.Merge(ctx, fork.ID(), agentbox.MergeOptions{Strategy: api.MergeTheirs, DryRun: true})
	if err != nil || len(dry.Conflicts) != 1 || dry.Checkpoint != "" {
		t.Fatalf("dry run: %v %+v", err, dry)
	}
	if h, _ := parent.TreeHash(ctx); h != before {
		t.Fatal("a dry run changed the target")
	}
	res, err = parent.Merge(ctx, fork.ID(), agentbox.MergeOptions{Strategy: api.MergeTheirs})
	if err != nil {
		t.Fatal(err)
	}
	if got := mustRun(t, parent, "cat /root/proj/shared.txt /root/proj/more.txt"); got != "fork-version\nmore\n" {
		t.Fatalf("after merge with theirs: %q", got)
	}
	// The pre-merge checkpoint undoes it.
	if _, err := parent.Restore(ctx, res.Checkpoint); err != nil {
		t.Fatal(err)
	}
	if h, _ := parent.TreeHash(ctx); h != before {
		t.Fatal("restoring the merge checkpoint did not undo the merge")
	}
	// Unrelated sandboxes have no fork point.
	other := d.create(t, agentbox.SandboxSpec{Template: "busybox"})
	var ae *agentbox.APIError
	if _, err := parent.Merge(ctx, other.ID(), agentbox.MergeOptions{}); !errors.As(err, &ae) || ae.Code != agentbox.CodeFailedPrecondition {
		t.Fatalf("merge of unrelated sandboxes: %v", err)
	}
}

// TestTemplateSave freezes a sandbox as template versions: sandboxes from
// one version start with identical bytes (tree hash), and saving a new
// version changes neither the old version nor its sandboxes.
func TestTemplateSave(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	src := d.create(t, agentbox.SandboxSpec{Template: "busybox"})
	mustRun(t, src, "mkdir -p /opt/tool && echo v1 > /opt/tool/VERSION && rm /bin/vi")
	v1, err := src.SaveTemplate(ctx, "frozen")
	if err != nil {
		t.Fatal(err)
	}
	if v1.Version != 1 || len(v1.TreeHash) != 64 {
		t.Fatalf("v1 %+v", v1)
	}
	a := d.create(t, agentbox.SandboxSpec{Template: "frozen@1"})
	b := d.create(t, agentbox.SandboxSpec{Template: "frozen"})
	ha, err := a.TreeHash(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hb, err := b.TreeHash(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ha != v1.TreeHash || hb != v1.TreeHash {
		t.Fatalf("tree hashes: template %s, sandboxes %s %s", v1.TreeHash, ha, hb)
	}
	if got := mustRun(t, a, "cat /opt/tool/VERSION; test -e /bin/vi || echo no-vi"); got != "v1\nno-vi\n" {
		t.Fatalf("sandbox of v1: %q", got)
	}

	mustRun(t, src, "echo v2 > /opt/tool/VERSION")
	v2, err := src.SaveTemplate(ctx, "frozen")
	if err != nil {
		t.Fatal(err)
	}
	if v2.Version != 2 || v2.TreeHash == v1.TreeHash {
		t.Fatalf("v2 %+v", v2)
	}
	if h, _ := a.TreeHash(ctx); h != v1.TreeHash {
		t.Fatal("saving a new version changed a sandbox of the old one")
	}
	c := d.create(t, agentbox.SandboxSpec{Template: "frozen@1"})
	if h, _ := c.TreeHash(ctx); h != v1.TreeHash {
		t.Fatal("version 1 changed after version 2 was saved")
	}
	e := d.create(t, agentbox.SandboxSpec{Template: "frozen"})
	if h, _ := e.TreeHash(ctx); h != v2.TreeHash {
		t.Fatal("the template's name does not resolve to its newest version")
	}
	byID := d.create(t, agentbox.SandboxSpec{Template: "frozen@" + v1.ID[:16]})
	if h, _ := byID.TreeHash(ctx); h != v1.TreeHash {
		t.Fatal("NAME@<id prefix> did not resolve to version 1")
	}
	vs, err := d.client.TemplateVersions(ctx, "frozen")
	if err != nil || len(vs) != 2 || vs[0].TreeHash != v1.TreeHash || vs[1].TreeHash != v2.TreeHash {
		t.Fatalf("versions %v %+v", err, vs)
	}
	if _, err := src.SaveTemplate(ctx, "busybox"); !agentbox.IsConflict(err) {
		t.Fatalf("saving over a builtin: %v", err)
	}
	if _, err := d.client.Create(ctx, agentbox.SandboxSpec{Template: "frozen@9"}); !agentbox.IsNotFound(err) {
		t.Fatalf("missing version: %v", err)
	}
}
