package diskquota

// The project method: XFS project quotas. Every inode of XFS carries a
// project id, and a directory flagged PROJINHERIT hands its id to what is
// created in it, so a sandbox dir given a project id of its own before its
// upper, work and state dirs are made has everything the sandbox writes
// accounted to that project. Block and inode hard limits on the project
// (quotactl Q_XSETQLIM) then cap the dir; XFS answers ENOSPC beyond them
// and statfs of a dir in the project reports the project's limits, so df
// inside the sandbox shows its quota.
//
// Renames and hard links into a PROJINHERIT dir of another project fail
// with EXDEV, which is why the whole sandbox dir is the project: upper,
// work (overlayfs copies up through it) and the restore trash rename among
// themselves only. A sandbox cannot leave its project: changing an inode's
// project id or PROJINHERIT flag (FS_IOC_FSSETXATTR) is refused outside
// the initial user namespace.
//
// Project ids are allocated from a fixed range the daemon reserves
// (projectFirst..+projectCount), skipping ids the filesystem already has a
// quota or usage for (another daemon's, an administrator's), and persisted
// (a JSON table, sandbox id -> project id) before they are applied, so a
// daemon restarted after a crash finds every id it handed out: IDs lists
// them and the Manager removes those of sandboxes it has no record of.
// Removing a sandbox's quota deletes its dir first, then clears the
// project's limits and frees the id. XFS inactivates unlinked inodes in
// the background, so the project's counts drop to zero (and XFS forgets
// it: no limits, no usage) a moment later; fresh ids rotate through the
// range, so a freed id is not handed out again while that settles.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/google/renameio/v2"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// The project ids the daemon hands out: ids below are left to the
// administrator (/etc/projects conventionally uses small ones).
const (
	projectFirst = 1 << 24
	projectCount = 1 << 20
)

// Project is the project method for the sandbox dirs under one directory of
// an XFS filesystem mounted with project quotas enforced.
type Project struct {
	root  string // the directory the sandbox dirs are under
	state string // the persisted table
	ctl   quotactlFunc
	first uint32 // ids handed out: first..first+count-1
	count uint32

	// mu guards the fields below and the state file.
	mu   sync.Mutex
	ids  map[string]uint32 // project id by sandbox id
	next uint32            // where the search for a free id starts (offset from first)
}

// OpenProject returns the project method for the sandbox dirs under root,
// persisting its table of ids in the file state. It fails with
// errdefs.ErrFailedPrecondition when root's filesystem is not XFS mounted
// with project quotas enforced or quotactl does not answer for it.
func OpenProject(root, state string) (*Project, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil {
		return nil, &Error{Op: "statfs", Path: root, Err: err}
	}
	if fs.Type != unix.XFS_SUPER_MAGIC {
		return nil, fmt.Errorf("%s is not on XFS (filesystem magic %#x): %w", root, fs.Type, errdefs.ErrFailedPrecondition)
	}
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		return nil, &Error{Op: "stat", Path: root, Err: err}
	}
	mnt, err := mountOf(st.Dev)
	if err != nil {
		return nil, err
	}
	if !mnt.enforcesProjectQuota() {
		return nil, fmt.Errorf("XFS at %s is mounted without project quotas enforced (mount option prjquota): %w", mnt.point, errdefs.ErrFailedPrecondition)
	}
	p := &Project{root: root, state: state, ctl: fdQuotactl(root), first: projectFirst, count: projectCount}
	// quotactl_fd (Linux 5.14) names the filesystem by an open directory;
	// older kernels need its block device.
	err = p.probe()
	if errors.Is(err, unix.ENOSYS) {
		var dst unix.Stat_t
		if serr := unix.Stat(mnt.source, &dst); serr == nil && dst.Mode&unix.S_IFMT == unix.S_IFBLK && dst.Rdev == st.Dev {
			p.ctl = devQuotactl(mnt.source)
			err = p.probe()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("project quotas of %s: %w: %w", mnt.point, err, errdefs.ErrFailedPrecondition)
	}
	if err := p.load(); err != nil {
		return nil, err
	}
	return p, nil
}

// probe asks for project 0's quota: an answer, or "none", shows quotactl
// works.
func (p *Project) probe() error {
	if _, err := p.get(0); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// Method implements Quota.
func (p *Project) Method() string { return MethodProject }

// Apply implements Quota: sandbox id gets a free project id, limited to
// lim, and dir carries it with inheritance.
func (p *Project) Apply(ctx context.Context, dir, id string, lim Limits) (err error) {
	if lim.Bytes <= 0 || lim.Inodes < 0 {
		return fmt.Errorf("disk quota of %d bytes, %d inodes: %w", lim.Bytes, lim.Inodes, errdefs.ErrInvalidArgument)
	}
	prid, err := p.allocate(id)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = p.release(id, prid)
		}
	}()
	if err := p.setLimits(prid, lim); err != nil {
		return err
	}
	return setDirProject(dir, prid)
}

