package diskquota

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
)

// The structs and numbers handed to the kernel match its headers
// (include/uapi/linux/dqblk_xfs.h, fs.h, quota.h).
func TestKernelABI(t *testing.T) {
	var q fsDiskQuota
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(fs_disk_quota)", unsafe.Sizeof(q), 112},
		{"d_blk_hardlimit", unsafe.Offsetof(q.BlkHardLimit), 8},
		{"d_bcount", unsafe.Offsetof(q.BCount), 40},
		{"d_icount", unsafe.Offsetof(q.ICount), 48},
		{"d_itimer", unsafe.Offsetof(q.ITimer), 56},
		{"d_iwarns", unsafe.Offsetof(q.IWarns), 64},
		{"d_rtb_hardlimit", unsafe.Offsetof(q.RtbHardLimit), 72},
		{"d_rtbtimer", unsafe.Offsetof(q.RtbTimer), 96},
		{"sizeof(fsxattr)", unsafe.Sizeof(fsxattr{}), 28},
		{"QCMD(Q_XGETQUOTA, PRJQUOTA)", qcmd(qXGetQuota), 0x580302},
		{"QCMD(Q_XSETQLIM, PRJQUOTA)", qcmd(qXSetQLim), 0x580402},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}

func TestFindMount(t *testing.T) {
	const info = `22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
36 22 7:3 / /var/lib/agent\040box rw,noatime shared:7 master:2 - xfs /dev/loop3 rw,attr2,inode64,logbufs=8,logbsize=32k,prjquota
37 22 7:3 /sub /mnt/bind rw,noatime - xfs /dev/loop3 rw,attr2,inode64,prjquota
40 22 7:4 / /mnt/acct rw - xfs /dev/loop4 rw,attr2,pqnoenforce
`
	e, ok, err := findMount(strings.NewReader(info), "7:3")
	if err != nil || !ok {
		t.Fatalf("findMount: %v %v", ok, err)
	}
	if e.point != "/var/lib/agent box" || e.fsType != "xfs" || e.source != "/dev/loop3" || !e.enforcesProjectQuota() {
		t.Fatalf("entry %+v", e)
	}
	if e, ok, _ := findMount(strings.NewReader(info), "7:4"); !ok || e.enforcesProjectQuota() {
		t.Fatalf("pqnoenforce counted as enforcing: %+v", e)
	}
	if e, ok, _ := findMount(strings.NewReader(info), "254:1"); !ok || e.enforcesProjectQuota() || e.point != "/" {
		t.Fatalf("root entry %+v", e)
	}
	if _, ok, _ := findMount(strings.NewReader(info), "8:0"); ok {
		t.Fatalf("found a device that is not mounted")
	}
}

// Project ids set on a directory are inherited by what is made in it. XFS
// keeps project ids without quotas too, so this runs on any XFS.
func TestDirProject(t *testing.T) {
	mnt := testutil.LoopFS(t, "xfs", 512)
	dir := filepath.Join(mnt, "sb")
	if err := os.Mkdir(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if prid, inherit, err := DirProject(dir); err != nil || prid != 0 || inherit {
		t.Fatalf("fresh dir: project %d inherit %v, %v", prid, inherit, err)
	}
	if err := setDirProject(dir, projectFirst+7); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "upper", "work")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Join(dir, "upper"), sub} {
		if prid, inherit, err := DirProject(d); err != nil || prid != projectFirst+7 || !inherit {
			t.Fatalf("%s: project %d inherit %v, %v", d, prid, inherit, err)
		}
	}
	// A rename into another project's dir is refused (why the whole
	// sandbox dir is one project).
	other := filepath.Join(mnt, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, filepath.Join(dir, "other")); err == nil {
		t.Fatalf("renaming a project-0 dir into project %d succeeded", projectFirst+7)
	}
}

// Detect picks the project method only on XFS mounted with prjquota and no
// loop images in use, the loop method elsewhere, and says why.
func TestDetect(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "mkfs.ext4")
	testutil.RequiresFile(t, "/dev/loop-control", "loop devices")

	plain := testutil.LoopFS(t, "xfs", 512)
	q, why := Detect(plain, filepath.Join(plain, "disks"))
	if q == nil || q.Method() != MethodLoop || why == nil || !strings.Contains(why.Error(), "prjquota") || !errors.Is(why, errdefs.ErrFailedPrecondition) {
		t.Fatalf("XFS without prjquota: %v, %v", q, why)
	}
	ext := t.TempDir()
	if q, why := Detect(ext, filepath.Join(ext, "disks")); q == nil || q.Method() != MethodLoop || why == nil {
		t.Fatalf("%s: %v, %v", ext, q, why)
	}

	mnt := testutil.XFSProjectQuotaFS(t, 512)
	state := filepath.Join(mnt, "disks")
	q, why = Detect(mnt, state)
	if why != nil || q == nil || q.Method() != MethodProject {
		t.Fatalf("XFS -o prjquota: %v, %v", q, why)
	}
	// Sandboxes of an earlier daemon with loop images keep the loop method.
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "sb1.img"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if q, why := Detect(mnt, state); q == nil || q.Method() != MethodLoop || why == nil || !strings.Contains(why.Error(), "loop images") {
		t.Fatalf("with a loop image: %v, %v", q, why)
	}
}

