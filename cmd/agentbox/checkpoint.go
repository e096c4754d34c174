package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func init() {
	extraCommands = append(extraCommands, checkpointCmd, restoreCmd, forkCmd)
}

// These commands are registered through extraCommands, whose constructors
// take no arguments; they read the persistent flags from the root.
func rootGlobals(cmd *cobra.Command) *globals {
	g := &globals{}
	pf := cmd.Root().PersistentFlags()
	g.host, _ = pf.GetString("host")
	g.apiKey, _ = pf.GetString("api-key")
	g.caCert, _ = pf.GetString("ca-cert")
	g.json, _ = pf.GetBool("json")
	return g
}

func checkpointCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "checkpoint",
		Aliases: []string{"checkpoints", "ckpt"},
		Short:   "Create, list and delete checkpoints of sandboxes",
	}
	var name string
	var labels []string
	var memory, allowSecrets bool
	create := &cobra.Command{
		Use:   "create [--name NAME] [--label K=V]... [--memory [--allow-secrets-in-memory]] SANDBOX",
		Short: "Checkpoint a sandbox's filesystem (and with --memory its processes) and print the checkpoint id",
		Long: `Checkpoint a sandbox's filesystem and print the checkpoint id.

--memory also captures the sandbox's memory and processes (a backend with
the memory-checkpoint capability: gvisor): restore and fork of the
checkpoint continue its processes where they were. It is refused while a
process started with secrets or a run token runs, or once the sandbox's
guest has started one (their memory, and the guest's, would hold them),
unless --allow-secrets-in-memory is given; a restore from a filesystem
checkpoint gives the sandbox a fresh guest.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			lbl, err := parseKV("--label", labels)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ck, err := c.Sandbox(args[0]).CheckpointWith(cmd.Context(), agentbox.CheckpointOptions{Name: name, Labels: lbl,
				Memory: memory, AllowSecretsInMemory: allowSecrets})
			if err != nil {
				return err
			}
			return printResult(cmd, g.json, ck, ck.ID)
		},
	}
	create.Flags().StringVarP(&name, "name", "n", "", "checkpoint name")
	create.Flags().StringArrayVarP(&labels, "label", "l", nil, "label K=V (repeatable)")
	create.Flags().BoolVar(&memory, "memory", false, "capture the sandbox's memory and processes too (gvisor)")
	create.Flags().BoolVar(&allowSecrets, "allow-secrets-in-memory", false, "take a --memory checkpoint even while a process started with secrets runs or after one ran")

	ls := &cobra.Command{
		Use:     "ls [SANDBOX]",
		Aliases: []string{"list"},
		Short:   "List the checkpoints of a sandbox, or all",
		Long: `List the checkpoints of a sandbox, or all, oldest first.

IMPLICIT says why the daemon took a checkpoint on its own (exec for
exec --checkpoint/--rollback-on-failure, fork, merge); "-" for one you asked
for. Implicit checkpoints are pruned: per sandbox only the newest are kept
(serve --implicit-checkpoints-keep) and none past an age
(--implicit-checkpoints-max-age-seconds, shown in EXPIRES), except while a
sandbox runs on one or was forked from it. Yours are never pruned.`,
		Args: cobra.MaximumNArgs(1),
		RunE: listing[agentbox.Checkpoint]{
			fetch: func(ctx context.Context, c *agentbox.Client, args []string) ([]agentbox.Checkpoint, error) {
				if len(args) == 1 {
					return c.Sandbox(args[0]).Checkpoints(ctx)
				}
				return c.Checkpoints(ctx)
			},
			header: "ID\tNAME\tSANDBOX\tSIZE\tCREATED\tIMPLICIT\tEXPIRES\tLABELS",
			row: func(ck agentbox.Checkpoint) string {
				implicit, expires := "-", "-"
				if ck.Implicit != "" {
					implicit = ck.Implicit
				}
				if ck.ExpiresAt != nil {
					expires = "in " + humanDuration(max(time.Until(*ck.ExpiresAt), 0))
				}
				return fmt.Sprintf("%s\t%s\t%s\t%s\t%s ago\t%s\t%s\t%s", ck.ID, ck.Name, ck.SandboxID, humanBytes(ck.SizeBytes),
					humanDuration(time.Since(ck.CreatedAt)), implicit, expires, formatKV(ck.Labels))
			},
		}.run,
	}
	rm := removeCommand("rm CHECKPOINT...", "Delete checkpoints (refused while a sandbox runs on one)", removeQuiet, (*agentbox.Client).DeleteCheckpoint)
	cmd.AddCommand(create, ls, rm, checkpointExportCmd())
	return cmd
}

func restoreCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "restore SANDBOX CHECKPOINT",
		Short: "Restore a sandbox in place to a checkpoint (id or name); its processes restart",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.Sandbox(args[0]).Restore(cmd.Context(), args[1])
			if err != nil {
				return err
			}
			return printResult(cmd, g.json, res, fmt.Sprintf("restored %s to checkpoint %s in %d ms", args[0], res.Checkpoint, res.DurationMS))
		},
	}
}

func forkCmd() *cobra.Command {
	var (
		n      int
		labels []string
		env    []string
	)
	cmd := &cobra.Command{
		Use:   "fork [-n N] CHECKPOINT|SANDBOX",
		Short: "Create N sandboxes from a checkpoint, or from a running sandbox (checkpointed first); print their ids",
		Long: "Create N sandboxes from a checkpoint (its id, or its name: the newest of your checkpoints\n" +
			"of that name, as restore resolves it), or else from a running sandbox (id or name), which\n" +
			"is checkpointed first. A checkpoint is looked for before a sandbox of the same name.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			lbl, err := parseKV("--label", labels)
			if err != nil {
				return err
			}
			ev, err := parseKV("--env", env)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			opts := agentbox.ForkOptions{Labels: lbl, Env: ev}
			// A checkpoint (id or name, resolved by the daemon as restore
			// resolves it) first, else a sandbox (id or name).
			forks, err := c.Fork(cmd.Context(), args[0], n, opts)
			if agentbox.IsNotFound(err) || agentbox.IsInvalidArgument(err) {
				forks, err = c.Sandbox(args[0]).Fork(cmd.Context(), n, opts)
			}
			if err != nil {
				return err
			}
			if g.json {
				infos := make([]api.Sandbox, len(forks))
				for i, f := range forks {
					infos[i] = f.Info()
				}
				return printJSON(cmd.OutOrStdout(), infos)
			}
			ids := make([]string, len(forks))
			for i, f := range forks {
				ids[i] = f.ID()
			}
			fmt.Fprintln(cmd.OutOrStdout(), strings.Join(ids, "\n"))
			return nil
		},
	}
	cmd.Flags().IntVarP(&n, "count", "n", 1, "number of forks")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "label K=V of every fork (repeatable)")
	cmd.Flags().StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE of every fork (repeatable)")
	return cmd
}