// Usage implements Quota, from the project's quota.
func (p *Project) Usage(dir, id string) (Usage, error) {
	p.mu.Lock()
	prid, ok := p.ids[id]
	p.mu.Unlock()
	if !ok {
		return Usage{}, fmt.Errorf("sandbox %s has no project: %w", id, errdefs.ErrNotFound)
	}
	q, err := p.get(prid)
	if err != nil {
		return Usage{}, err
	}
	return q.usage(), nil
}

// Remove implements Quota: it deletes dir, clears the project's limits and
// frees its id.
func (p *Project) Remove(ctx context.Context, dir, id string) error {
	p.mu.Lock()
	prid, ok := p.ids[id]
	p.mu.Unlock()
	if !ok {
		return nil
	}
	// The files go first: a project id handed out again must start empty.
	if err := os.RemoveAll(dir); err != nil {
		return &Error{Op: "remove", Path: dir, Err: err}
	}
	return p.release(id, prid)
}

// IDs implements Quota.
func (p *Project) IDs() ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]string, 0, len(p.ids))
	for id := range p.ids {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

// allocate hands sandbox id a project id that neither this table nor the
// filesystem uses, and persists it before it is used anywhere.
func (p *Project) allocate(id string) (uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.ids[id]; ok {
		return 0, fmt.Errorf("sandbox %s has a project already: %w", id, errdefs.ErrAlreadyExists)
	}
	taken := make(map[uint32]bool, len(p.ids))
	for _, prid := range p.ids {
		taken[prid] = true
	}
	for i := range p.count {
		off := (p.next + i) % p.count
		prid := p.first + off
		if taken[prid] {
			continue
		}
		// Fresh ids rotate through the range, so one just freed is not
		// handed out again at once.
		if q, err := p.get(prid); err == nil && !q.empty() {
			continue
		} else if err != nil && !errors.Is(err, unix.ENOENT) {
			return 0, err
		}
		p.ids[id] = prid
		if err := p.saveLocked(); err != nil {
			delete(p.ids, id)
			return 0, err
		}
		p.next = (off + 1) % p.count
		return prid, nil
	}
	return 0, fmt.Errorf("no free project id in %d..%d: %w", p.first, p.first+p.count-1, errdefs.ErrResourceExhausted)
}

// release clears project prid's limits and frees it from sandbox id.
func (p *Project) release(id string, prid uint32) error {
	if err := p.setLimits(prid, Limits{}); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ids[id] != prid {
		return nil
	}
	delete(p.ids, id)
	if err := p.saveLocked(); err != nil {
		p.ids[id] = prid // kept, so that a retry frees it
		return err
	}
	return nil
}

// projectTable is the persisted form of Project's ids.
type projectTable struct {
	Projects map[string]uint32 `json:"projects"` // project id by sandbox id
}

func (p *Project) load() error {
	p.ids = map[string]uint32{}
	b, err := os.ReadFile(p.state)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return &Error{Op: "read", Path: p.state, Err: err}
	}
	var t projectTable
	if err := json.Unmarshal(b, &t); err != nil {
		return &Error{Op: "parse", Path: p.state, Err: err}
	}
	for id, prid := range t.Projects {
		p.ids[id] = prid
	}
	return nil
}

func (p *Project) saveLocked() error {
	b, err := json.Marshal(projectTable{Projects: p.ids})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p.state), 0o700); err != nil {
		return &Error{Op: "mkdir", Path: filepath.Dir(p.state), Err: err}
	}
	if err := renameio.WriteFile(p.state, b, 0o600); err != nil {
		return &Error{Op: "write", Path: p.state, Err: err}
	}
	return nil
}

// Project quotas through quotactl(2): the XFS quota manager's commands,
// whose limits and counts are in 512-byte basic blocks
// (include/uapi/linux/dqblk_xfs.h).
const (
	qXGetQuota = 'X'<<8 + 3 // Q_XGETQUOTA
	qXSetQLim  = 'X'<<8 + 4 // Q_XSETQLIM
	prjQuota   = 2          // PRJQUOTA

	fsDquotVersion = 1      // FS_DQUOT_VERSION
	fsProjQuota    = 1 << 1 // FS_PROJ_QUOTA
	fsDqISoft      = 1 << 0 // FS_DQ_ISOFT
	fsDqIHard      = 1 << 1 // FS_DQ_IHARD
	fsDqBSoft      = 1 << 2 // FS_DQ_BSOFT
	fsDqBHard      = 1 << 3 // FS_DQ_BHARD

	basicBlock = 512
)

