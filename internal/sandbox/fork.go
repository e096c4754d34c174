package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/tenant"
	"github.com/agentbox/agentbox/internal/validate"
)

// Limits of a fork request.
const (
	maxForks         = 64
	forkParallelism  = 4
	implicitForkName = "fork"
	// LabelImplicit marks checkpoints the daemon took on its own (before a
	// fork of a live sandbox, before a transactional exec).
	LabelImplicit = "agentbox.implicit"
)

// ForkCheckpoint creates req.Count (default 1) sandboxes from checkpoint
// cid. Each runs on the checkpoint's layers with its own empty writable
// layer, and has a fresh identity: new id and hostname, and its own
// /etc/machine-id and /var/lib/systemd/random-seed, never the source's.
// Forks inherit the source sandbox's template, resources and environment
// (req.Env is merged over it) and carry req.Labels. All or nothing: on
// error no fork is left.
func (m *Manager) ForkCheckpoint(ctx context.Context, cid string, req api.ForkRequest) (_ api.ForkResult, err error) {
	defer func() { m.observeID(ctx, OpFork, "", cid, err) }()
	if err := validateFork(&req); err != nil {
		return api.ForkResult{}, fmt.Errorf("forking checkpoint %s: %w", cid, err)
	}
	ck, err := m.checkpointRecord(ctx, cid)
	if err != nil {
		return api.ForkResult{}, fmt.Errorf("forking: %w", err)
	}
	return m.fork(ctx, ck, req)
}

// ForkSandbox checkpoints the running sandbox id (a checkpoint named "fork"
// labelled agentbox.implicit=fork, listed like any other) and forks it; see
// ForkCheckpoint.
func (m *Manager) ForkSandbox(ctx context.Context, id string, req api.ForkRequest) (_ api.ForkResult, err error) {
	defer func() { m.observeID(ctx, OpFork, id, "", err) }()
	if err := validateFork(&req); err != nil {
		return api.ForkResult{}, fmt.Errorf("forking sandbox %s: %w", id, err)
	}
	b, unlock, err := m.lockRunning(ctx, id)
	if err != nil {
		return api.ForkResult{}, err
	}
	ck, err := m.checkpointLocked(ctx, b, api.CreateCheckpointRequest{Name: implicitForkName, Labels: map[string]string{LabelImplicit: "fork"}})
	unlock()
	if err != nil {
		return api.ForkResult{}, fmt.Errorf("forking sandbox %s: %w", id, err)
	}
	return m.fork(ctx, ck, req)
}

func validateFork(req *api.ForkRequest) error {
	if req.Count == 0 {
		req.Count = 1
	}
	if req.Count < 1 || req.Count > maxForks {
		return fmt.Errorf("count must be between 1 and %d: %w", maxForks, errdefs.ErrInvalidArgument)
	}
	if err := validate.Labels(req.Labels); err != nil {
		return err
	}
	return validate.Env(req.Env)
}