// fakeQuotas stands in for the kernel's project quotas (quotactl), so the
// project method's bookkeeping is tested on any XFS, quotas or not.
type fakeQuotas struct {
	mu sync.Mutex
	q  map[uint32]fsDiskQuota
}

func (f *fakeQuotas) ctl(cmd, prid uint32, q *fsDiskQuota) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch cmd {
	case qXGetQuota:
		got, ok := f.q[prid]
		if !ok {
			return unix.ENOENT
		}
		*q = got
	case qXSetQLim:
		cur := f.q[prid]
		if q.FieldMask&fsDqBHard != 0 {
			cur.BlkHardLimit = q.BlkHardLimit
		}
		if q.FieldMask&fsDqBSoft != 0 {
			cur.BlkSoftLimit = q.BlkSoftLimit
		}
		if q.FieldMask&fsDqIHard != 0 {
			cur.InoHardLimit = q.InoHardLimit
		}
		if q.FieldMask&fsDqISoft != 0 {
			cur.InoSoftLimit = q.InoSoftLimit
		}
		if cur.empty() {
			delete(f.q, prid)
		} else {
			f.q[prid] = cur
		}
	default:
		return unix.EINVAL
	}
	return nil
}

// Ids are allocated in the range, skipping ids in use, rotating, and
// persisted; Apply leaves nothing behind on error; Remove deletes the dir
// and frees the id; a reopened table knows what was handed out.
func TestProjectBookkeeping(t *testing.T) {
	mnt := testutil.LoopFS(t, "xfs", 512)
	ctx := context.Background()
	fake := &fakeQuotas{q: map[uint32]fsDiskQuota{}}
	state := filepath.Join(mnt, "disks", ProjectTable)
	open := func() *Project {
		p := &Project{root: mnt, state: state, ctl: fake.ctl, first: projectFirst, count: 4}
		if err := p.load(); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := open()
	apply := func(id string) (uint32, error) {
		dir := filepath.Join(mnt, id)
		if err := os.MkdirAll(dir, 0o711); err != nil {
			t.Fatal(err)
		}
		if err := p.Apply(ctx, dir, id, Limits{Bytes: 32<<20 + 1, Inodes: 100}); err != nil {
			return 0, err
		}
		prid, inherit, err := DirProject(dir)
		if err != nil || !inherit {
			t.Fatalf("%s: project %d inherit %v, %v", id, prid, inherit, err)
		}
		return prid, nil
	}

	if prid, err := apply("sb1"); err != nil || prid != projectFirst {
		t.Fatalf("sb1: project %d, %v", prid, err)
	}
	if q := fake.q[projectFirst]; q.BlkHardLimit != 32<<20/512+1 || q.InoHardLimit != 100 || q.BlkSoftLimit != 0 {
		t.Fatalf("limits set: %+v", q)
	}
	if b, err := os.ReadFile(state); err != nil || !strings.Contains(string(b), `"sb1":16777216`) {
		t.Fatalf("table %s, %v", b, err)
	}
	// Someone else's project is skipped.
	fake.q[projectFirst+1] = fsDiskQuota{BCount: 8}
	if prid, err := apply("sb2"); err != nil || prid != projectFirst+2 {
		t.Fatalf("sb2: project %d, %v", prid, err)
	}
	if u, err := p.Usage("", "sb2"); err != nil || u.BytesTotal != 32<<20+512 || u.InodesTotal != 100 {
		t.Fatalf("Usage = %+v, %v", u, err)
	}
	// Remove deletes the dir and frees the id; a fresh id is not the one
	// just freed.
	if err := p.Remove(ctx, filepath.Join(mnt, "sb1"), "sb1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "sb1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sb1's dir after Remove: %v", err)
	}
	if _, ok := fake.q[projectFirst]; ok {
		t.Fatalf("sb1's limits left after Remove")
	}
	if prid, err := apply("sb3"); err != nil || prid != projectFirst+3 {
		t.Fatalf("sb3: project %d, %v", prid, err)
	}
	if prid, err := apply("sb4"); err != nil || prid != projectFirst {
		t.Fatalf("sb4: project %d, %v", prid, err)
	}
	if _, err := apply("sb5"); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("sb5 with the range used up: %v", err)
	}
	// A failed Apply (no dir) leaves no limits and no entry.
	delete(fake.q, projectFirst+1)
	if err := p.Apply(ctx, filepath.Join(mnt, "missing"), "sb6", Limits{Bytes: 32 << 20}); err == nil {
		t.Fatal("Apply on a missing dir succeeded")
	}
	if _, ok := fake.q[projectFirst+1]; ok || len(fake.q) != 3 {
		t.Fatalf("limits after a failed Apply: %v", fake.q)
	}
	if err := p.Remove(ctx, filepath.Join(mnt, "sb2"), "nobody"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "sb2")); err != nil {
		t.Fatalf("Remove of a sandbox without a project touched another dir: %v", err)
	}

	p2 := open()
	if ids, _ := p2.IDs(); !slices.Equal(ids, []string{"sb2", "sb3", "sb4"}) {
		t.Fatalf("IDs after reopening = %v", ids)
	}
	if _, err := p2.Usage("", "sb1"); !errdefs.IsNotFound(err) {
		t.Fatalf("Usage of a removed sandbox: %v", err)
	}
}