// fsDiskQuota is struct fs_disk_quota (112 bytes, 64-bit aligned).
type fsDiskQuota struct {
	Version      int8
	Flags        int8
	FieldMask    uint16
	ID           uint32
	BlkHardLimit uint64
	BlkSoftLimit uint64
	InoHardLimit uint64
	InoSoftLimit uint64
	BCount       uint64
	ICount       uint64
	ITimer       int32
	BTimer       int32
	IWarns       uint16
	BWarns       uint16
	ITimerHi     int8
	BTimerHi     int8
	RtbTimerHi   int8
	_            int8
	RtbHardLimit uint64
	RtbSoftLimit uint64
	RtbCount     uint64
	RtbTimer     int32
	RtbWarns     uint16
	_            int16
	_            [8]byte
}

func (q *fsDiskQuota) usage() Usage {
	return Usage{
		Bytes:       int64(q.BCount) * basicBlock,
		BytesTotal:  int64(q.BlkHardLimit) * basicBlock,
		Inodes:      int64(q.ICount),
		InodesTotal: int64(q.InoHardLimit),
	}
}

// empty reports a project with no usage and no limits: free to hand out.
func (q *fsDiskQuota) empty() bool {
	return q.BCount == 0 && q.ICount == 0 && q.BlkHardLimit == 0 && q.BlkSoftLimit == 0 && q.InoHardLimit == 0 && q.InoSoftLimit == 0
}

// quotactlFunc runs quotactl command cmd (Q_X*) for project prid.
type quotactlFunc func(cmd, prid uint32, q *fsDiskQuota) error

func qcmd(cmd uint32) uintptr { return uintptr(cmd<<8 | prjQuota) }

// fdQuotactl runs quotactl_fd(2) on the filesystem holding the directory
// dir.
func fdQuotactl(dir string) quotactlFunc {
	return func(cmd, prid uint32, q *fsDiskQuota) error {
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return &Error{Op: "open", Path: dir, Err: err}
		}
		defer unix.Close(fd)
		if _, _, e := unix.Syscall6(unix.SYS_QUOTACTL_FD, uintptr(fd), qcmd(cmd), uintptr(prid), uintptr(unsafe.Pointer(q)), 0, 0); e != 0 {
			return &Error{Op: "quotactl_fd " + quotactlOp(cmd, prid), Path: dir, Err: e}
		}
		return nil
	}
}

// devQuotactl runs quotactl(2) on the block device dev.
func devQuotactl(dev string) quotactlFunc {
	return func(cmd, prid uint32, q *fsDiskQuota) error {
		special, err := unix.BytePtrFromString(dev)
		if err != nil {
			return &Error{Op: "quotactl", Path: dev, Err: err}
		}
		if _, _, e := unix.Syscall6(unix.SYS_QUOTACTL, qcmd(cmd), uintptr(unsafe.Pointer(special)), uintptr(prid), uintptr(unsafe.Pointer(q)), 0, 0); e != 0 {
			return &Error{Op: "quotactl " + quotactlOp(cmd, prid), Path: dev, Err: e}
		}
		return nil
	}
}

func quotactlOp(cmd, prid uint32) string {
	name := "Q_XGETQUOTA"
	if cmd == qXSetQLim {
		name = "Q_XSETQLIM"
	}
	return name + " project " + strconv.FormatUint(uint64(prid), 10)
}

// get returns project prid's quota; ENOENT when the filesystem has none
// (no usage, no limits).
func (p *Project) get(prid uint32) (fsDiskQuota, error) {
	var q fsDiskQuota
	err := p.ctl(qXGetQuota, prid, &q)
	return q, err
}

// setLimits sets project prid's hard limits (no soft limits); zero limits
// clear them.
func (p *Project) setLimits(prid uint32, lim Limits) error {
	q := fsDiskQuota{
		Version:      fsDquotVersion,
		Flags:        fsProjQuota,
		FieldMask:    fsDqBHard | fsDqBSoft | fsDqIHard | fsDqISoft,
		ID:           prid,
		BlkHardLimit: uint64((lim.Bytes + basicBlock - 1) / basicBlock),
		InoHardLimit: uint64(lim.Inodes),
	}
	return p.ctl(qXSetQLim, prid, &q)
}

