package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func createCmd(g *globals) *cobra.Command {
	var sf specFlags
	cmd := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create a sandbox and print its id",
		Long: `Create a sandbox and print its id.

An idle sandbox goes to sleep: a session sandbox (the default) is paused
after 5m and deleted after 30m without activity, a persistent one paused
after 5m and hibernated (every process stopped, files kept) after 30m;
--pause-after, --hibernate-after and --delete-after change the steps
("never" turns one off). Any exec, file or attach call wakes it. Activity
is a call, an open exec or attach stream, or a process still running in
the sandbox (started with "exec -d", or left running by a command:
"server &"): a background server keeps the sandbox awake, and a sandbox paused by hand while one runs is not hibernated or
deleted by the policy. --idle-ignores-background lets the steps apply
while background processes run (pausing freezes them; hibernating and
deleting kill them).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := sf.spec()
			warnLoopback(cmd, sf.allow)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, err := c.Create(cmd.Context(), spec)
			if err != nil {
				return err
			}
			return printResult(cmd, g.json, sb.Info(), sb.ID())
		},
	}
	sf.register(cmd)
	return cmd
}

func lsCmd(g *globals) *cobra.Command {
	var labels []string
	cmd := &cobra.Command{
		Use:     "ls [--label K=V]...",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			want, err := parseKV("--label", labels)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sbs, err := c.List(cmd.Context(), want)
			if err != nil {
				return err
			}
			infos := make([]api.Sandbox, len(sbs))
			for i, sb := range sbs {
				infos[i] = sb.Info()
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), infos)
			}
			// The TENANT column appears when the list holds another
			// tenant's sandboxes (the admin's view on a shared daemon).
			tenants := slices.ContainsFunc(infos, func(s api.Sandbox) bool { return s.Tenant != "" && s.Tenant != api.AdminTenant })
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 3, ' ', 0)
			if tenants {
				fmt.Fprint(tw, "TENANT\t")
			}
			fmt.Fprintln(tw, "ID\tNAME\tTEMPLATE\tSTATE\tCREATED\tLABELS")
			for _, s := range infos {
				if tenants {
					fmt.Fprintf(tw, "%s\t", cmp.Or(s.Tenant, api.AdminTenant))
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s ago\t%s\n", s.ID, cmp.Or(s.Name, "-"), s.Template, s.State,
					humanDuration(time.Since(s.CreatedAt)), formatKV(s.Labels))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "only sandboxes with label KEY=VALUE (repeatable)")
	return cmd
}

func inspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect ID|NAME...",
		Short: "Print sandboxes as JSON (nothing on stdout when none is found)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			infos := []api.Sandbox{}
			var errs []error
			for _, id := range ids {
				sb, err := c.Get(cmd.Context(), id)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				infos = append(infos, sb.Info())
			}
			// Like docker inspect: the sandboxes found, and nothing on
			// stdout when none was.
			if len(infos) > 0 || len(errs) == 0 {
				if err := printJSON(cmd.OutOrStdout(), infos); err != nil {
					return err
				}
			}
			return reportAll(cmd, errs)
		},
	}
}

func rmCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:     "rm [-f] ID|NAME...",
		Aliases: []string{"delete"},
		Short:   "Delete sandboxes (everything in them is killed)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, id := range ids {
				err := c.Sandbox(id).Delete(cmd.Context())
				switch {
				case err == nil:
					fmt.Fprintln(cmd.OutOrStdout(), id)
				case force && agentbox.IsNotFound(err):
				default:
					errs = append(errs, err)
				}
			}
			return reportAll(cmd, errs)
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "ignore sandboxes that do not exist")
	return cmd
}

// reportAll prints all but the last of errs and returns the last, so that
// a verb over several ids reports every failure and still exits 125.
func reportAll(cmd *cobra.Command, errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	for _, err := range errs[:len(errs)-1] {
		printError(cmd.ErrOrStderr(), err)
	}
	return errs[len(errs)-1]
}

func runCmd(g *globals) *cobra.Command {
	var sf specFlags
	var ef execFlags
	var rm bool
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARG...]",
		Short: "Create a sandbox, run a command in it, and exit with its status",
		Long: `Create a sandbox, run CMD in it with its output streamed, and exit with
CMD's exit status. With --rm the sandbox is deleted afterwards, also when
the command fails or is interrupted.

When no daemon is reachable and neither --host nor ` + agentbox.EnvHost + ` is set,
run starts an embedded daemon inside this process (root only); its
sandbox is always deleted at the end.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			spec, err := sf.spec()
			warnLoopback(cmd, sf.allow)
			if err != nil {
				return err
			}
			if argv[0] == "--" {
				argv = argv[1:]
			}
			if len(argv) == 0 {
				return errors.New("run needs a command")
			}
			req, err := ef.request(argv)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			c, stop, err := connect(ctx, cmd, g)
			if err != nil {
				return err
			}
			embedded := stop != nil
			if embedded {
				defer stop()
			}
			sb, err := c.Create(ctx, spec)
			if err != nil {
				return err
			}
			if rm || embedded {
				defer func() {
					dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
					defer cancel()
					if err := sb.Delete(dctx); err != nil && !agentbox.IsNotFound(err) {
						printError(cmd.ErrOrStderr(), err)
					}
				}()
			}
			return runInteractive(ctx, cmd, sb, req, ef.interactive, ef.tty)
		},
	}
	sf.register(cmd)
	cmd.Flags().BoolVar(&rm, "rm", false, "delete the sandbox when the command ends")
	cmd.Flags().BoolVarP(&ef.interactive, "interactive", "i", false, "stream local stdin to the command")
	cmd.Flags().BoolVarP(&ef.tty, "tty", "t", false, "allocate a pseudo-terminal")
	cmd.Flags().StringVarP(&ef.cwd, "workdir", "w", "", "working directory inside the sandbox")
	cmd.Flags().StringVarP(&ef.user, "user", "u", "", "user (name or uid[:gid]) inside the sandbox")
	cmd.Flags().SetInterspersed(false)
	return cmd
}

// connect returns a client for the configured daemon. When no daemon is
// reachable there and the address was not chosen explicitly (--host or
// AGENTBOX_HOST), it starts an embedded daemon and returns its stop
// function (nil otherwise).
func connect(ctx context.Context, cmd *cobra.Command, g *globals) (*agentbox.Client, func(), error) {
	c, err := g.client()
	if err != nil {
		return nil, nil, err
	}
	err = c.Health(ctx)
	if err == nil || !agentbox.IsUnreachable(err) {
		return c, nil, err
	}
	if cmd.Flags().Changed("host") || os.Getenv(agentbox.EnvHost) != "" {
		return nil, nil, err
	}
	if startEmbedded == nil {
		return nil, nil, fmt.Errorf("no daemon is reachable at %s and this build has no embedded daemon: %w", c.Host(), err)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "agentbox: no daemon at %s; starting an embedded one\n", c.Host())
	host, stop, err := startEmbedded(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("starting embedded daemon: %w", err)
	}
	ec, err := agentbox.New(agentbox.WithHost(host))
	if err != nil {
		stop()
		return nil, nil, err
	}
	if err := ec.Health(ctx); err != nil {
		stop()
		return nil, nil, errors.Join(errors.New("embedded daemon does not answer"), err)
	}
	return ec, stop, nil
}
