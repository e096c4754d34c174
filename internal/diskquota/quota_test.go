package diskquota

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
)

// The conformance suite every Quota passes: a sandbox dir capped at 32 MiB
// and 2048 inodes gets ENOSPC (or EDQUOT) past either limit, in nested
// dirs too; Usage reports it; a neighbour with its own quota keeps
// writing; IDs lists both; Remove frees the quota (Usage then answers not
// found) and is idempotent.
func testQuota(t *testing.T, q Quota, base string) {
	t.Helper()
	ctx := context.Background()
	const limit = 32 << 20
	a, b := filepath.Join(base, "sba"), filepath.Join(base, "sbb")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Apply(ctx, a, "sba", Limits{Bytes: limit, Inodes: 2048}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	t.Cleanup(func() { _ = q.Remove(ctx, a, "sba") })
	if err := q.Apply(ctx, b, "sbb", Limits{Bytes: limit}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	t.Cleanup(func() { _ = q.Remove(ctx, b, "sbb") })
	if err := q.Apply(ctx, b, "sbb", Limits{Bytes: limit}); err == nil {
		t.Fatalf("a second Apply for the same sandbox succeeded")
	}

	// Bytes: nested dirs count too (what overlayfs makes in upper/).
	upper := filepath.Join(a, "upper", "root")
	if err := os.MkdirAll(upper, 0o755); err != nil {
		t.Fatal(err)
	}
	n, err := writeZeros(filepath.Join(upper, "fill"), 64<<20)
	if !isNoSpace(err) {
		t.Fatalf("writing 64 MiB under a 32 MiB quota: %d bytes, err %v; want ENOSPC or EDQUOT", n, err)
	}
	if n < limit/2 || n > limit {
		t.Fatalf("wrote %d bytes before running out, want about %d", n, limit)
	}
	u, err := q.Usage(a, "sba")
	if err != nil {
		t.Fatalf("Usage: %v", err)
	}
	if u.Bytes < limit/2 || u.Bytes > limit || u.BytesTotal < limit/2 || u.BytesTotal > limit || u.Inodes < 3 || u.InodesTotal <= 0 || u.InodesTotal > 2048 {
		t.Fatalf("Usage = %+v after filling a %d-byte, 2048-inode quota", u, limit)
	}

	// The neighbour is untouched by a's being full.
	if n, err := writeZeros(filepath.Join(b, "f"), 8<<20); err != nil {
		t.Fatalf("neighbour wrote %d bytes: %v", n, err)
	}

	// Inodes.
	if err := os.Remove(filepath.Join(upper, "fill")); err != nil {
		t.Fatal(err)
	}
	files := 0
	for ; files < 3000; files++ {
		f, err := os.Create(filepath.Join(upper, fmt.Sprintf("f%d", files)))
		if err != nil {
			if !isNoSpace(err) {
				t.Fatalf("creating file %d: %v, want ENOSPC or EDQUOT", files, err)
			}
			break
		}
		f.Close()
	}
	if files < 1500 || files >= 2048 {
		t.Fatalf("created %d files under a 2048-inode quota", files)
	}
	if u, err := q.Usage(a, "sba"); err != nil || u.Inodes < int64(files) {
		t.Fatalf("Usage = %+v, %v after %d files", u, err, files)
	}

	if ids, err := q.IDs(); err != nil || !slices.Contains(ids, "sba") || !slices.Contains(ids, "sbb") {
		t.Fatalf("IDs = %v, %v", ids, err)
	}

	// Remove frees it; again is nothing.
	if err := q.Remove(ctx, a, "sba"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := q.Usage(a, "sba"); !errdefs.IsNotFound(err) {
		t.Fatalf("Usage after Remove: %v, want not found", err)
	}
	if ids, _ := q.IDs(); slices.Contains(ids, "sba") || !slices.Contains(ids, "sbb") {
		t.Fatalf("IDs after Remove = %v", ids)
	}
	if err := q.Remove(ctx, a, "sba"); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if err := q.Remove(ctx, b, "sbb"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if ids, _ := q.IDs(); len(ids) != 0 {
		t.Fatalf("IDs after removing all = %v", ids)
	}
}

// writeZeros writes up to n bytes of zeros to a new file, synced, and
// returns how many were written before an error.
func writeZeros(path string, n int) (int, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 1<<20)
	written := 0
	for written < n {
		m, err := f.Write(buf)
		written += m
		if err != nil {
			f.Close()
			return written, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return written, err
	}
	return written, f.Close()
}

func isNoSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}

func TestLoopQuota(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "mkfs.ext4")
	l, err := NewLoop(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	testQuota(t, l, base)
	if imgs, _ := filepath.Glob(filepath.Join(l.Images, "*")); len(imgs) != 0 {
		t.Fatalf("images left: %v", imgs)
	}
	for _, d := range []string{"sba", "sbb"} {
		if ok, err := IsMountPoint(filepath.Join(base, d)); ok || (err != nil && !errors.Is(err, os.ErrNotExist)) {
			t.Fatalf("%s still mounted (%v)", d, err)
		}
	}
}

// openProject opens the project method on a fresh XFS mounted with
// prjquota.
func openProject(t *testing.T) (*Project, string) {
	t.Helper()
	mnt := testutil.XFSProjectQuotaFS(t, 512)
	root := filepath.Join(mnt, "sandboxes")
	if err := os.Mkdir(root, 0o711); err != nil {
		t.Fatal(err)
	}
	p, err := OpenProject(root, filepath.Join(mnt, "disks", ProjectTable))
	if err != nil {
		t.Fatalf("OpenProject on XFS -o prjquota: %v", err)
	}
	return p, root
}

func TestProjectQuota(t *testing.T) {
	p, root := openProject(t)
	testQuota(t, p, root)
	for _, d := range []string{"sba", "sbb"} {
		if _, err := os.Stat(filepath.Join(root, d)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s left after Remove: %v", d, err)
		}
	}
}

// The same through quotactl(2) on the block device, as on kernels without
// quotactl_fd.
func TestProjectQuotaDevice(t *testing.T) {
	p, root := openProject(t)
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		t.Fatal(err)
	}
	mnt, err := mountOf(st.Dev)
	if err != nil {
		t.Fatal(err)
	}
	p.ctl = devQuotactl(mnt.source)
	testQuota(t, p, root)
}

// A restarted daemon re-adopts the ids it handed out and frees them; a
// freed project has no limits left on the filesystem.
func TestProjectRestart(t *testing.T) {
	p, root := openProject(t)
	ctx := context.Background()
	dir := filepath.Join(root, "sb1")
	if err := os.Mkdir(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(ctx, dir, "sb1", Limits{Bytes: 64 << 20, Inodes: 4096}); err != nil {
		t.Fatal(err)
	}
	prid, inherit, err := DirProject(dir)
	if err != nil || !inherit || prid < projectFirst || prid >= projectFirst+projectCount {
		t.Fatalf("DirProject = %d, %v, %v", prid, inherit, err)
	}
	if err := os.Mkdir(filepath.Join(dir, "upper"), 0o755); err != nil {
		t.Fatal(err)
	}
	if sub, inherit, err := DirProject(filepath.Join(dir, "upper")); err != nil || sub != prid || !inherit {
		t.Fatalf("subdir: project %d inherit %v (%v), want %d inherited", sub, inherit, err, prid)
	}

	p2, err := OpenProject(root, p.state)
	if err != nil {
		t.Fatal(err)
	}
	if ids, _ := p2.IDs(); !slices.Equal(ids, []string{"sb1"}) {
		t.Fatalf("IDs after reopening = %v", ids)
	}
	u, err := p2.Usage(dir, "sb1")
	if err != nil || u.BytesTotal != 64<<20 || u.InodesTotal != 4096 {
		t.Fatalf("Usage after reopening = %+v, %v", u, err)
	}
	if u2, err := ProjectUsage(root, prid); err != nil || u2 != u {
		t.Fatalf("ProjectUsage = %+v, %v; want %+v", u2, err, u)
	}
	if err := p2.Remove(ctx, dir, "sb1"); err != nil {
		t.Fatal(err)
	}
	waitProjectGone(t, root, prid)
	p3, err := OpenProject(root, p.state)
	if err != nil {
		t.Fatal(err)
	}
	if ids, _ := p3.IDs(); len(ids) != 0 {
		t.Fatalf("IDs after Remove and reopening = %v", ids)
	}
}

// waitProjectGone waits until the filesystem holding dir has no quota and
// no usage left for project prid. XFS inactivates unlinked inodes in the
// background, so a removed dir's inodes leave its project's count a
// moment later.
func waitProjectGone(t *testing.T, dir string, prid uint32) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		u, err := ProjectUsage(dir, prid)
		if errdefs.IsNotFound(err) || (err == nil && u == (Usage{})) {
			return
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("project %d: %+v, %v; want none", prid, u, err)
		}
	}
}

// Ids the filesystem already has a quota for (another daemon's, an
// administrator's) are not handed out.
func TestProjectSkipsUsedIDs(t *testing.T) {
	p, root := openProject(t)
	ctx := context.Background()
	if err := p.setLimits(p.first, Limits{Bytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	defer p.setLimits(p.first, Limits{})
	dir := filepath.Join(root, "sb1")
	if err := os.Mkdir(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(ctx, dir, "sb1", Limits{Bytes: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	defer p.Remove(ctx, dir, "sb1")
	if prid, _, err := DirProject(dir); err != nil || prid == p.first {
		t.Fatalf("got project %d (%v); %d is in use", prid, err, p.first)
	}
}
