package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
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

func templatePoolCmd(_ *globals) *cobra.Command {
	var rt string
	cmd := &cobra.Command{
		Use:   "pool [NAME SIZE]",
		Short: "Keep SIZE paused sandboxes of template NAME ready (0 removes the pool); without arguments, list the pools",
		Long: "Keep SIZE paused sandboxes of template NAME ready on a backend (--runtime; default: the one a create of the template naming none runs on); " +
			"a create of NAME that runs on that backend, with default resources, no network policy and no hostname, claims one. " +
			"A template may have a pool per backend. 0 removes the pool; without arguments, list the pools.",
		Args: cobra.MatchAll(cobra.MaximumNArgs(2), func(_ *cobra.Command, args []string) error {
			if len(args) == 1 {
				return fmt.Errorf("give NAME and SIZE, or nothing to list the pools")
			}
			if len(args) == 0 && rt != "" {
				return fmt.Errorf("--runtime sets a pool: give NAME and SIZE")
			}
			return nil
		}),
		RunE: listing[api.Pool]{
			fetch: func(ctx context.Context, c *agentbox.Client, args []string) ([]api.Pool, error) {
				if len(args) == 0 {
					return c.Pools(ctx)
				}
				size, err := strconv.Atoi(args[1])
				if err != nil {
					return nil, fmt.Errorf("SIZE %q: %w", args[1], err)
				}
				p, err := c.SetPool(ctx, args[0], size, agentbox.PoolRuntime(rt))
				if err != nil {
					return nil, err
				}
				return []api.Pool{p}, nil
			},
			header: "TEMPLATE\tRUNTIME\tSIZE\tREADY\tFILLING\tCLAIMS",
			row: func(p api.Pool) string {
				return fmt.Sprintf("%s\t%s\t%d\t%d\t%d\t%d", p.Template, p.Runtime, p.Size, p.Ready, p.Filling, p.Claims)
			},
		}.run,
	}
	cmd.Flags().StringVar(&rt, "runtime", "", "backend of the pool's sandboxes, one of those \"agentbox info\" lists (default: the template's, else the daemon's)")
	return cmd
}
