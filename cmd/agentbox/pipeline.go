package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func init() { extraCommands = append(extraCommands, runsCmd, usageCmd, scheduleCmd, hookCmd) }

func runsCmd() *cobra.Command {
	var q agentbox.RunQuery
	cmd := &cobra.Command{
		Use:   "runs [--sandbox ID] [--trigger api|schedule|webhook|mcp] [--limit N]",
		Short: "List run records of every trigger (API, schedule, webhook, MCP), newest first",
		Args:  cobra.NoArgs,
		RunE: listing[agentbox.Run]{
			fetch: func(ctx context.Context, c *agentbox.Client, _ []string) ([]agentbox.Run, error) {
				return c.Runs(ctx, q)
			},
			doc:    func(runs []agentbox.Run) any { return api.RunList{Runs: runs} },
			header: "RUN\tTRIGGER\tWHO\tSANDBOX\tSTATE\tEXIT\tDURATION\tCPU-S\tMEM-GB-S\tCOMMAND",
			row: func(r agentbox.Run) string {
				return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%.2fs\t%.3f\t%.3f\t%s", r.ID, r.Trigger, r.Who, r.Sandbox, r.State,
					exitText(r), r.DurationSeconds, r.Usage.CPUSeconds, r.Usage.MemoryGBSeconds, clipText(commandText(r.Cmd, r.Command), 40))
			},
			pad: 2,
		}.run,
	}
	cmd.Flags().StringVar(&q.Sandbox, "sandbox", "", "only runs in this sandbox")
	cmd.Flags().StringVar(&q.Trigger, "trigger", "", "only runs of this trigger: api, schedule, webhook or mcp")
	cmd.Flags().IntVar(&q.Limit, "limit", 0, "at most N runs (default 100)")
	return cmd
}

func exitText(r agentbox.Run) string {
	switch {
	case r.State == api.RunRunning:
		return "-"
	case r.TimedOut:
		return "timeout"
	case r.Signal != "":
		return "SIG" + r.Signal
	case r.ExitCode != nil:
		return strconv.Itoa(*r.ExitCode)
	}
	return "error"
}

func commandText(cmd []string, command string) string {
	if command != "" {
		return command
	}
	return strings.Join(cmd, " ")
}

func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

