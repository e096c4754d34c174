package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func init() {
	extraCommands = append(extraCommands, diffCmd, mergeCmd)
}

func diffCmd() *cobra.Command {
	var unified, stat, withIdentity bool
	cmd := &cobra.Command{
		Use:   "diff [--unified] [--include-identity] FROM TO",
		Short: "Show the changes between two sandboxes, checkpoints or templates",
		Long: `Show the paths added, modified and deleted between two filesystem states.
FROM and TO are sandbox ids, checkpoint ids or template names, or prefixed refs:
sandbox:<id|name>, checkpoint:<id|name>, template:<name>[@<version>].
The identity files each fork gets fresh (/etc/machine-id,
/var/lib/systemd/random-seed) are left out unless --include-identity.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			d, err := c.DiffWith(cmd.Context(), args[0], args[1], agentbox.DiffOptions{Unified: unified, IncludeIdentity: withIdentity})
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), d)
			}
			printDiff(cmd.OutOrStdout(), d, unified, stat)
			return nil
		},
	}
	cmd.Flags().BoolVarP(&unified, "unified", "u", false, "show unified diffs of small text files")
	cmd.Flags().BoolVar(&stat, "stat", false, "print only the summary")
	cmd.Flags().BoolVar(&withIdentity, "include-identity", false, "also compare /etc/machine-id and /var/lib/systemd/random-seed")
	return cmd
}

func printDiff(w io.Writer, d agentbox.Diff, unified, stat bool) {
	if !stat {
		for _, c := range d.Changes {
			mark := map[string]string{api.ChangeAdded: "A", api.ChangeModified: "M", api.ChangeDeleted: "D"}[c.Change]
			meta := c.To
			if meta == nil {
				meta = c.From
			}
			detail := fmt.Sprintf("%s %04o %d:%d", meta.Type, meta.Mode, meta.UID, meta.GID)
			if meta.Type == "file" {
				detail += " " + humanBytes(meta.Size)
			}
			if meta.Target != "" {
				detail += " -> " + meta.Target
			}
			fmt.Fprintf(w, "%s %s\t(%s)\n", mark, c.Path, detail)
			if unified && c.Unified != "" {
				fmt.Fprint(w, c.Unified)
			} else if unified && c.Binary {
				fmt.Fprintf(w, "Binary files differ\n")
			}
		}
	}
	fmt.Fprintf(w, "%s -> %s: %d added, %d modified, %d deleted\n", d.From, d.To, d.Added, d.Modified, d.Deleted)
}

func mergeCmd() *cobra.Command {
	var strategy string
	var resolutions []string
	var dryRun, withIdentity bool
	cmd := &cobra.Command{
		Use:   "merge [--strategy fail|ours|theirs] [--resolve PATH=ours|theirs]... FROM INTO",
		Short: "Merge the changes of sandbox FROM into sandbox INTO (three-way, against their fork point)",
		Long: `Apply the changes FROM made since its fork point with INTO (one was forked from
the other, or both from one checkpoint). Paths both changed differently are
conflicts: unless --strategy or --resolve chooses a side for each, nothing is
applied, the conflicts are listed and merge exits with status 1 (125 for
any other failure). INTO is checkpointed first; a failed merge restores it.
The identity files each fork gets fresh (/etc/machine-id,
/var/lib/systemd/random-seed) take no part unless --include-identity.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			res, err := parseKV("--resolve", resolutions)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			r, err := c.Sandbox(args[1]).Merge(cmd.Context(), args[0], agentbox.MergeOptions{Strategy: strategy, Resolutions: res, DryRun: dryRun, IncludeIdentity: withIdentity})
			var mce *agentbox.MergeConflictError
			if errors.As(err, &mce) {
				if g.json {
					_ = printJSON(cmd.OutOrStdout(), api.MergeResult{Conflicts: mce.Conflicts, Applied: []api.DiffChange{}})
				} else {
					printConflicts(cmd.OutOrStdout(), mce.Conflicts)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "agentbox: %d conflicting paths; nothing was applied (use --strategy ours|theirs or --resolve PATH=ours|theirs)\n", len(mce.Conflicts))
				return exitStatus(exitMergeConflict)
			}
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), r)
			}
			w := cmd.OutOrStdout()
			for _, a := range r.Applied {
				fmt.Fprintf(w, "%s %s\n", map[string]string{api.ChangeAdded: "A", api.ChangeModified: "M", api.ChangeDeleted: "D"}[a.Change], a.Path)
			}
			if len(r.Conflicts) > 0 {
				printConflicts(w, r.Conflicts)
			}
			verb := "applied"
			if dryRun {
				verb = "would apply"
			}
			fmt.Fprintf(w, "%s %d changes from %s (base checkpoint %s, %d conflicts resolved)", verb, len(r.Applied), args[0], r.Base, len(r.Conflicts))
			if r.Checkpoint != "" {
				fmt.Fprintf(w, "; undo with: agentbox restore %s %s", args[1], r.Checkpoint)
			}
			fmt.Fprintln(w)
			return nil
		},
	}
	cmd.Flags().StringVar(&strategy, "strategy", "fail", "conflicts: fail, ours (keep INTO's) or theirs (take FROM's)")
	cmd.Flags().StringArrayVar(&resolutions, "resolve", nil, "PATH=ours|theirs for one conflicting path (repeatable)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "report what would be applied and the conflicts; change nothing")
	cmd.Flags().BoolVar(&withIdentity, "include-identity", false, "also merge /etc/machine-id and /var/lib/systemd/random-seed (each fork's own by default)")
	return cmd
}

// exitMergeConflict is merge's exit status when conflicts were left
// unresolved (nothing applied), as its help says.
const exitMergeConflict = 1

func printConflicts(w io.Writer, cs []api.MergeConflict) {
	side := func(m *api.FileMeta) string {
		if m == nil {
			return "deleted"
		}
		s := m.Type
		if m.SHA256 != "" {
			s += " " + m.SHA256[:12]
		}
		return s
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONFLICT\tOURS (INTO)\tTHEIRS (FROM)")
	for _, c := range cs {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Path, side(c.Ours), side(c.Theirs))
	}
	tw.Flush()
}

func templateSaveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "save SANDBOX NAME",
		Short: "Freeze a sandbox's filesystem as a new immutable version of template NAME",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.Sandbox(args[0]).SaveTemplate(cmd.Context(), args[1])
			if err != nil {
				return err
			}
			return printResult(cmd, g.json, v, fmt.Sprintf("%s (tree hash %s)", agentbox.TemplateRef(v.Name, v.Version), v.TreeHash))
		},
	}
}

func templateVersionsCmd(_ *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "versions NAME",
		Short: "List the versions of a saved template",
		Args:  cobra.ExactArgs(1),
		RunE: listing[agentbox.TemplateVersion]{
			fetch: func(ctx context.Context, c *agentbox.Client, args []string) ([]agentbox.TemplateVersion, error) {
				return c.TemplateVersions(ctx, args[0])
			},
			header: "VERSION\tID\tTREE HASH\tSIZE\tSOURCE\tCREATED",
			row: func(v agentbox.TemplateVersion) string {
				return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s ago", agentbox.TemplateRef(v.Name, v.Version), v.ID[:12], v.TreeHash[:16],
					humanBytes(v.SizeBytes), v.Source, humanDuration(time.Since(v.CreatedAt)))
			},
		}.run,
	}
}
