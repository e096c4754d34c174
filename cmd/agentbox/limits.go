package main

import (
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/api"
)

// limitFlags are the create flags of the disk and open-files limits.
type limitFlags struct {
	disk      string
	inodes    int64
	openFiles int64
}

func (f *limitFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.disk, "disk", "", "size of the writable layer, e.g. 1G (ENOSPC inside beyond it; default: the template's or daemon's)")
	fs.Int64Var(&f.inodes, "disk-inodes", 0, "inodes of the writable layer (with --disk)")
	fs.Int64Var(&f.openFiles, "open-files", 0, "open files per process (RLIMIT_NOFILE)")
}

func (f *limitFlags) apply(r *api.Resources) error {
	if f.disk != "" {
		n, err := parseBytes(f.disk)
		if err != nil {
			return fmt.Errorf("--disk: %w", err)
		}
		r.DiskBytes = n
	}
	if f.inodes < 0 || f.openFiles < 0 {
		return fmt.Errorf("--disk-inodes and --open-files must not be negative")
	}
	r.DiskInodes, r.OpenFiles = f.inodes, f.openFiles
	return nil
}

func templatePoolCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "pool [NAME SIZE]",
		Short: "Keep SIZE paused sandboxes of template NAME ready (0 removes the pool); without arguments, list the pools",
		Args: cobra.MatchAll(cobra.MaximumNArgs(2), func(_ *cobra.Command, args []string) error {
			if len(args) == 1 {
				return fmt.Errorf("give NAME and SIZE, or nothing to list the pools")
			}
			return nil
		}),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var pools []api.Pool
			if len(args) == 2 {
				size, err := strconv.Atoi(args[1])
				if err != nil {
					return fmt.Errorf("SIZE %q: %w", args[1], err)
				}
				p, err := c.SetPool(cmd.Context(), args[0], size)
				if err != nil {
					return err
				}
				pools = []api.Pool{p}
			} else if pools, err = c.Pools(cmd.Context()); err != nil {
				return err
			}
			if g.json {
				if pools == nil {
					pools = []api.Pool{}
				}
				return printJSON(cmd.OutOrStdout(), pools)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 3, ' ', 0)
			fmt.Fprintln(tw, "TEMPLATE\tSIZE\tREADY\tFILLING\tCLAIMS")
			for _, p := range pools {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", p.Template, p.Size, p.Ready, p.Filling, p.Claims)
			}
			return tw.Flush()
		},
	}
}
