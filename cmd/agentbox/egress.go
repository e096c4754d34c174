package main

import (
	"context"
	"fmt"
	"net"
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
		Long: `Show a sandbox's egress records and change its egress policy.

In egress mode a sandbox reaches the network only through the host-side
proxy (HTTP_PROXY and HTTPS_PROXY point at it), for the hosts its allow
rules name. 127.0.0.1 and localhost inside are the sandbox's own loopback
(and in NO_PROXY, so a plain curl to them never reaches the proxy). The
host's own loopback is named host.agentbox.internal: to reach a service on
the host's 127.0.0.1:8080, run the daemon with --egress-permit
127.0.0.1:8080 (internal addresses are unreachable otherwise), allow
host.agentbox.internal:8080 and connect to http://host.agentbox.internal:8080.`,
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
				if verb == "allow" {
					warnLoopback(cmd, args[1:])
				}
				return updateNetwork(cmd, args[0], func(spec *api.NetworkSpec) error {
					for _, h := range args[1:] {
						list := &spec.Allow
						if verb == "deny" {
							list = &spec.Deny
						}
						if !slices.Contains(*list, h) {
							*list = append(*list, h)
						}
					}
					return nil
				})
			},
		}
	}
	cmd.AddCommand(log, rule("allow"), rule("deny"), credentialCmd())
	return cmd
}

// updateNetwork applies change to sandbox id's network spec (turning
// egress mode on) and stores it; it prints the sandbox with --json.
func updateNetwork(cmd *cobra.Command, id string, change func(spec *api.NetworkSpec) error) error {
	g := rootGlobals(cmd)
	c, err := g.client()
	if err != nil {
		return err
	}
	sb, err := c.Get(cmd.Context(), id)
	if err != nil {
		return err
	}
	spec := api.NetworkSpec{Mode: api.NetworkEgress}
	if cur := sb.Info().Network; cur != nil {
		spec = api.NetworkSpec{Mode: api.NetworkEgress, Allow: slices.Clone(cur.Allow), Deny: slices.Clone(cur.Deny), Credentials: slices.Clone(cur.Credentials)}
	}
	if err := change(&spec); err != nil {
		return err
	}
	if err := sb.SetNetwork(cmd.Context(), spec); err != nil {
		return err
	}
	if g.json {
		return printJSON(cmd.OutOrStdout(), sb.Info())
	}
	return nil
}

// credentialCmd is `egress credential`: the credential rules of a
// sandbox's egress policy (api.CredentialRule).
func credentialCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "credential",
		Aliases: []string{"credentials", "cred"},
		Short:   "Add, list and remove the rules that inject stored secrets into a sandbox's HTTPS requests",
		Long: `Credential rules make the egress proxy attach a stored secret (agentbox
secret set) to HTTPS requests from the sandbox to one host: the proxy
terminates TLS with the sandbox's own CA and sets the header, so the
sandbox never sees the value. The host is allowed implicitly (a deny rule
still wins). Adding a rule turns egress mode on.`,
	}
	var rule api.CredentialRule
	add := &cobra.Command{
		Use:   "add SANDBOX SECRET HOST",
		Short: "Inject stored secret SECRET into requests to HOST (replaces a rule for the same secret, host and port)",
		Example: `  printf %s "$GITHUB_TOKEN" | agentbox secret set gh
  agentbox egress credential add web1 gh api.github.com
  agentbox egress credential add web1 openai api.openai.com --header Authorization --format 'Bearer {secret}'`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			r := rule
			r.Secret, r.Host = args[1], args[2]
			return updateNetwork(cmd, args[0], func(spec *api.NetworkSpec) error {
				spec.Credentials = slices.DeleteFunc(spec.Credentials, func(c api.CredentialRule) bool {
					return c.Secret == r.Secret && c.Host == r.Host && port443(c.Port) == port443(r.Port)
				})
				spec.Credentials = append(spec.Credentials, r)
				return nil
			})
		},
	}
	fs := add.Flags()
	fs.IntVar(&rule.Port, "port", 0, "destination port (default 443)")
	fs.StringVar(&rule.Header, "header", "", `header to set (default "Authorization")`)
	fs.StringVar(&rule.Format, "format", "", `header value, {secret} standing for the value (default "Bearer {secret}")`)
	fs.StringArrayVar(&rule.Methods, "method", nil, "only requests with this method (repeatable; default every method)")
	fs.StringVar(&rule.PathPrefix, "path-prefix", "", "only requests whose path starts with this (default every path)")

	var rmPort int
	rm := &cobra.Command{
		Use:   "rm SANDBOX SECRET HOST",
		Short: "Remove the rule injecting SECRET into requests to HOST",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			return updateNetwork(cmd, args[0], func(spec *api.NetworkSpec) error {
				n := len(spec.Credentials)
				spec.Credentials = slices.DeleteFunc(spec.Credentials, func(c api.CredentialRule) bool {
					return c.Secret == args[1] && c.Host == args[2] && (rmPort == 0 || port443(c.Port) == rmPort)
				})
				if len(spec.Credentials) == n {
					return fmt.Errorf("sandbox %s has no credential rule for secret %s and host %s", args[0], args[1], args[2])
				}
				return nil
			})
		},
	}
	rm.Flags().IntVar(&rmPort, "port", 0, "only the rule for this port (default: the rules for every port)")

	ls := &cobra.Command{
		Use:   "ls SANDBOX",
		Short: "List a sandbox's credential rules (secret names only, never values)",
		Args:  cobra.ExactArgs(1),
		RunE: listing[api.CredentialRule]{
			fetch: func(ctx context.Context, c *agentbox.Client, args []string) ([]api.CredentialRule, error) {
				sb, err := c.Get(ctx, args[0])
				if err != nil {
					return nil, err
				}
				if n := sb.Info().Network; n != nil {
					return n.Credentials, nil
				}
				return nil, nil
			},
			header: "SECRET\tDESTINATION\tHEADER\tFORMAT\tMETHODS\tPATH PREFIX",
			row: func(r api.CredentialRule) string {
				header, format := r.Header, r.Format
				if header == "" {
					header = "Authorization"
				}
				if format == "" {
					format = "Bearer {secret}"
				}
				methods := strings.Join(r.Methods, ",")
				if methods == "" {
					methods = "*"
				}
				return fmt.Sprintf("%s\t%s:%d\t%s\t%s\t%s\t%s", r.Secret, r.Host, port443(r.Port), header, format, methods, r.PathPrefix)
			},
		}.run,
	}
	cmd.AddCommand(add, ls, rm)
	return cmd
}

// port443 is a credential rule's port: 0 means 443.
func port443(p int) int {
	if p == 0 {
		return 443
	}
	return p
}

// warnLoopback tells, on stderr, that an allow rule naming loopback
// (127.0.0.1, ::1, localhost) does not reach the host from inside, where
// those are the sandbox's own and in NO_PROXY.
func warnLoopback(cmd *cobra.Command, allow []string) {
	for _, h := range allow {
		host := h
		if hh, _, err := net.SplitHostPort(h); err == nil {
			host = hh
		}
		host = strings.Trim(host, "[]")
		ip := net.ParseIP(host)
		if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			continue
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "agentbox: note: --allow-host %s: inside the sandbox %s is its own loopback (and in NO_PROXY); "+
			"the host's loopback is host.agentbox.internal (allow host.agentbox.internal[:PORT]; the daemon must --egress-permit 127.0.0.1[:PORT])\n", h, host)
	}
}
