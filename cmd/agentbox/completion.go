package main

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// sandboxArgs names, by command path, the verbs whose positional
// arguments name sandboxes, for shell completion: the first n arguments
// (-1: every one). TestSandboxArgsExist keeps the paths in step with the
// commands.
var sandboxArgs = map[string]int{
	"agentbox exec":                  1,
	"agentbox shell":                 1,
	"agentbox ps":                    1,
	"agentbox attach":                1,
	"agentbox kill":                  1,
	"agentbox inspect":               -1,
	"agentbox rm":                    -1,
	"agentbox pause":                 -1,
	"agentbox resume":                -1,
	"agentbox hibernate":             -1,
	"agentbox transitions":           1,
	"agentbox events":                1,
	"agentbox upgrade":               -1,
	"agentbox fork":                  1,
	"agentbox restore":               1,
	"agentbox merge":                 2,
	"agentbox diff":                  2,
	"agentbox checkpoint create":     1,
	"agentbox checkpoint ls":         1,
	"agentbox template save":         1,
	"agentbox egress log":            1,
	"agentbox egress allow":          1,
	"agentbox egress deny":           1,
	"agentbox egress credential add": 1,
	"agentbox egress credential ls":  1,
	"agentbox egress credential rm":  1,
}

// completionTimeout bounds the daemon call of one completion.
const completionTimeout = 2 * time.Second

// addCompletions gives every command of root that sandboxArgs names
// with n != 0 a ValidArgsFunction suggesting sandboxes.
func addCompletions(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if n := sandboxArgs[c.CommandPath()]; n != 0 && c.ValidArgsFunction == nil {
			c.ValidArgsFunction = completeSandboxes(n)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// completeSandboxes suggests the ids and names of the sandboxes the
// caller sees (asking the daemon), for the first n arguments (n < 0:
// every one). It is quiet on errors: no daemon, no suggestion. Files are
// never suggested.
func completeSandboxes(n int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		const directive = cobra.ShellCompDirectiveNoFileComp
		if n >= 0 && len(args) >= n {
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
		list, err := c.List(ctx, nil)
		if err != nil {
			return nil, directive
		}
		var out []cobra.Completion
		for _, sb := range list {
			info := sb.Info()
			desc := info.State
			if info.Name != "" {
				desc = info.Name + ", " + desc
			}
			if strings.HasPrefix(info.ID, toComplete) {
				out = append(out, cobra.CompletionWithDesc(info.ID, desc))
			}
			if info.Name != "" && strings.HasPrefix(info.Name, toComplete) {
				out = append(out, cobra.CompletionWithDesc(info.Name, info.ID+", "+info.State))
			}
		}
		return out, directive
	}
}
