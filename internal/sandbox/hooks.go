package sandbox

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/execstream"
	"github.com/agentbox/agentbox/internal/guest/client"
)

// Extension points.
//
// The core (this package) owns the registry of sandboxes, the per-sandbox
// operation lock, acquire/release (wake on use), starting and stopping
// guests, records and state transitions. A feature that needs to act on
// the life of a sandbox does not get a call from the core: it is an
// Extension, handed to New in Config.Extensions by the daemon (the
// composition root), that implements any of the small hook interfaces
// below. The core never imports a feature package; features import the
// core.
//
// Scenarios:
//
//  1. Creating a sandbox: PrepareHook.PrepareCreate sees the request
//     first. Once it is admitted, a CreateInterceptor (core_pool.go) may
//     supply the sandbox, a hidden one made earlier (a warm pool's), and
//     nothing below runs. Otherwise the guest starts and the sandbox is
//     registered; then StartHook.OnStart (cause api.CauseCreate) and
//     CreateHook.OnCreate run, in registration order. An error from either
//     deletes the sandbox again and fails the create with that error.
//  2. Running a command: ExecWrapper.WrapExec runs for every exec and
//     background process, under the sandbox's operation lock, in
//     registration order, and may change the request (environment, the
//     private flag). When the process has started, ExecRun.Started runs in
//     reverse registration order and may wrap the event stream, so the
//     first-registered wrapper's stream is the outermost one. Attaching to
//     a process (and watching it) passes its stream through
//     StreamWrapper.WrapStream the same way.
//  3. Sleeping and waking: StopHook.OnStop runs when the guest is paused,
//     hibernated or exits on its own; StartHook.OnStart runs whenever a new
//     guest of an existing sandbox answers (wake from hibernation, restore,
//     upgrade) and, at daemon start, RecoverHook.OnRecover for every
//     sandbox re-adopted.
//  4. Closing: Manager.Close closes every extension that is an io.Closer,
//     last registered first, before it forgets its sandboxes.
//  5. Deleting: DeleteHook.OnDelete runs once the sandbox is gone, on a
//     context without cancellation.
//  6. Observing: every Observer sees every operation (Op) as it completes
//     and every state transition as it happens, in order.
//
// Hooks of one sandbox never run concurrently with a delete of it: they
// run under its operation lock (shared for exec, exclusive for lifecycle
// changes). Hooks of different sandboxes run concurrently. A hook must not
// call a Manager method that takes the same sandbox's lock exclusively
// (delete, pause, hibernate, restore), or it deadlocks.

// Extension is a feature attached to the core. It implements any of the
// hook interfaces of this file (PrepareHook, CreateHook, StartHook, StopHook,
// DeleteHook, RecoverHook, PurgeHook, ExecWrapper, StreamWrapper, Observer,
// Provisioner), RescueHook (core_snapshot.go) and CreateInterceptor
// (core_pool.go); New checks each with a type assertion, once.
type Extension interface {
	// Name names the extension in logs (a hook's logged error says which
	// extension it came from).
	Name() string
}

// Provisioner is an Extension that needs the core beyond the Handle its
// hooks get, for instance to look a sandbox up when a request arrives
// from elsewhere (the API bridge). New calls Provision once, in
// registration order, before it returns: nothing can reach the extension's
// hooks before that. An error fails New.
type Provisioner interface {
	Provision(c Core) error
}

// Core is what the core offers extensions outside a hook call.
// *Manager implements it.
type Core interface {
	// Handle returns sandbox id as the caller of ctx sees it (ErrNotFound
	// for another tenant's, a hidden or an unknown sandbox).
	Handle(ctx context.Context, id string) (*Handle, error)
	// Acquire returns sandbox id running (woken first when asleep) with
	// its operation lock held shared; it counts as a call (the sandbox is
	// not idle until release). The caller must call release.
	Acquire(ctx context.Context, id string) (h *Handle, release func(), err error)
	// WithGuest runs fn against sandbox id's guest with its operation lock
	// held shared; it counts as a call (wakes a sleeping sandbox, resets
	// its idle timer) and observers see it as OpGuestCall op (see
	// Manager.WithGuest).
	WithGuest(ctx context.Context, id, op string, fn func(g *client.Client) error) error
}

// PrepareHook sees every create request after it is validated, before
// anything is allocated for it (and before a CreateInterceptor is asked;
// not the creation of a hidden sandbox, see core_pool.go).
type PrepareHook interface {
	// PrepareCreate may normalize req (the network spec). An error fails
	// the create with it.
	PrepareCreate(ctx context.Context, req *api.CreateSandboxRequest) error
}

// CreateHook runs after a new sandbox's guest started (after OnStart).
type CreateHook interface {
	// OnCreate prepares a new sandbox. An error rolls the create back: the
	// sandbox is deleted (OnDelete runs) and the create fails with it.
	OnCreate(ctx context.Context, h *Handle) error
}

