package pipeline

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/agentbox/agentbox/api"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/lazyregexp"
)

// Triggers other than the API run a RunAction: that is the whole of what
// a schedule or a webhook adds to the pipeline.

var triggerIDRe = lazyregexp.New(`^[a-z]+_[0-9a-f]{16,32}$`)

// ValidTriggerID reports whether id has the shape of a schedule or hook id.
func ValidTriggerID(id string) bool { return triggerIDRe.MatchString(id) }

func newTriggerID(prefix string) string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// validAction checks what can be checked before a run.
func validAction(a api.RunAction) error {
	if (len(a.Cmd) == 0) == (a.Command == "") {
		return fmt.Errorf("exactly one of cmd or command is required: %w", errdefs.ErrInvalidArgument)
	}
	if a.TimeoutSeconds < 0 {
		return fmt.Errorf("timeout_seconds must not be negative: %w", errdefs.ErrInvalidArgument)
	}
	if len(a.Name) > 64 || len(a.Template) > 128 {
		return fmt.Errorf("name must be at most 64 bytes and template at most 128: %w", errdefs.ErrInvalidArgument)
	}
	switch a.Lifecycle {
	case "", api.LifecycleSession, api.LifecyclePersistent:
	default:
		return fmt.Errorf("lifecycle %q: must be %q or %q: %w", a.Lifecycle, api.LifecycleSession, api.LifecyclePersistent, errdefs.ErrInvalidArgument)
	}
	if a.Lifecycle == api.LifecyclePersistent && a.Name == "" {
		return fmt.Errorf("a persistent lifecycle needs a name (to find the sandbox again): %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// runAction executes a and waits for the run to end.
func (p *Pipeline) runAction(ctx context.Context, trigger, who, tenant string, a api.RunAction, env map[string]string, stdin []byte) (api.Run, error) {
	exe, err := p.startAction(ctx, trigger, who, tenant, a, env, stdin)
	if err != nil {
		return api.Run{}, err
	}
	return p.Wait(ctx, exe)
}

// startAction executes a and returns the started run.
func (p *Pipeline) startAction(ctx context.Context, trigger, who, tenant string, a api.RunAction, env map[string]string, stdin []byte) (*Execution, error) {
	e := mapsClone(a.Env)
	for k, v := range env {
		if e == nil {
			e = map[string]string{}
		}
		e[k] = v
	}
	return p.Execute(ctx, Run{
		Trigger: trigger,
		Who:     who,
		Tenant:  tenant,
		Create: &api.CreateSandboxRequest{
			Template:  a.Template,
			Name:      a.Name,
			Lifecycle: a.Lifecycle,
		},
		Exec: api.ExecRequest{
			Cmd:            a.Cmd,
			Command:        a.Command,
			Env:            e,
			Cwd:            a.Cwd,
			Stdin:          stdin,
			TimeoutSeconds: a.TimeoutSeconds,
		},
		KeepOutput: true,
	})
}
