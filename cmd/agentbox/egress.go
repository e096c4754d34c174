package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func init() { extraCommands = append(extraCommands, egressCmd) }

func egressCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "egress",
		Short: "Show a sandbox's egress records and change its egress policy",
	}
	var limit int
	log := &cobra.Command{
		Use:   "log SANDBOX",
		Short: "List a sandbox's egress connections and intercepted requests, oldest first",
		Args:  cobra.ExactArgs(1),
		RunE: listing[api.EgressRecord]{
			fetch: func(ctx context.Context, c *agentbox.Client, args []string) ([]api.EgressRecord, error) {
				sb, err := c.Get(ctx, args[0])
				if err != nil {
					return nil, err
				}
				return sb.EgressLog(ctx, limit)
			},
			doc:    func(recs []api.EgressRecord) any { return api.EgressLog{Records: recs} },
			header: "TIME\tKIND\tDESTINATION\tREQUEST\tSTATUS\tDECISION\tRULE/REASON\tUP\tDOWN\tCREDENTIALS",
			row: func(r api.EgressRecord) string {
				req, status := strings.TrimSpace(r.Method+" "+r.Path), ""
				if r.Status != 0 {
					status = fmt.Sprint(r.Status)
				}
				why := strings.TrimSpace(r.Rule + " " + r.Reason)
				return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s", r.Time.Local().Format("15:04:05"), r.Kind, r.Destination,
					req, status, r.Decision, why, r.BytesUp, r.BytesDown, strings.Join(r.Credentials, ","))
			},
			pad: 2,
		}.run,
	}
	log.Flags().IntVar(&limit, "limit", 0, "newest N records only")
	rule := func(verb string) *cobra.Command {
		return &cobra.Command{
			Use:   verb + " SANDBOX HOST[:PORT]...",
			Short: "Add " + verb + " rules to a sandbox's egress policy (turns egress mode on)",
			Args:  cobra.MinimumNArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				g := rootGlobals(cmd)
				c, err := g.client()
				if err != nil {
					return err
				}
				sb, err := c.Get(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				spec := api.NetworkSpec{Mode: api.NetworkEgress}
				if cur := sb.Info().Network; cur != nil {
					spec = *cur
					spec.Mode = api.NetworkEgress
				}
				for _, h := range args[1:] {
					list := &spec.Allow
					if verb == "deny" {
						list = &spec.Deny
					}
					if !slices.Contains(*list, h) {
						*list = append(*list, h)
					}
				}
				if err := sb.SetNetwork(cmd.Context(), spec); err != nil {
					return err
				}
				if g.json {
					return printJSON(cmd.OutOrStdout(), sb.Info())
				}
				return nil
			},
		}
	}
	cmd.AddCommand(log, rule("allow"), rule("deny"))
	return cmd
}
