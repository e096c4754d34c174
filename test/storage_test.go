package test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	agentbox "github.com/agentbox/agentbox/sdk/go"

	"github.com/agentbox/agentbox/internal/testutil"
)

// newDaemonIn starts a daemon whose data dir is on the file system mounted
// at mnt (see testutil.LoopFS; "": the suite's temp dir), with extra
// environment (name, value pairs).
func newDaemonIn(t testing.TB, mnt string, env ...string) *daemon {
	t.Helper()
	testutil.RequiresRoot(t)
	dir := filepath.Join("/tmp", "abx-"+randHex(4))
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if mnt == "" {
		mnt = dir
	}
	for i := 0; i+1 < len(env); i += 2 {
		t.Setenv(env[i], env[i+1])
	}
	d := &daemon{
		t:       t,
		dir:     dir,
		dataDir: filepath.Join(mnt, "data"),
		socket:  filepath.Join(dir, "run", "agentbox.sock"),
		logPath: filepath.Join(dir, "daemon.log"),
	}
	d.start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if d.cmd != nil && d.client != nil {
			if sbs, err := d.client.List(ctx, nil); err == nil {
				for _, sb := range sbs {
					_ = sb.Delete(ctx)
				}
			}
		}
		d.stop(syscall.SIGTERM)
		if t.Failed() {
			if b, err := os.ReadFile(d.logPath); err == nil {
				t.Logf("daemon log:\n%s", tail(string(b), 60))
			}
		}
		_ = os.RemoveAll(dir)
		_ = os.RemoveAll(d.dataDir)
	})
	return d
}

const undoScript = `mkdir -p /root/app && echo "create table t(x int);" > /root/app/001.sql &&
dd if=/dev/urandom of=/root/app/blob bs=1k count=300 2>/dev/null && ln /root/app/001.sql /root/app/hard &&
mkdir -p /root/opq && echo old > /root/opq/old && ln -s 001.sql /root/app/link`

const sums = `cd / && find root bin -xdev | sort | while read f; do if [ -L "$f" ]; then echo "$f -> $(readlink $f)"; elif [ -f "$f" ]; then echo "$f $(sha256sum < $f)"; else echo "$f dir"; fi; done`

// The fast driver is chosen on a file system that can clone, reported in
// info, and checkpoints and restores are byte-exact with it.
func TestStorageDriverReflink(t *testing.T) {
	mnt := testutil.LoopFS(t, "xfs", 1024)
	d := newDaemonIn(t, mnt)
	ctx := context.Background()
	info, err := d.client.Info(ctx)
	if err != nil || info.StorageDriver != "reflink" {
		t.Fatalf("info on xfs reflink=1: driver %q, %v", info.StorageDriver, err)
	}
	sb := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, sb, undoScript)
	want := mustRun(t, sb, sums)
	ck, err := sb.Checkpoint(ctx, "before")
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, sb, "rm -rf /root/app /bin/ls && echo junk > /root/opq/new")
	if _, err := sb.Restore(ctx, ck.ID); err != nil {
		t.Fatal(err)
	}
	if got := mustRun(t, sb, sums); got != want {
		t.Fatalf("after restore on the reflink driver:\n%s\nwant:\n%s", got, want)
	}
	// The default data dir of the suite (/tmp) is ext4 here: copy.
	d2 := newDaemon(t)
	if info, err := d2.client.Info(ctx); err != nil || (info.StorageDriver != "copy" && info.StorageDriver != "reflink") {
		t.Fatalf("info: driver %q, %v", info.StorageDriver, err)
	}
}

