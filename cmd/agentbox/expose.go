package main

import (
	"context"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func init() { extraCommands = append(extraCommands, exposeCmd) }

func exposeCmd() *cobra.Command {
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "expose SANDBOX PORT [--ttl D]",
		Short: "Give a port inside a sandbox an authenticated URL (service URL); ls and rm manage them",
		Long: `Make the service listening on PORT inside SANDBOX reachable over HTTP and
WebSocket through the daemon's TCP listener, and print its URL and token.

Send the token as the X-Agentbox-Token header (or "Authorization: Bearer"),
or open the browser URL: its parameter is good for 10 minutes and is
exchanged for a cookie scoped to the service. A request to a paused or
hibernated sandbox wakes it. The token ends with --ttl (default 24h), with
"agentbox expose rm ID", or when the sandbox is deleted.
See docs/SERVICE-URLS.md.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			port, err := parsePortArg(args[1])
			if err != nil {
				return err
			}
			if ttl < 0 || (ttl > 0 && ttl < time.Second) {
				return fmt.Errorf("--ttl %s: want 1s or more (0: the daemon's default)", ttl)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			x, err := c.Sandbox(args[0]).Expose(cmd.Context(), port, ttl)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), x)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintf(tw, "ID\t%s\n", x.ID)
			if x.URL != "" {
				fmt.Fprintf(tw, "URL\t%s\n", x.URL)
			}
			fmt.Fprintf(tw, "PATH\t%s\n", x.Path)
			fmt.Fprintf(tw, "TOKEN\t%s\n", x.Token)
			if x.BrowserURL != "" {
				fmt.Fprintf(tw, "BROWSER\t%s\n", x.BrowserURL)
			}
			fmt.Fprintf(tw, "EXPIRES\t%s\n", x.ExpiresAt.Local().Format(time.DateTime))
			return tw.Flush()
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "how long the URL and its token live (default 24h, at most 720h)")
	ls := &cobra.Command{
		Use:     "ls [SANDBOX]",
		Aliases: []string{"list"},
		Short:   "List live exposures (tokens are shown only by expose)",
		Args:    cobra.MaximumNArgs(1),
		RunE: listing[agentbox.Exposure]{
			fetch: func(ctx context.Context, c *agentbox.Client, args []string) ([]agentbox.Exposure, error) {
				if len(args) == 1 {
					return c.Sandbox(args[0]).Exposures(ctx)
				}
				return c.ListExposures(ctx)
			},
			doc:    func(l []agentbox.Exposure) any { return api.ExposureList{Exposures: l} },
			header: "ID\tSANDBOX\tPORT\tEXPIRES\tURL",
			row: func(x agentbox.Exposure) string {
				u := x.URL
				if u == "" {
					u = x.Path
				}
				return fmt.Sprintf("%s\t%s\t%d\t%s\t%s", x.ID, x.Sandbox, x.Port, x.ExpiresAt.Local().Format(time.DateTime), u)
			},
		}.run,
	}
	rm := removeCommand("rm ID...", "Revoke exposures: their tokens stop working at once", removeQuiet, (*agentbox.Client).RevokeExposure)
	rm.Aliases = append(rm.Aliases, "revoke")
	link := &cobra.Command{
		Use:   "link ID",
		Short: "Print a fresh browser link (10 minutes) for an exposure",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			x, err := c.ExposureLink(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printResult(cmd, g.json, x, x.BrowserURL)
		},
	}
	cmd.AddCommand(ls, rm, link)
	return cmd
}

// parsePortArg parses a port in its one canonical spelling (1..65535, no
// sign, no leading zero), as the daemon does.
func parsePortArg(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != s {
		return 0, fmt.Errorf("port %q: want a number from 1 to 65535", s)
	}
	return n, nil
}
