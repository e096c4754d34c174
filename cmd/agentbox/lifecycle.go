package main

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/spf13/cobra"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func init() {
	extraCommands = append(extraCommands, pauseCmd, resumeCmd, hibernateCmd, transitionsCmd)
}

// lifecycleOp builds `agentbox pause|resume|hibernate ID...`.
func lifecycleOp(use, short string, op func(*agentbox.Sandbox, context.Context) error) func() *cobra.Command {
	return func() *cobra.Command {
		return &cobra.Command{
			Use:   use + " ID...",
			Short: short,
			Args:  cobra.MinimumNArgs(1),
			RunE: func(cmd *cobra.Command, ids []string) error {
				g := rootGlobals(cmd)
				c, err := g.client()
				if err != nil {
					return err
				}
				var errs []error
				for _, id := range ids {
					sb := c.Sandbox(id)
					if err := op(sb, cmd.Context()); err != nil {
						errs = append(errs, err)
						continue
					}
					if g.json {
						if err := printJSON(cmd.OutOrStdout(), sb.Info()); err != nil {
							return err
						}
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\n", id, sb.Info().State)
				}
				return reportAll(cmd, errs)
			},
		}
	}
}

var (
	pauseCmd = lifecycleOp("pause", "Freeze sandboxes (memory kept; the next call resumes them)",
		(*agentbox.Sandbox).Pause)
	resumeCmd = lifecycleOp("resume", "Resume paused or hibernated sandboxes (restart stopped ones)",
		(*agentbox.Sandbox).Resume)
	hibernateCmd = lifecycleOp("hibernate", "Stop sandboxes' processes, keeping their filesystem (the next call starts them again)",
		(*agentbox.Sandbox).Hibernate)
)

func transitionsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "transitions ID",
		Short: "Show a sandbox's state transitions and their causes",
		Args:  cobra.ExactArgs(1),
		RunE: listing[agentbox.Transition]{
			fetch: func(ctx context.Context, c *agentbox.Client, args []string) ([]agentbox.Transition, error) {
				return c.Sandbox(args[0]).Transitions(ctx)
			},
			header: "AT\tFROM\tTO\tCAUSE\tDETAIL",
			row: func(t agentbox.Transition) string {
				return fmt.Sprintf("%s\t%s\t%s\t%s\t%s", t.At.Local().Format(time.DateTime), t.From, t.To, t.Cause, t.Detail)
			},
		}.run,
	}
}

// idleSeconds maps an idle-duration flag to IdlePolicy seconds: unset 0
// (the preset's default), "never" or a negative duration -1.
func idleSeconds(name, v string) (int64, error) {
	switch v {
	case "":
		return 0, nil
	case "never", "-1":
		return -1, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("--%s: want a duration like 5m, or never", name)
	}
	return int64(math.Ceil(d.Seconds())), nil
}
