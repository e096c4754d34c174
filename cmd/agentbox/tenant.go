package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func init() { extraCommands = append(extraCommands, tenantCmd, keyCmd) }

// quotaFlags are the quota flags of tenant create and tenant set.
type quotaFlags struct {
	maxSandboxes int
	cpuSeconds   float64
	period       time.Duration
	disk         string
}

func (f *quotaFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.IntVar(&f.maxSandboxes, "max-sandboxes", 0, "most sandboxes the tenant may hold at once (0: unlimited)")
	fs.Float64Var(&f.cpuSeconds, "cpu-seconds", 0, "CPU seconds the tenant's runs may use per --period (0: unlimited)")
	fs.DurationVar(&f.period, "period", 0, "length of the CPU period, whole seconds, e.g. 1h (0: the daemon's default, 1h)")
	fs.StringVar(&f.disk, "disk", "", "disk the tenant may hold: its sandboxes' disk limits plus the layers of its checkpoints and templates, e.g. 10G (0: unlimited)")
}

// apply sets in q the quotas whose flags were given on the command line and
// leaves the others as they are.
func (f *quotaFlags) apply(cmd *cobra.Command, q *api.Quotas) error {
	changed := cmd.Flags().Changed
	if changed("max-sandboxes") {
		if f.maxSandboxes < 0 {
			return errors.New("--max-sandboxes must not be negative")
		}
		q.MaxSandboxes = f.maxSandboxes
	}
	if changed("cpu-seconds") {
		if f.cpuSeconds < 0 {
			return errors.New("--cpu-seconds must not be negative")
		}
		q.CPUSeconds = f.cpuSeconds
	}
	if changed("period") {
		if f.period < 0 || f.period%time.Second != 0 {
			return fmt.Errorf("--period %s: want a whole number of seconds, e.g. 1h or 90s", f.period)
		}
		q.PeriodSeconds = int64(f.period / time.Second)
	}
	if changed("disk") {
		n, err := parseBytes(f.disk)
		if err != nil {
			return fmt.Errorf("--disk: %w", err)
		}
		q.DiskBytes = n
	}
	return nil
}

func (f *quotaFlags) anyChanged(cmd *cobra.Command) bool {
	for _, name := range []string{"max-sandboxes", "cpu-seconds", "period", "disk"} {
		if cmd.Flags().Changed(name) {
			return true
		}
	}
	return false
}

func tenantCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "tenant",
		Aliases: []string{"tenants"},
		Short:   "Create, list, change and delete tenants and their quotas (admin)",
		Long: `Every object belongs to a tenant; API keys (agentbox key) act for one.
Quotas bound what a tenant may hold or use; an unset or zero quota is
unlimited. Creating, listing, changing and deleting tenants needs the admin
(a client on the daemon's unix socket); a tenant may inspect itself.`,
	}

	var createQuotas quotaFlags
	create := &cobra.Command{
		Use:   "create ID [--max-sandboxes N] [--cpu-seconds X] [--period DURATION] [--disk SIZE]",
		Short: "Create a tenant; prints its id",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			req := api.CreateTenantRequest{ID: args[0]}
			if err := createQuotas.apply(cmd, &req.Quotas); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.CreateTenant(cmd.Context(), req)
			if err != nil {
				return err
			}
			return printResult(cmd, g.json, t, t.ID)
		},
	}
	createQuotas.register(create)

	ls := lsCommand("List tenants and their quotas", listing[api.Tenant]{
		fetch:  noArgs((*agentbox.Client).Tenants),
		doc:    func(ts []api.Tenant) any { return api.TenantList{Tenants: ts} },
		header: "ID\tMAX SANDBOXES\tCPU-SECONDS/PERIOD\tDISK\tCREATED",
		row: func(t api.Tenant) string {
			q := t.Quotas
			maxSb, disk := "-", "-"
			if q.MaxSandboxes > 0 {
				maxSb = strconv.Itoa(q.MaxSandboxes)
			}
			if q.DiskBytes > 0 {
				disk = humanBytes(q.DiskBytes)
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s ago", t.ID, maxSb, cpuQuota(q), disk, humanDuration(time.Since(t.CreatedAt)))
		},
	})

	inspect := &cobra.Command{
		Use:   "inspect ID",
		Short: "Show a tenant with its quotas and current usage as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := rootGlobals(cmd).client()
			if err != nil {
				return err
			}
			t, err := c.Tenant(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), t)
		},
	}

	var setQuotas quotaFlags
	set := &cobra.Command{
		Use:   "set ID [--max-sandboxes N] [--cpu-seconds X] [--period DURATION] [--disk SIZE]",
		Short: "Change the quotas given; the others keep their values (0 makes one unlimited)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			if !setQuotas.anyChanged(cmd) {
				return errors.New("nothing to change: give at least one of --max-sandboxes, --cpu-seconds, --period, --disk")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			// The daemon replaces the quotas as a whole: start from the
			// current ones. A concurrent change between the two calls is
			// overwritten.
			t, err := c.Tenant(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			q := t.Quotas
			if err := setQuotas.apply(cmd, &q); err != nil {
				return err
			}
			if t, err = c.UpdateTenant(cmd.Context(), args[0], q); err != nil {
				return err
			}
			return printResult(cmd, g.json, t, t.ID)
		},
	}
	setQuotas.register(set)

	rm := removeCommand("rm ID...", "Delete tenants that own no sandbox, with their keys, schedules, webhooks, checkpoints, templates, secrets and runs", removeQuiet, (*agentbox.Client).DeleteTenant)

	cmd.AddCommand(create, ls, inspect, set, rm)
	return cmd
}

