package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/diskquota"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guest/client"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/templates"
)

// StepRunner runs template build steps in throwaway sandboxes of the
// Manager's backend.
type StepRunner struct {
	m *Manager
}

// stepRunner returns the runner the template manager uses for "run" steps.
func (m *Manager) stepRunner() *StepRunner { return &StepRunner{m: m} }

// Templates is the template store the Manager creates sandboxes from
// (*templates.Manager). Its methods are safe for concurrent use.
type Templates interface {
	Get(ctx context.Context, name string) (templates.Template, error)
	List(ctx context.Context) ([]api.Template, error)
	Names() []string
	Build(ctx context.Context, req api.BuildTemplateRequest, progress func(api.BuildEvent)) (templates.Template, error)
	Adopt(ctx context.Context, name, layer string, env map[string]string) (templates.Template, error)
	Save(ctx context.Context, name, layer string, env map[string]string, source string) (api.TemplateVersion, error)
	Versions(ctx context.Context, name string) ([]api.TemplateVersion, error)
	Delete(ctx context.Context, name string) error
}

var _ Templates = (*templates.Manager)(nil)

// TemplatesFactory builds the template store of a Manager under
// construction. Templates and sandboxes depend on each other: the store
// runs "run" steps in the Manager's sandboxes (runner); the Manager
// creates sandboxes from templates. New calls the factory once, before it
// returns, so the cycle is closed at construction and no setter exists.
// (The store admits new layers against tenants' quotas on its own:
// templates.Config.Admit, the tenant registry's AdmitTemplateLayer.)
type TemplatesFactory func(runner *StepRunner) (Templates, error)

var (
	_ templates.StepRunner    = (*StepRunner)(nil)
	_ templates.StepScratcher = (*StepRunner)(nil)
)

// StepScratch implements templates.StepScratcher: with a default disk
// limit, a build step's upper and work dirs are capped at it like a
// sandbox's writable layer, in a dir of <data>/sandboxes (shared, see
// disk.go) named step-<id> with a quota of its own. Its layer is then
// copied out of it (another filesystem with the loop method). A daemon
// killed mid-step leaves a quota its successor's Recover removes (no
// record). Without a default the dir is a scratch dir of the layer store.
func (r *StepRunner) StepScratch(ctx context.Context) (string, func(), error) {
	m := r.m
	def := m.cfg.DefaultResources
	if def.DiskBytes == 0 {
		dir, err := m.cfg.Layers.TempDir("step-")
		if err != nil {
			return "", nil, err
		}
		return dir, func() { _ = os.RemoveAll(dir) }, nil
	}
	if err := m.diskAvailable(); err != nil {
		return "", nil, fmt.Errorf("build step: %w", err)
	}
	id := "step-" + newID()
	dir := m.paths(id).dir
	if err := os.Mkdir(dir, 0o711); err != nil {
		return "", nil, fmt.Errorf("build step: %w", err)
	}
	lim := diskquota.Limits{Bytes: def.DiskBytes, Inodes: DefaultInodes(def, def.DiskBytes)}
	if err := m.cfg.DiskQuota.Apply(ctx, dir, id, lim); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("build step: disk quota: %w", err)
	}
	return dir, func() {
		if err := m.removeDisk(context.WithoutCancel(ctx), id); err != nil {
			m.log.ErrorContext(ctx, "removing a build step's disk", "dir", dir, "err", err)
		}
		_ = os.RemoveAll(dir)
	}, nil
}

// RunStep runs command with /bin/sh -c in a sandbox whose root is layers plus
// upperDir, streaming its output, and destroys the sandbox afterwards,
// leaving upperDir in place. A non-zero exit is an error.
func (r *StepRunner) RunStep(ctx context.Context, layers []string, upperDir string, env map[string]string, command string, output io.Writer) (err error) {
	m := r.m
	id := "build-" + newID()
	work := filepath.Join(filepath.Dir(upperDir), "work")
	if err := os.MkdirAll(work, 0o755); err != nil {
		return fmt.Errorf("build step: %w", err)
	}
	if err := os.Lchown(work, int(m.cfg.IDs.HostID), int(m.cfg.IDs.HostID)); err != nil {
		return fmt.Errorf("build step: %w", err)
	}
	defer os.RemoveAll(work)
	state, err := os.MkdirTemp(filepath.Join(m.cfg.DataDir, "sandboxes"), ".build-")
	if err != nil {
		return fmt.Errorf("build step: %w", err)
	}
	defer os.RemoveAll(state)
	be := m.backends.Default()
	ids, owned, err := m.allocIDs(be)
	if err != nil {
		return fmt.Errorf("build step: %w", err)
	}
	if owned {
		// Deferred first, so freed last: after the step's sandbox is
		// destroyed (its files are in the canonical range).
		defer m.releaseIDs(ids)
	}
	spec := runtime.Spec{
		ID:         id,
		Layers:     layers,
		UpperDir:   upperDir,
		WorkDir:    work,
		RunnerDir:  m.cfg.RunnerDir,
		SocketPath: filepath.Join(m.cfg.RunDir, "sb", id+".sock"),
		StateDir:   state,
		Hostname:   "build",
		LayerIDs:   m.cfg.IDs,
		UIDMap:     ids,
		GIDMap:     ids,
		Resources: runtime.Resources{
			CPUs:        m.cfg.DefaultResources.CPUs,
			MemoryBytes: m.cfg.DefaultResources.MemoryBytes,
			PidsMax:     m.cfg.DefaultResources.PidsMax,
		},
	}
	rt, err := be.Create(ctx, spec)
	if err != nil {
		return fmt.Errorf("build step: starting sandbox: %w", err)
	}
	defer func() {
		if derr := rt.Destroy(context.WithoutCancel(ctx)); derr != nil && err == nil {
			err = fmt.Errorf("build step: destroying sandbox: %w", derr)
		}
	}()
	g := client.New(rt.SocketPath())
	vctx, cancel := context.WithTimeout(ctx, guestReadyWait)
	_, err = g.Version(vctx)
	cancel()
	if err != nil {
		return fmt.Errorf("build step: waiting for guest: %w", err)
	}
	s, err := g.Exec(ctx, api.ExecRequest{Command: command, Env: env, Cwd: "/"})
	if err != nil {
		return fmt.Errorf("build step: %w", err)
	}
	defer s.Close()
	start := time.Now()
	for {
		ev, err := s.Next()
		if err != nil {
			return fmt.Errorf("build step: reading output: %w", err)
		}
		switch ev.Type {
		case api.EventStdout, api.EventStderr:
			if output != nil {
				_, _ = output.Write(ev.Data)
			}
		case api.EventExit:
			if ev.ExitCode == nil || *ev.ExitCode != 0 {
				return fmt.Errorf("build step %q failed after %s (%s): %w", command, time.Since(start).Round(time.Millisecond), exitText(ev), errdefs.ErrFailedPrecondition)
			}
			return nil
		case api.EventError:
			msg := "unknown error"
			if ev.Error != nil {
				msg = ev.Error.Message
			}
			return fmt.Errorf("build step %q: %s: %w", command, msg, errdefs.ErrFailedPrecondition)
		}
	}
}

func exitText(ev api.ExecEvent) string {
	if ev.Signal != "" {
		return "killed by signal " + ev.Signal
	}
	if ev.ExitCode != nil {
		return fmt.Sprintf("exit code %d", *ev.ExitCode)
	}
	return "no exit code"
}