// ProjectUsage reports the usage and limits of project prid on the
// filesystem holding the directory dir (which must enforce project
// quotas); errdefs.ErrNotFound when the filesystem has none for it.
func ProjectUsage(dir string, prid uint32) (Usage, error) {
	var q fsDiskQuota
	if err := fdQuotactl(dir)(qXGetQuota, prid, &q); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return Usage{}, fmt.Errorf("project %d: %w", prid, errdefs.ErrNotFound)
		}
		return Usage{}, err
	}
	return q.usage(), nil
}

// Project ids of directories: FS_IOC_FSGETXATTR / FS_IOC_FSSETXATTR with
// struct fsxattr (include/uapi/linux/fs.h), not in x/sys/unix.
const (
	fsIocFsGetXattr    = 0x801c581f // _IOR('X', 31, struct fsxattr)
	fsIocFsSetXattr    = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	fsXflagProjInherit = 0x00000200 // FS_XFLAG_PROJINHERIT
)

// fsxattr is struct fsxattr (28 bytes).
type fsxattr struct {
	XFlags     uint32
	ExtSize    uint32
	NExtents   uint32
	ProjID     uint32
	CowExtSize uint32
	_          [8]byte
}

func dirXattr(dir string, set func(*fsxattr)) (fsxattr, error) {
	var a fsxattr
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return a, &Error{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFsGetXattr, uintptr(unsafe.Pointer(&a))); e != 0 {
		return a, &Error{Op: "FS_IOC_FSGETXATTR", Path: dir, Err: e}
	}
	if set == nil {
		return a, nil
	}
	set(&a)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFsSetXattr, uintptr(unsafe.Pointer(&a))); e != 0 {
		return a, &Error{Op: "FS_IOC_FSSETXATTR", Path: dir, Err: e}
	}
	return a, nil
}

// setDirProject gives the directory dir project id prid, inherited by what
// is created in it.
func setDirProject(dir string, prid uint32) error {
	_, err := dirXattr(dir, func(a *fsxattr) {
		a.ProjID = prid
		a.XFlags |= fsXflagProjInherit
	})
	return err
}

// DirProject reports the project id of the directory dir and whether what
// is created in it inherits it.
func DirProject(dir string) (prid uint32, inherit bool, err error) {
	a, err := dirXattr(dir, nil)
	if err != nil {
		return 0, false, err
	}
	return a.ProjID, a.XFlags&fsXflagProjInherit != 0, nil
}

// mountEntry is a line of /proc/self/mountinfo.
type mountEntry struct {
	dev     string // major:minor
	point   string
	fsType  string
	source  string
	options []string // the mount's, then the superblock's
}

// enforcesProjectQuota reports whether the filesystem enforces project
// quotas: XFS shows prjquota (pquota and pqenforce are its aliases;
// pqnoenforce only accounts).
func (e mountEntry) enforcesProjectQuota() bool {
	for _, o := range e.options {
		switch o {
		case "prjquota", "pquota", "pqenforce":
			return true
		}
	}
	return false
}

// mountOf finds a mount of the filesystem whose device number is dev.
func mountOf(dev uint64) (mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return mountEntry{}, &Error{Op: "open", Path: "/proc/self/mountinfo", Err: err}
	}
	defer f.Close()
	want := fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev))
	e, ok, err := findMount(f, want)
	if err != nil {
		return mountEntry{}, &Error{Op: "read", Path: "/proc/self/mountinfo", Err: err}
	}
	if !ok {
		return mountEntry{}, fmt.Errorf("no mount of device %s in /proc/self/mountinfo: %w", want, errdefs.ErrFailedPrecondition)
	}
	return e, nil
}

// findMount returns the first entry of mountinfo r for device dev
// ("major:minor"). Every mount of one filesystem shows its superblock's
// options.
func findMount(r io.Reader, dev string) (mountEntry, bool, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[2] != dev {
			continue
		}
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+3 >= len(f) {
			continue
		}
		return mountEntry{
			dev:     f[2],
			point:   unescapeMountinfo(f[4]),
			fsType:  f[sep+1],
			source:  unescapeMountinfo(f[sep+2]),
			options: append(strings.Split(f[5], ","), strings.Split(f[sep+3], ",")...),
		}, true, nil
	}
	return mountEntry{}, false, sc.Err()
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of a
// mountinfo field.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

var _ Quota = (*Project)(nil)