// cpuQuota renders the CPU quota as "SECONDS/PERIOD", e.g. "600/1h", or "-".
func cpuQuota(q api.Quotas) string {
	if q.CPUSeconds <= 0 {
		return "-"
	}
	period := q.PeriodSeconds
	if period <= 0 {
		period = api.DefaultQuotaPeriodSeconds
	}
	return strconv.FormatFloat(q.CPUSeconds, 'f', -1, 64) + "/" + shortDuration(time.Duration(period)*time.Second)
}

// shortDuration renders d without trailing zero units: "1h", "1h30m",
// "2m", "1m30s".
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func keyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "key",
		Aliases: []string{"keys"},
		Short:   "Create, list and revoke API keys",
		Long: `An API key lets a client over TCP act for one tenant, with scope full
(every route) or read (GET routes only). The key is shown once, when created;
the daemon keeps only its hash.`,
	}

	var req api.CreateAPIKeyRequest
	create := &cobra.Command{
		Use:   "create [--tenant T] [--scope full|read] [--name N]",
		Short: "Create an API key; prints the key alone on stdout (shown only this once)",
		Example: `  KEY=$(agentbox key create --tenant acme --scope read --name ci)
  AGENTBOX_HOST=http://HOST:PORT AGENTBOX_API_KEY=$KEY agentbox ls`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			k, err := c.CreateAPIKey(cmd.Context(), req)
			if err != nil {
				return err
			}
			if g.json {
				err = printJSON(cmd.OutOrStdout(), k)
			} else {
				_, err = fmt.Fprintln(cmd.OutOrStdout(), k.Key)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "API key %s (tenant %s, scope %s) is shown only this once: store it now\n", k.ID, k.Tenant, k.Scope)
			return err
		},
	}
	create.Flags().StringVar(&req.Tenant, "tenant", "", "tenant the key acts for (default: the caller's own; only the admin may name another)")
	create.Flags().StringVar(&req.Scope, "scope", "", "full (every route, the default) or read (GET routes only)")
	create.Flags().StringVar(&req.Name, "name", "", "free-form label shown by key ls")

	ls := lsCommand("List API keys, revoked ones included (never the keys themselves)", listing[api.APIKey]{
		fetch:  noArgs((*agentbox.Client).APIKeys),
		doc:    func(keys []api.APIKey) any { return api.APIKeyList{Keys: keys} },
		header: "ID\tTENANT\tSCOPE\tNAME\tCREATED\tREVOKED",
		row: func(k api.APIKey) string {
			name, revoked := k.Name, "-"
			if name == "" {
				name = "-"
			}
			if k.RevokedAt != nil {
				revoked = humanDuration(time.Since(*k.RevokedAt)) + " ago"
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s ago\t%s", k.ID, k.Tenant, k.Scope, name, humanDuration(time.Since(k.CreatedAt)), revoked)
		},
	})

	revoke := removeCommand("revoke ID...", "Revoke API keys by id (the abx_<id>_... part); requests using them end within a second",
		removeQuiet, (*agentbox.Client).RevokeAPIKey)
	revoke.Aliases = []string{"rm"}

	cmd.AddCommand(create, ls, revoke)
	return cmd
}
