package main

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// argKind says what a positional argument names, for shell completion.
type argKind int

const (
	argSandbox    argKind = 1 << iota // a sandbox: id or name
	argCheckpoint                     // a checkpoint: id or name
)

// argSpec describes a verb's positional arguments: each[i] is what
// argument i names (0: nothing to suggest), rest what every further one
// names.
type argSpec struct {
	each []argKind
	rest argKind
}

var (
	oneSandbox  = argSpec{each: []argKind{argSandbox}}
	sandboxes   = argSpec{rest: argSandbox}
	twoSandbox  = argSpec{each: []argKind{argSandbox, argSandbox}}
	checkpoints = argSpec{rest: argCheckpoint}
)

// completionArgs names, by command path, the verbs whose positional
// arguments name sandboxes or checkpoints. TestSandboxArgsExist keeps the
// paths in step with the commands.
var completionArgs = map[string]argSpec{
	"agentbox exec":                  oneSandbox,
	"agentbox shell":                 oneSandbox,
	"agentbox ps":                    oneSandbox,
	"agentbox attach":                oneSandbox,
	"agentbox kill":                  oneSandbox,
	"agentbox inspect":               sandboxes,
	"agentbox rm":                    sandboxes,
	"agentbox pause":                 sandboxes,
	"agentbox resume":                sandboxes,
	"agentbox hibernate":             sandboxes,
	"agentbox transitions":           oneSandbox,
	"agentbox events":                oneSandbox,
	"agentbox upgrade":               sandboxes,
	"agentbox fork":                  {each: []argKind{argSandbox | argCheckpoint}},
	"agentbox restore":               {each: []argKind{argSandbox, argCheckpoint}},
	"agentbox merge":                 twoSandbox,
	"agentbox diff":                  twoSandbox,
	"agentbox checkpoint create":     oneSandbox,
	"agentbox checkpoint ls":         oneSandbox,
	"agentbox checkpoint rm":         checkpoints,
	"agentbox template save":         oneSandbox,
	"agentbox egress log":            oneSandbox,
	"agentbox egress allow":          oneSandbox,
	"agentbox egress deny":           oneSandbox,
	"agentbox egress credential add": oneSandbox,
	"agentbox egress credential ls":  oneSandbox,
	"agentbox egress credential rm":  oneSandbox,
	"agentbox expose":                oneSandbox,
	"agentbox expose ls":             oneSandbox,
}

// completionTimeout bounds the daemon calls of one completion.
const completionTimeout = 2 * time.Second

// addCompletions gives every command of root that completionArgs names a
// ValidArgsFunction suggesting what its arguments name.
func addCompletions(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if spec, ok := completionArgs[c.CommandPath()]; ok && c.ValidArgsFunction == nil {
			c.ValidArgsFunction = spec.complete
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// complete suggests the ids and names of the sandboxes or checkpoints the
// caller sees (asking the daemon) for the argument being typed. It is
// quiet on errors: no daemon, no suggestion. Files are never suggested.
func (s argSpec) complete(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	const directive = cobra.ShellCompDirectiveNoFileComp
	kind := s.rest
	if len(args) < len(s.each) {
		kind = s.each[len(args)]
	}
	if kind == 0 {
		return nil, directive
	}
	c, err := rootGlobals(cmd).client()
	if err != nil {
		return nil, directive
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	var out []cobra.Completion
	add := func(id, name, what string) {
		if strings.HasPrefix(id, toComplete) {
			out = append(out, cobra.CompletionWithDesc(id, strings.TrimPrefix(name+", "+what, ", ")))
		}
		if name != "" && strings.HasPrefix(name, toComplete) {
			out = append(out, cobra.CompletionWithDesc(name, id+", "+what))
		}
	}
	if kind&argSandbox != 0 {
		if list, err := c.List(ctx, nil); err == nil {
			for _, sb := range list {
				info := sb.Info()
				add(info.ID, info.Name, info.State)
			}
		}
	}
	if kind&argCheckpoint != 0 {
		if list, err := c.Checkpoints(ctx); err == nil {
			for _, cp := range list {
				add(cp.ID, cp.Name, "checkpoint of "+cp.SandboxID)
			}
		}
	}
	return out, directive
}