// Export a checkpoint as an OCI image, import it as a template: sandboxes
// of the template see the checkpoint's files, deletions included, and the
// template's layers are the checkpoint's (same chain of tree hashes).
func TestOCIExportImportThroughAPI(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, sb, undoScript+" && rm /bin/ls && rm -rf /root/opq && mkdir /root/opq && echo new > /root/opq/new")
	want := mustRun(t, sb, sums)
	ck, err := sb.Checkpoint(ctx, "export-me")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := d.client.ExportCheckpoint(ctx, ck.ID)
	if err != nil {
		t.Fatal(err)
	}
	var img bytes.Buffer
	if _, err := io.Copy(&img, rc); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	tmpl, err := d.client.ImportTemplate(ctx, "from-ck", bytes.NewReader(img.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.ID != ck.Layers[0] {
		t.Fatalf("imported template %s, checkpoint top layer %s: tree hashes differ", tmpl.ID, ck.Layers[0])
	}
	sb2 := d.create(t, agentbox.SandboxSpec{Template: "from-ck"})
	if got := mustRun(t, sb2, sums); got != want {
		t.Fatalf("sandbox of the imported template:\n%s\nwant:\n%s", got, want)
	}
	if res := run(t, sb2, "test -e /bin/ls"); res.ExitCode == 0 {
		t.Fatal("/bin/ls deleted before the checkpoint is back")
	}
	if out := mustRun(t, sb2, "ls /root/opq"); strings.TrimSpace(out) != "new" {
		t.Fatalf("opaque dir: %q", out)
	}

	// Template export, then import of the layout directory on the host.
	rc, err = d.client.ExportTemplate(ctx, "from-ck")
	if err != nil {
		t.Fatal(err)
	}
	layout := t.TempDir()
	untar(t, rc, layout)
	rc.Close()
	for _, f := range []string{"oci-layout", "index.json", "manifest.json"} {
		if _, err := os.Stat(filepath.Join(layout, f)); err != nil {
			t.Errorf("exported archive lacks %s: %v", f, err)
		}
	}
	t2, err := d.client.ImportTemplateDir(ctx, "from-dir", layout)
	if err != nil {
		t.Fatal(err)
	}
	if t2.ID != tmpl.ID {
		t.Fatalf("layout import %s, want %s", t2.ID, tmpl.ID)
	}
	// A missing template is 404, garbage is 400.
	if _, err := d.client.ExportTemplate(ctx, "nope"); !agentbox.IsNotFound(err) {
		t.Errorf("export of a missing template: %v", err)
	}
	if _, err := d.client.ImportTemplate(ctx, "bad", strings.NewReader("not a tar")); err == nil {
		t.Error("garbage imported")
	}
}

func untar(t *testing.T, r io.Reader, dir string) {
	t.Helper()
	cmd := exec.Command("tar", "-x", "-C", dir)
	cmd.Stdin = r
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v: %s", err, out)
	}
}

// Chains deeper than the limit are squashed: after many checkpoint and
// restore cycles the sandbox runs on a short chain with the same files;
// the layers replaced by the squash are collected.
func TestChainSquashAndGC(t *testing.T) {
	d := newDaemonIn(t, "", "AGENTBOX_MAX_LAYER_DEPTH", "4")
	ctx := context.Background()
	sb := d.create(t, agentbox.SandboxSpec{})
	var last agentbox.Checkpoint
	for i := range 7 {
		mustRun(t, sb, fmt.Sprintf("mkdir -p /root/r && rm -f /root/r/* && echo %s > /root/r/f%d", strings.Repeat("x", i+1), i))
		ck, err := sb.Checkpoint(ctx, "round")
		if err != nil {
			t.Fatal(err)
		}
		if len(ck.Layers) > 4 {
			t.Fatalf("round %d: checkpoint chain of %d layers, limit 4", i, len(ck.Layers))
		}
		if _, err := sb.Restore(ctx, ck.ID); err != nil {
			t.Fatal(err)
		}
		last = ck
	}
	want := "/root/r/f6 xxxxxxx\n"
	if got := mustRun(t, sb, `for f in /root/r/*; do echo "$f $(cat $f)"; done`); got != want {
		t.Fatalf("files after squashed cycles: %q, want %q", got, want)
	}
	// Every checkpoint but the last is deleted: their layers and the
	// chains replaced by squashes become garbage, the last one's stays.
	cks, err := sb.Checkpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ck := range cks {
		if ck.ID != last.ID {
			if err := d.client.DeleteCheckpoint(ctx, ck.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	res, err := d.client.CollectGarbage(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gc: %+v", res)
	if res.Layers > len(last.Layers)+1 {
		t.Errorf("%d layers left, want at most the template's and the last checkpoint's (%d)", res.Layers, len(last.Layers)+1)
	}
	// Nothing in use was collected: the sandbox and a restore still work.
	if _, err := sb.Restore(ctx, last.ID); err != nil {
		t.Fatal(err)
	}
	if got := mustRun(t, sb, `for f in /root/r/*; do echo "$f $(cat $f)"; done`); got != want {
		t.Fatalf("after GC and restore: %q", got)
	}
	sb2 := d.create(t, agentbox.SandboxSpec{})
	mustRun(t, sb2, "test -x /bin/sh")
	// A restarted daemon collects at start-up and keeps what is in use.
	d.restart(syscall.SIGTERM)
	mustRun(t, d.client.Sandbox(sb.ID()), "test -f /root/r/f6")
}
