package api

import "time"

// Lifecycle: every sandbox moves through
//
//	creating → running ⇄ paused (warm) ⇄ hibernated (cold) → deleted
//
// plus failed (a lifecycle operation could not complete; only resume and
// delete work) and stopped (the guest exited on its own). A paused sandbox's
// processes are frozen with their memory kept; a hibernated one has no
// process left, only its filesystem on disk, and wakes by starting its
// guest again on the same layers and writable layer under the same id and
// hostname. Any exec, file or attach call on a paused or hibernated sandbox
// wakes it first. Every transition is recorded with its cause.

// Sandbox states added by the lifecycle (see also StateCreating, ...).
const (
	StatePaused     = "paused"
	StateHibernated = "hibernated"
	StateFailed     = "failed"
	// StateDeleted appears only as the To of the last transition.
	StateDeleted = "deleted"
)

// Lifecycle presets (CreateSandboxRequest.Lifecycle).
const (
	// LifecycleSession (the default): the sandbox is deleted when it has
	// been idle for delete_after (default 30 minutes), after being paused
	// at pause_after (default 5 minutes).
	LifecycleSession = "session"
	// LifecyclePersistent: the sandbox is kept, paused when idle (default 5
	// minutes) and hibernated later (default 30 minutes), never deleted on
	// its own. With a name, creating it again returns the same sandbox.
	LifecyclePersistent = "persistent"
)

// IdlePolicy says what happens to a sandbox that has been idle (no exec,
// file operation or attach, nothing streaming, no background process
// running unless IgnoreBackground) for a while. Each field is
// a duration in seconds counted from the end of the last activity: 0 takes
// the lifecycle preset's default, -1 means never. The hard lifetime is
// CreateSandboxRequest.TimeoutSeconds (ttl); time spent paused or
// hibernated does not count against it unless TTLCountsAsleep is set.
type IdlePolicy struct {
	PauseAfterSeconds     int64 `json:"pause_after_seconds,omitempty"`
	HibernateAfterSeconds int64 `json:"hibernate_after_seconds,omitempty"`
	DeleteAfterSeconds    int64 `json:"delete_after_seconds,omitempty"`
	TTLCountsAsleep       bool  `json:"ttl_counts_asleep,omitempty"`
	// IgnoreBackground lets the policy pause, hibernate and delete a
	// sandbox while background processes run (started with exec -d, or
	// left running by a command: "server &"). By default a running
	// background process is activity: the sandbox
	// stays awake while one runs, and a sandbox paused while one ran is
	// not hibernated or deleted by the policy (either would kill it).
	IgnoreBackground bool `json:"ignore_background,omitempty"`
}

// Transition causes.
const (
	CauseCreate    = "create"
	CauseAPI       = "api"        // explicit pause/resume/hibernate/delete call
	CauseIdle      = "idle"       // the idle policy
	CauseTTL       = "ttl"        // the hard lifetime ran out
	CauseWake      = "wake"       // a call on a sleeping sandbox (Detail names it)
	CauseRecover   = "recover"    // daemon start-up
	CauseGuestExit = "guest_exit" // the guest exited on its own
	CauseError     = "error"      // an operation failed (Detail says why)
	// Operations that keep the state (From == To) are recorded too.
	CauseCheckpoint = "checkpoint" // the files were captured (Detail: the checkpoint id)
	CauseRestore    = "restore"    // the files were put back (Detail: the checkpoint id)
	CauseUpgrade    = "upgrade"    // the guest moved to another runner (Detail: the versions)
)

// Transition is one change of a sandbox's state.
type Transition struct {
	From   string    `json:"from"`
	To     string    `json:"to"`
	Cause  string    `json:"cause"`
	Detail string    `json:"detail,omitempty"`
	At     time.Time `json:"at"`
}

// TransitionList is the body of GET /v1/sandboxes/{id}/transitions: the
// newest transitions of the sandbox (at most 64), oldest first.
type TransitionList struct {
	Transitions []Transition `json:"transitions"`
}
