package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func init() {
	extraCommands = append(extraCommands, upgradeCmd, runnersCmd)
}

func upgradeCmd() *cobra.Command {
	var runnerPath string
	var all bool
	cmd := &cobra.Command{
		Use:   "upgrade [--runner PATH] (SANDBOX... | --all)",
		Short: "Swap the guest (runner) of sandboxes for a new agentbox build; files stay untouched",
		Long: `Upgrade moves the in-sandbox agent of existing sandboxes to another
agentbox binary. With --runner, PATH (on this machine) is uploaded to the
daemon, which keeps it only if its self-check passes; without it, sandboxes
move to the daemon's own runner (what new sandboxes get). For each sandbox
the guest and its processes restart on the new runner and must answer with
the expected build; on failure the sandbox runs its previous guest again.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return errors.New("name sandboxes or pass --all (not both)")
			}
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var opts agentbox.UpgradeOptions
			if runnerPath != "" {
				f, err := os.Open(runnerPath)
				if err != nil {
					return err
				}
				fi, err := f.Stat()
				if err != nil {
					f.Close()
					return err
				}
				r, err := c.StageRunner(ctx, f, fi.Size())
				f.Close()
				if err != nil {
					return err
				}
				opts.RunnerHash = r.Hash
				if !g.json {
					fmt.Fprintf(cmd.ErrOrStderr(), "staged runner %s (%s)\n", r.Hash, r.GuestVersion)
				}
			}
			ids := args
			if all {
				sbs, err := c.List(ctx, nil)
				if err != nil {
					return err
				}
				for _, sb := range sbs {
					ids = append(ids, sb.ID())
				}
			}
			var results []api.UpgradeResult
			failed := 0
			for _, id := range ids {
				res, err := c.Sandbox(id).Upgrade(ctx, opts)
				if err != nil {
					failed++
					printError(cmd.ErrOrStderr(), err)
					continue
				}
				results = append(results, res)
				if g.json {
					continue
				}
				if res.Changed {
					fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s -> %s\t%d ms\n", id, res.FromVersion, res.ToVersion, res.DurationMS)
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "%s\talready on %s\n", id, res.ToVersion)
				}
			}
			if g.json {
				if results == nil {
					results = []api.UpgradeResult{}
				}
				if err := printJSON(cmd.OutOrStdout(), results); err != nil {
					return err
				}
			}
			if failed > 0 {
				return exitStatus(exitAgentbox)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&runnerPath, "runner", "", "agentbox binary to upload and run as the guest (default: the daemon's own)")
	cmd.Flags().BoolVar(&all, "all", false, "upgrade every sandbox")
	return cmd
}

func runnersCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "runners",
		Short: "List the guest binaries (runners) in place and the sandboxes running each",
		Args:  cobra.NoArgs,
		RunE: listing[agentbox.Runner]{
			fetch:  noArgs((*agentbox.Client).Runners),
			header: "RUNNER\tBUILD\tDEFAULT\tSANDBOXES",
			row: func(r agentbox.Runner) string {
				def := ""
				if r.Default {
					def = "yes"
				}
				return fmt.Sprintf("%s\t%s\t%s\t%d", r.Hash, r.Build, def, len(r.Sandboxes))
			},
			pad: 2,
		}.run,
	}
}