func (m *Manager) fork(ctx context.Context, ck store.CheckpointRecord, req api.ForkRequest) (api.ForkResult, error) {
	paths, err := m.cfg.Layers.Paths(ck.Layer)
	if err != nil {
		return api.ForkResult{}, fmt.Errorf("forking checkpoint %s: %w", ck.Checkpoint.ID, err)
	}
	// Forks belong to the checkpoint's tenant and count against its quotas.
	_, release, err := m.admitSandboxes(ctx, ck.Checkpoint.Tenant, req.Count, ck.Resources.DiskBytes)
	if err != nil {
		return api.ForkResult{}, fmt.Errorf("forking checkpoint %s: %w", ck.Checkpoint.ID, err)
	}
	defer release()
	// One synced layer-metadata write references the checkpoint's layer
	// for every fork (the forks then start concurrently); forks that do
	// not come to be release theirs at the end.
	ids := make([]string, req.Count)
	owners := make([]string, req.Count)
	for i := range ids {
		ids[i] = newID()
		owners[i] = sandboxRef(ids[i])
	}
	if err := m.cfg.Layers.RefAll(ctx, ck.Layer, owners); err != nil {
		return api.ForkResult{}, fmt.Errorf("forking checkpoint %s: %w", ck.Checkpoint.ID, err)
	}
	var (
		mu    sync.Mutex
		forks = make([]api.Sandbox, req.Count)
	)
	defer func() {
		var unused []string
		for i, sb := range forks {
			if sb.ID == "" {
				unused = append(unused, owners[i])
			}
		}
		if len(unused) > 0 {
			if err := m.cfg.Layers.UnrefAll(context.WithoutCancel(ctx), ck.Layer, unused); err != nil {
				m.log.WarnContext(ctx, "releasing layer references of failed forks", "layer", ck.Layer, "err", err)
			}
		}
	}()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(forkParallelism)
	for i := range req.Count {
		g.Go(func() error {
			sb, err := m.forkOne(gctx, ids[i], ck, paths, req)
			if err != nil {
				return err
			}
			mu.Lock()
			forks[i] = sb
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		for i, sb := range forks {
			if sb.ID != "" {
				if derr := m.DeleteSandbox(context.WithoutCancel(ctx), sb.ID); derr != nil {
					m.log.ErrorContext(ctx, "deleting fork after a failed fork", "sandbox", sb.ID, "err", derr)
				}
				forks[i].ID = "" // its reference was dropped with it; UnrefAll is idempotent
			}
		}
		return api.ForkResult{}, fmt.Errorf("forking checkpoint %s: %w", ck.Checkpoint.ID, err)
	}
	m.log.InfoContext(ctx, "checkpoint forked", "checkpoint", ck.Checkpoint.ID, "count", req.Count)
	return api.ForkResult{Checkpoint: ck.Checkpoint.ID, Sandboxes: forks}, nil
}

// forkOne creates fork id of ck whose layers are paths. The caller holds
// the fork's reference on ck's layer (sandboxRef(id)).
func (m *Manager) forkOne(ctx context.Context, id string, ck store.CheckpointRecord, paths []string, req api.ForkRequest) (_ api.Sandbox, err error) {
	env := cloneMap(ck.Env)
	if env == nil {
		env = map[string]string{}
	}
	for k, v := range req.Env {
		env[k] = v
	}
	p := m.paths(id)
	rec := store.SandboxRecord{
		Sandbox: api.Sandbox{
			ID:         id,
			Tenant:     tenant.Owner(ck.Checkpoint.Tenant),
			Template:   ck.Checkpoint.Template,
			TemplateID: ck.TemplateID,
			State:      api.StateCreating,
			Env:        env,
			Labels:     cloneMap(req.Labels),
			Resources:  ck.Resources,
			Hostname:   id,
			Backend:    m.backend.Capabilities().Name,
			CreatedAt:  time.Now().UTC(),
		},
		Layers:     paths,
		UpperDir:   p.upper,
		WorkDir:    p.work,
		SocketPath: p.socket,
		StateDir:   p.state,
	}
	setExtra(&rec, recordExtra{ForkBase: ck.Checkpoint.ID})
	// A fork has the checkpoint's resources, its disk cap included: its
	// writable layer starts empty under a quota of its own.
	remove, err := m.makeSandboxDir(ctx, rec)
	if err != nil {
		return api.Sandbox{}, fmt.Errorf("creating fork %s: %w", id, err)
	}
	defer func() {
		if err != nil {
			remove()
		}
	}()
	if err := writeIdentity(p.upper, paths, int(m.cfg.IDs.HostID)); err != nil {
		return api.Sandbox{}, fmt.Errorf("creating fork %s: writing identity: %w", id, err)
	}
	b, err := m.start(ctx, rec, false)
	if err != nil {
		return api.Sandbox{}, err
	}
	if err := m.onCreate(ctx, b); err != nil {
		_ = m.DeleteSandbox(context.WithoutCancel(ctx), id)
		m.observeBox(ctx, OpCreate, b, "fork of "+ck.Checkpoint.ID, err)
		return api.Sandbox{}, fmt.Errorf("creating fork %s: %w", id, err)
	}
	m.observeBox(ctx, OpCreate, b, "fork of "+ck.Checkpoint.ID, nil)
	return b.view(), nil
}

// identityFiles are written fresh into every fork's writable layer.
var identityFiles = []struct {
	path string
	mode os.FileMode
	data func() []byte
}{
	{"etc/machine-id", 0o444, func() []byte { return []byte(randomHex(16) + "\n") }},
	{"var/lib/systemd/random-seed", 0o600, func() []byte { return randomBytes(512) }},
}

// writeIdentity writes identityFiles into upper, creating the parent
// directories they need with the modes and owners they have in the lower
// layers (top-most first), so the merged view is unchanged but for the
// files themselves. New entries are owned by the mapped root hostRoot.
func writeIdentity(upper string, lowers []string, hostRoot int) error {
	for _, f := range identityFiles {
		dir := filepath.Dir(f.path)
		parts := strings.Split(dir, "/")
		for i := range parts {
			rel := filepath.Join(parts[:i+1]...)
			if err := mkdirLike(filepath.Join(upper, rel), rel, lowers, hostRoot); err != nil {
				return err
			}
		}
		target := filepath.Join(upper, f.path)
		if err := os.WriteFile(target, f.data(), 0o600); err != nil {
			return err
		}
		if err := os.Lchown(target, hostRoot, hostRoot); err != nil {
			return err
		}
		if err := os.Chmod(target, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// mkdirLike creates dir (in the upper layer) like the directory rel of the
// top-most lower layer that has it; 0755 root when none has.
func mkdirLike(dir, rel string, lowers []string, hostRoot int) error {
	if _, err := os.Lstat(dir); err == nil {
		return nil
	}
	mode, uid, gid := uint32(0o755), hostRoot, hostRoot
	for _, l := range lowers {
		var st unix.Stat_t
		err := unix.Lstat(filepath.Join(l, rel), &st)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "lstat", Path: filepath.Join(l, rel), Err: err}
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			mode, uid, gid = st.Mode&0o7777, int(st.Uid), int(st.Gid)
		}
		break // a whiteout or a non-directory hides the layers below
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if err := os.Lchown(dir, uid, gid); err != nil {
		return err
	}
	return unix.Chmod(dir, mode)
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails on Linux
	return b
}

func randomHex(n int) string { return hex.EncodeToString(randomBytes(n)) }
