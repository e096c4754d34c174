package sandbox

import (
	"encoding/json"

	"github.com/agentbox/agentbox/internal/store"
)

// recordExtra is what the Manager keeps in store.SandboxRecord.Spec.
type recordExtra struct {
	// ForkBase is the id of the checkpoint the sandbox was forked from:
	// the common ancestor of a merge with its parent or a sibling.
	ForkBase string `json:"fork_base,omitempty"`
	// Pool is the holder of a hidden sandbox (a warm pool's template)
	// until it is handed out (core_pool.go); the key is the one records
	// have always had.
	Pool string `json:"pool,omitempty"`
	// PausedBusy is set when the sandbox was paused while a background
	// process ran (background.go): the idle policy leaves it paused.
	PausedBusy bool `json:"paused_busy,omitempty"`
}

func extraOf(rec store.SandboxRecord) recordExtra {
	var x recordExtra
	if len(rec.Spec) > 0 {
		_ = json.Unmarshal(rec.Spec, &x) // unknown or old content: no extra
	}
	return x
}

func setExtra(rec *store.SandboxRecord, x recordExtra) {
	data, err := json.Marshal(x)
	if err != nil {
		panic(err) // plain strings
	}
	rec.Spec = data
}
