package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func init() { extraCommands = append(extraCommands, replayCmd, compareCmd, artifactCmd) }

func replayCmd() *cobra.Command {
	var req agentbox.ReplayRequest
	var stepTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "replay SANDBOX --checkpoint CK [--run RUN]... [--since SEQ] [--continue] [--ignore PREFIX]... [--keep]",
		Short: "Re-run a sandbox's recorded runs from a checkpoint in a fresh fork and report where they diverge",
		Long: `Fork checkpoint CK, re-run SANDBOX's recorded foreground runs (the ones named
with --run, else every one recorded after CK was taken) one by one, and compare
each with its original from the flight record: exit status, output digest, file
effects and packages. Stops at the first divergence unless --continue; exits 1
when a step diverged. The fork is deleted at the end unless --keep.
Not replayed (not recorded): stdin, per-run environment variables, background
processes; secrets are given again by name.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			req.StepTimeoutSeconds = stepTimeout.Seconds()
			res, err := c.Sandbox(args[0]).Replay(cmd.Context(), req)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if g.json {
				if err := printJSON(out, res); err != nil {
					return err
				}
			} else {
				printReplay(out, res)
			}
			if res.Diverged {
				return exitStatus(1)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Checkpoint, "checkpoint", "", "checkpoint id or name to start from (required)")
	f.StringArrayVar(&req.Runs, "run", nil, "recorded run id to replay (repeatable; default: every run after the checkpoint)")
	f.Uint64Var(&req.Since, "since", 0, "only runs recorded after this sequence number")
	f.BoolVar(&req.Continue, "continue", false, "go on after the first divergence")
	f.StringArrayVar(&req.IgnorePaths, "ignore", nil, "path prefix whose file effects are not compared (repeatable)")
	f.DurationVar(&stepTimeout, "step-timeout", 0, "bound of each re-run command (default 5m)")
	f.BoolVar(&req.Keep, "keep", false, "keep the fork the runs were replayed in")
	_ = cmd.MarkFlagRequired("checkpoint")
	return cmd
}

func printReplay(w io.Writer, res agentbox.ReplayResult) {
	kept := "deleted"
	if res.Kept {
		kept = "kept"
	}
	fmt.Fprintf(w, "replay of %s from checkpoint %s in fork %s (%s)\n", res.Sandbox, res.Checkpoint, res.Fork, kept)
	for _, st := range res.Steps {
		state := "same"
		if st.Diverged {
			state = "DIVERGED"
		}
		fmt.Fprintf(w, "%3d  %-8s  %s  %s\n", st.Index, state, st.Original.Run, runText(st.Original))
		for _, d := range st.Differences {
			fmt.Fprintf(w, "       %s\n", d)
		}
	}
	if res.FirstDivergence != nil {
		fmt.Fprintf(w, "first divergence: step %d\n", *res.FirstDivergence)
	} else {
		fmt.Fprintf(w, "no divergence in %d steps\n", len(res.Steps))
	}
}

func runText(s agentbox.RunSummary) string {
	c := s.Command
	if len(s.Args) > 0 {
		c = strings.Join(s.Args, " ")
	}
	if len(c) > 80 {
		c = c[:80] + "..."
	}
	return c
}

func compareCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "compare A B",
		Short: "Compare two sandboxes (typically forks) side by side: their runs and their files",
		Long: `Pair the foreground runs of sandboxes A and B in record order, say how each pair
differs (command, exit status, output digest, file effects) and where they first
diverge, then list the diff of their files from A to B. Exits 1 when they diverge.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.Compare(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if g.json {
				if err := printJSON(out, res); err != nil {
					return err
				}
			} else {
				for _, st := range res.Steps {
					a, b := "-", "-"
					if st.A != nil {
						a = runText(*st.A)
					}
					if st.B != nil {
						b = runText(*st.B)
					}
					state := "same"
					if st.Diverged {
						state = "DIVERGED"
					}
					fmt.Fprintf(out, "%3d  %-8s  %s | %s\n", st.Index, state, a, b)
					for _, d := range st.Differences {
						fmt.Fprintf(out, "       %s\n", d)
					}
				}
				fmt.Fprintf(out, "files %s -> %s:\n", res.A, res.B)
				printDiff(out, res.Diff, false, false)
			}
			if res.Diverged || len(res.Diff.Changes) > 0 {
				return exitStatus(1)
			}
			return nil
		},
	}
}

func artifactCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "artifact SANDBOX PATH [-o FILE]",
		Short: "Fetch a finished file as untrusted sandbox output (to stdout, or FILE)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			a, err := c.Sandbox(args[0]).OpenArtifact(cmd.Context(), args[1])
			if err != nil {
				return err
			}
			defer a.Close()
			var w io.Writer = cmd.OutOrStdout()
			if output != "" && output != "-" {
				f, err := os.OpenFile(output, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			_, err = io.Copy(w, a)
			return err
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "write to FILE (created; an existing file is not overwritten)")
	return cmd
}
