package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
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
	create := &cobra.Command{
		Use:   "create [--name NAME] [--label K=V]... SANDBOX",
		Short: "Checkpoint a sandbox's filesystem and print the checkpoint id",
		Args:  cobra.ExactArgs(1),
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
			ck, err := c.Sandbox(args[0]).CheckpointWith(cmd.Context(), agentbox.CheckpointOptions{Name: name, Labels: lbl})
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), ck)
			}
			fmt.Fprintln(cmd.OutOrStdout(), ck.ID)
			return nil
		},
	}
	create.Flags().StringVarP(&name, "name", "n", "", "checkpoint name")
	create.Flags().StringArrayVarP(&labels, "label", "l", nil, "label K=V (repeatable)")

	ls := &cobra.Command{
		Use:     "ls [SANDBOX]",
		Aliases: []string{"list"},
		Short:   "List the checkpoints of a sandbox, or all",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			var cks []agentbox.Checkpoint
			if len(args) == 1 {
				cks, err = c.Sandbox(args[0]).Checkpoints(cmd.Context())
			} else {
				cks, err = c.Checkpoints(cmd.Context())
			}
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), cks)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 3, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSANDBOX\tSIZE\tCREATED\tLABELS")
			for _, ck := range cks {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s ago\t%s\n", ck.ID, ck.Name, ck.SandboxID, humanBytes(ck.SizeBytes),
					humanDuration(time.Since(ck.CreatedAt)), formatKV(ck.Labels))
			}
			return tw.Flush()
		},
	}

	rm := &cobra.Command{
		Use:     "rm CHECKPOINT...",
		Aliases: []string{"delete"},
		Short:   "Delete checkpoints (refused while a sandbox runs on one)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := rootGlobals(cmd).client()
			if err != nil {
				return err
			}
			var errs []error
			for _, id := range args {
				if err := c.DeleteCheckpoint(cmd.Context(), id); err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		},
	}
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
			if g.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "restored %s to checkpoint %s in %d ms\n", args[0], res.Checkpoint, res.DurationMS)
			return nil
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
		Args:  cobra.ExactArgs(1),
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
			var forks []*agentbox.Sandbox
			if _, cerr := c.Checkpoint(cmd.Context(), args[0]); cerr == nil {
				forks, err = c.Fork(cmd.Context(), args[0], n, opts)
			} else if agentbox.IsNotFound(cerr) || agentbox.IsInvalidArgument(cerr) {
				forks, err = c.Sandbox(args[0]).Fork(cmd.Context(), n, opts)
			} else {
				err = cerr
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