// StartHook runs whenever a guest of a sandbox has started and answers:
// at create (cause api.CauseCreate), when waking from hibernation (the
// wake's cause: api.CauseWake, api.CauseAPI), restoring (StartRestore) or
// upgrading (StartUpgrade). It does not run for a sandbox recovered at
// daemon start (see RecoverHook).
type StartHook interface {
	// OnStart is called with the sandbox's lock held exclusively (create:
	// before the sandbox is handed out). At create an error rolls the
	// create back; otherwise it is logged and the sandbox stays up.
	OnStart(ctx context.Context, h *Handle, cause string) error
}

// Causes of StartHook.OnStart besides the api.Cause* values.
const (
	StartRestore = "restore" // the sandbox was restored to a checkpoint
	StartUpgrade = "upgrade" // the sandbox's guest was upgraded
)

// StopHook runs when a sandbox's guest stops running: paused,
// hibernated, or exited on its own (to is the new state).
type StopHook interface {
	// OnStop's error is logged; the stop has happened.
	OnStop(ctx context.Context, h *Handle, to string)
}

// RecoverHook runs at daemon start for every sandbox re-adopted (running,
// paused, or hibernated; Handle.Runtime is nil for the latter), after it
// is registered.
type RecoverHook interface {
	// OnRecover's error is logged; the sandbox is adopted anyway.
	OnRecover(ctx context.Context, h *Handle) error
}

// DeleteHook runs after a sandbox is deleted: its guest, files and record
// are gone. It also runs for a sandbox whose create was rolled back.
type DeleteHook interface {
	// OnDelete runs on a context without cancellation; it has nothing to
	// return (the delete has happened), and should forget what it keeps
	// about the sandbox.
	OnDelete(ctx context.Context, id string)
}

// PurgeHook is an extension that keeps things a tenant owns (secrets).
type PurgeHook interface {
	// OnPurgeTenant deletes what tenant owns, on behalf of ctx (which acts
	// as the tenant), when the tenant is purged (Manager.PurgeTenant). Its
	// error is reported by PurgeTenant, which may be called again.
	OnPurgeTenant(ctx context.Context, tenant string) error
}

// ExecWrapper joins every exec and background process of every sandbox
// (secrets, run tokens and output redaction hook in here).
type ExecWrapper interface {
	// WrapExec runs after the request is validated, before the sandbox's
	// environment is merged under req.Env and the request goes to the
	// guest: what it puts into req.Env overrides the sandbox's
	// environment. It may change req. It returns nil when it has nothing to follow. On
	// error no process starts: the runs of wrappers before it are
	// aborted and the call fails with the error.
	WrapExec(ctx context.Context, h *Handle, req *api.ExecRequest) (ExecRun, error)
}

// ExecRun follows one process an ExecWrapper joined. Exactly one of its
// methods is called, once.
type ExecRun interface {
	// Started: process pid (in the sandbox's pid namespace) started. For
	// a foreground exec s is its event stream and the returned stream
	// replaces it; for a background process s is nil and the result is
	// ignored.
	Started(pid int, s execstream.Stream) execstream.Stream
	// Abort: the process did not start.
	Abort()
}

// StreamWrapper wraps the output of attaching to (or watching) a process
// that is already running.
type StreamWrapper interface {
	WrapStream(h *Handle, pid int, s execstream.Stream) execstream.Stream
}

// Observer sees every operation of the core (see Op). Observe is called
// synchronously, in the order operations happen, sometimes with the
// sandbox's internal lock held (transitions): it must return quickly and
// must not call the Manager. It cannot fail or change the operation.
type Observer interface {
	Observe(ctx context.Context, op Op)
}

// Kinds of operation an Observer sees.
const (
	OpCreate       = "create"
	OpDelete       = "delete"
	OpExec         = "exec"
	OpStartProcess = "start_process"
	OpAttach       = "attach"
	OpGuestCall    = "guest_call" // files, stdin, signals, resize, process list
	OpTransition   = "transition" // a state change; Op.Transition says which
	OpEvent        = "event"      // an event the core reports (OOM kill); Op.Event

	OpCheckpoint       = "checkpoint"        // Detail: the checkpoint's name
	OpDeleteCheckpoint = "delete_checkpoint" // Detail: the checkpoint id
	OpRestore          = "restore"           // Detail: the checkpoint reference
	OpFork             = "fork"              // Detail: the checkpoint id (fork of a checkpoint)
	OpMerge            = "merge"
	OpSaveTemplate     = "save_template" // Detail: the template's name
	OpUpgrade          = "upgrade"
)

// Op is one operation as an Observer sees it.
type Op struct {
	Kind    string
	Sandbox string
	// Tenant is the sandbox's owner.
	Tenant string
	// Detail says more about the operation (the guest call, the exec's
	// command), never a secret: exec environments are left out.
	Detail     string
	Transition *api.Transition
	Event      *api.SandboxEvent
	// Err is how the operation failed; nil when it succeeded.
	Err error
	At  time.Time
	// Duration is how long the operation took, where the core or the
	// feature reporting it timed it (create, checkpoint, restore, fork);
	// zero otherwise.
	Duration time.Duration
	// Hidden says the sandbox is a hidden one (a warm pool's, not yet
	// handed out): its create is a pool's fill, not a caller's create.
	Hidden bool
}