func usageCmd() *cobra.Command {
	var (
		sandbox string
		since   string
		export  bool
	)
	cmd := &cobra.Command{
		Use:   "usage [--sandbox ID] [--since 24h|RFC3339] [--export]",
		Short: "Metered usage (CPU-seconds, memory GB-seconds, egress, runs) per tenant and sandbox, by trigger",
		Long: `Usage sums the run records: CPU-seconds and memory GB-seconds from each
sandbox's cgroup counters during its runs, egress bytes through the egress
proxy, and the number of runs, split by trigger. --export prints one JSON
line per finished run instead (for billing pipelines).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			var from time.Time
			if since != "" {
				if t, err := time.Parse(time.RFC3339, since); err == nil {
					from = t
				} else if d, err := time.ParseDuration(since); err == nil && d > 0 {
					from = time.Now().Add(-d)
				} else {
					return fmt.Errorf("--since: want an RFC 3339 time or a duration such as 24h")
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if export {
				return c.ExportUsage(cmd.Context(), sandbox, from, func(r agentbox.UsageRecord) error { return printJSONLine(out, r) })
			}
			u, err := c.Usage(cmd.Context(), sandbox, from)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(out, u)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SCOPE\tTRIGGER\tRUNS\tCPU-S\tMEM-GB-S\tEGRESS")
			row := func(scope string, t api.UsageTotals) {
				fmt.Fprintf(tw, "%s\tall\t%d\t%.3f\t%.3f\t%s\n", scope, t.Runs, t.CPUSeconds, t.MemoryGBSeconds, humanBytes(t.EgressBytes))
				for _, trig := range []string{api.TriggerAPI, api.TriggerSchedule, api.TriggerWebhook, api.TriggerMCP, api.TriggerE2B, api.TriggerReplay} {
					if bt, ok := t.ByTrigger[trig]; ok {
						fmt.Fprintf(tw, "\t%s\t%d\t%.3f\t%.3f\t%s\n", trig, bt.Runs, bt.CPUSeconds, bt.MemoryGBSeconds, humanBytes(bt.EgressBytes))
					}
				}
			}
			for _, t := range u.Tenants {
				row("tenant "+t.Tenant, t.Totals)
			}
			for _, s := range u.Sandboxes {
				row("sandbox "+s.Sandbox, s.Totals)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&sandbox, "sandbox", "", "only this sandbox's runs")
	cmd.Flags().StringVar(&since, "since", "", "only runs started since (RFC 3339 time or a duration back, e.g. 24h)")
	cmd.Flags().BoolVar(&export, "export", false, "print one JSON line per finished run")
	return cmd
}

// printJSONLine writes v as one line of JSON.
func printJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

// actionFlags are the flags of what a schedule or hook runs.
type actionFlags struct {
	template, name, lifecycle, cwd string
	env                            []string
	timeout                        time.Duration
}

func (f *actionFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.template, "template", "t", "", "template of the sandbox (default: the daemon's)")
	cmd.Flags().StringVar(&f.name, "name", "", "run in the sandbox of this name (created on first use, kept)")
	cmd.Flags().StringVar(&f.lifecycle, "lifecycle", "", "lifecycle of a named sandbox: session or persistent")
	cmd.Flags().StringVarP(&f.cwd, "workdir", "w", "", "working directory inside the sandbox")
	cmd.Flags().StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 0, "kill the command after this long")
}

func (f *actionFlags) action(args []string) (agentbox.RunAction, error) {
	env, err := parseKV("env", f.env)
	if err != nil {
		return agentbox.RunAction{}, err
	}
	a := agentbox.RunAction{Template: f.template, Name: f.name, Lifecycle: f.lifecycle, Cwd: f.cwd, Env: env, TimeoutSeconds: f.timeout.Seconds()}
	if len(args) == 1 {
		a.Command = args[0] // one word: a shell command line
	} else {
		a.Cmd = args
	}
	return a, nil
}

func scheduleCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "schedule",
		Aliases: []string{"schedules"},
		Short:   "Run commands on a cron schedule (through the same pipeline as exec)",
	}
	var (
		af     actionFlags
		cron   string
		tz     string
		missed string
	)
	create := &cobra.Command{
		Use:   "create --cron EXPR [--tz ZONE] [--template T] [--name X --lifecycle persistent] -- CMD [ARG...]",
		Short: "Create a schedule",
		Long: `Create a schedule. EXPR is a 5-field cron expression ("0 9 * * 1": Mondays
at 09:00) or a descriptor (@daily, @every 1h), in time zone ZONE (IANA,
default UTC). Without --name each run gets a fresh sandbox, deleted after
the run; with --name the runs share that sandbox. Slots missed while the
daemon was down are skipped, or run once at start-up with
--missed run_once. A single CMD argument is a shell command line.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			a, err := af.action(args)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := c.CreateSchedule(cmd.Context(), agentbox.CreateScheduleRequest{Cron: cron, Timezone: tz, MissedRunPolicy: missed, RunAction: a})
			if err != nil {
				return err
			}
			return printResult(cmd, g.json, s, s.ID)
		},
	}
	af.register(create)
	create.Flags().StringVar(&cron, "cron", "", "cron expression (required)")
	create.Flags().StringVar(&tz, "tz", "", "IANA time zone of the expression (default UTC)")
	create.Flags().StringVar(&missed, "missed", "", "missed-run policy: skip (default) or run_once")
	_ = create.MarkFlagRequired("cron")

	ls := lsCommand("List schedules", listing[agentbox.Schedule]{
		fetch:  noArgs((*agentbox.Client).Schedules),
		doc:    func(list []agentbox.Schedule) any { return api.ScheduleList{Schedules: list} },
		header: "ID\tCRON\tTZ\tNEXT\tSANDBOX\tLAST RUN\tCOMMAND",
		row: func(s agentbox.Schedule) string {
			next := "-"
			if s.NextRunAt != nil {
				next = s.NextRunAt.Local().Format(time.RFC3339)
			}
			where := s.Name
			if where == "" {
				where = "fresh " + s.Template
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", s.ID, s.Cron, s.Timezone, next, where, s.LastRunID, clipText(commandText(s.Cmd, s.Command), 40))
		},
		pad: 2,
	})
	rm := removeCommand("rm ID...", "Delete schedules", removeEcho, (*agentbox.Client).DeleteSchedule)
	trigger := &cobra.Command{
		Use:   "trigger ID",
		Short: "Run a schedule now (the same path as a cron slot) and print the run",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			r, err := c.TriggerSchedule(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), r)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s exit=%s\n", r.ID, r.State, exitText(r))
			_, err = cmd.OutOrStdout().Write(r.Output)
			return err
		},
	}
	cmd.AddCommand(create, ls, rm, trigger)
	return cmd
}

func hookCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "hook",
		Aliases: []string{"hooks", "webhook"},
		Short:   "Run commands on signed webhook deliveries (through the same pipeline as exec)",
	}
	var af actionFlags
	create := &cobra.Command{
		Use:   "create [--template T] [--name X --lifecycle persistent] -- CMD [ARG...]",
		Short: "Create a webhook and print its id and secret (shown only now)",
		Long: `Create a webhook. Deliveries are POST /v1/hooks/ID, with no API key, signed:
X-Agentbox-Timestamp is the Unix time in seconds (within 5 minutes of the
daemon's) and X-Agentbox-Signature is "sha256=" and the hex HMAC-SHA256,
keyed with the secret, of "<timestamp>.<body>". A signature is accepted
once. The body is the command's stdin.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			a, err := af.action(args)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			h, err := c.CreateHook(cmd.Context(), a)
			if err != nil {
				return err
			}
			return printResult(cmd, g.json, h, h.ID+"\n"+h.Secret)
		},
	}
	af.register(create)
	ls := lsCommand("List webhooks", listing[agentbox.Hook]{
		fetch:  noArgs((*agentbox.Client).Hooks),
		doc:    func(list []agentbox.Hook) any { return api.HookList{Hooks: list} },
		header: "ID\tSANDBOX\tLAST RUN\tCOMMAND",
		row: func(h agentbox.Hook) string {
			where := h.Name
			if where == "" {
				where = "fresh " + h.Template
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s", h.ID, where, h.LastRunID, clipText(commandText(h.Cmd, h.Command), 40))
		},
		pad: 2,
	})
	rm := removeCommand("rm ID...", "Delete webhooks", removeEcho, (*agentbox.Client).DeleteHook)
	cmd.AddCommand(create, ls, rm)
	return cmd
}
