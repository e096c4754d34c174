package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/api"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func init() { extraCommands = append(extraCommands, eventsCmd, auditCmd) }

func eventsCmd() *cobra.Command {
	var (
		follow, jsonl bool
		q             agentbox.EventQuery
		since, until  string
	)
	cmd := &cobra.Command{
		Use:   "events SANDBOX",
		Short: "Show a sandbox's flight record: its runs, file, package and network effects, lifecycle and bridge events",
		Long: `Show a sandbox's flight record, oldest first: every command run (with
its exit, output digest and a redacted excerpt), the files and packages it
changed, the egress proxy's decisions, checkpoints, restores, forks and
every state transition, limit events, and the events programs inside sent
through the API bridge. A deleted sandbox's record stays readable for the
daemon's retention period. See docs/AUDIT.md.

  agentbox events SANDBOX                   table
  agentbox events SANDBOX -f                follow new events as they happen
  agentbox events SANDBOX --kind run,file.changed --run RUN_ID
  agentbox events SANDBOX --jsonl > x.jsonl export as JSON lines`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, p := range []struct {
				s string
				t *time.Time
			}{{since, &q.Since}, {until, &q.Until}} {
				if p.s == "" {
					continue
				}
				if *p.t, err = parseWhen(p.s); err != nil {
					return err
				}
			}
			sb := c.Sandbox(args[0])
			out := cmd.OutOrStdout()
			ctx := cmd.Context()
			switch {
			case follow:
				s, err := sb.FollowEvents(ctx, q)
				if err != nil {
					return err
				}
				defer s.Close()
				for {
					ev, err := s.Next()
					if errors.Is(err, io.EOF) || ctx.Err() != nil {
						return nil
					}
					if err != nil {
						return err
					}
					if g.json || jsonl {
						err = printJSONLine(out, ev)
					} else {
						_, err = fmt.Fprintln(out, eventLine(ev))
					}
					if err != nil {
						return err
					}
				}
			case jsonl:
				return sb.ExportEvents(ctx, q, out)
			}
			evs, err := sb.QueryEvents(ctx, q)
			if err != nil {
				return err
			}
			if g.json {
				if evs == nil {
					evs = []agentbox.SandboxEvent{}
				}
				return printJSON(out, api.SandboxEventList{Events: evs})
			}
			for _, ev := range evs {
				if _, err := fmt.Fprintln(out, eventLine(ev)); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&follow, "follow", "f", false, "print new events as they are recorded, until the sandbox is deleted or ^C")
	f.StringSliceVar(&q.Types, "kind", nil, "only events of these types (repeatable or comma-separated; \"run\" is run.started and run.ended)")
	f.StringVar(&q.Run, "run", "", "only the events of this run")
	f.StringVar(&since, "since", "", "only events at or after this time (RFC 3339, or a duration ago such as 10m)")
	f.StringVar(&until, "until", "", "only events at or before this time (RFC 3339, or a duration ago)")
	f.IntVar(&q.Limit, "limit", 0, "at most this many events (0: all)")
	f.BoolVar(&jsonl, "jsonl", false, "print JSON lines, one event per line (export)")
	return cmd
}

// parseWhen reads an RFC 3339 time or a duration before now.
func parseWhen(s string) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return t, fmt.Errorf("%q is neither an RFC 3339 time nor a duration", s)
	}
	return t, nil
}

// eventLine renders one event as a line: sequence number, time, run,
// type and what happened.
func eventLine(ev agentbox.SandboxEvent) string {
	run := ev.RunID
	if run == "" {
		run = "-"
	}
	var what string
	switch {
	case ev.Run != nil && ev.Type == api.EventRunStarted:
		what = fmt.Sprintf("%q", ev.Run.Command)
		if len(ev.Run.Credentials) > 0 {
			what += " secrets=" + strings.Join(ev.Run.Credentials, ",")
		}
	case ev.Run != nil:
		what = ev.Run.Outcome
		if ev.Run.ExitCode != nil {
			what += fmt.Sprintf(" exit=%d", *ev.Run.ExitCode)
		}
		if ev.Run.Signal != "" {
			what += " signal=" + ev.Run.Signal
		}
		what += fmt.Sprintf(" %.0fms out=%dB", ev.Run.DurationMS, ev.Run.OutputBytes)
	case ev.File != nil:
		what = ev.File.Change + " " + ev.File.Path
		if ev.File.Kind != "" && ev.File.Kind != "file" {
			what += " (" + ev.File.Kind + ")"
		}
	case ev.Package != nil:
		what = fmt.Sprintf("%s %s %s %s", ev.Package.Manager, ev.Package.Action, ev.Package.Name, ev.Package.Version)
	case ev.Egress != nil:
		what = fmt.Sprintf("%s %s %s", ev.Egress.Decision, ev.Egress.Kind, ev.Egress.Destination)
		if ev.Egress.Path != "" {
			what += " " + ev.Egress.Method + " " + ev.Egress.Path
		}
	case ev.Transition != nil:
		what = fmt.Sprintf("%s -> %s (%s)", ev.Transition.From, ev.Transition.To, ev.Transition.Cause)
	case ev.Dropped != nil:
		what = fmt.Sprintf("%d events dropped since %s", ev.Dropped.Count, ev.Dropped.Since.Local().Format(time.TimeOnly))
	case ev.Message != "":
		what = fmt.Sprintf("%q", ev.Message)
	case ev.Name != "":
		what = fmt.Sprintf("%s=%g", ev.Name, ev.Value)
	default:
		what = ev.Detail
	}
	if ev.Error != "" {
		what += " error=" + fmt.Sprintf("%q", ev.Error)
	}
	return fmt.Sprintf("%d\t%s\t%s\t%s\t%s", ev.Seq, ev.Time.Local().Format("15:04:05.000"), run, ev.Type, what)
}

func auditCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Check the flight recorder's records",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "verify [SANDBOX]",
		Short: "Verify a sandbox's flight record (every record you see, without SANDBOX): hash chain and signed heads",
		Long: `Verify the flight record of SANDBOX, or of every sandbox you see
(deleted ones within their retention included): every record links to the
hash of the one before, its own hash matches its content, and the daemon's
signed heads match the chain and are not beyond its end. An edited,
deleted or reordered record, or a truncated tail, fails the check; the
command then exits 1 and names the first problem.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g := rootGlobals(cmd)
			c, err := g.client()
			if err != nil {
				return err
			}
			var results []agentbox.AuditVerifyResult
			if len(args) == 1 {
				res, err := c.Sandbox(args[0]).VerifyAudit(cmd.Context())
				if err != nil {
					return err
				}
				results = []agentbox.AuditVerifyResult{res}
			} else if results, err = c.VerifyAudit(cmd.Context()); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			bad := 0
			for _, r := range results {
				if !r.OK {
					bad++
				}
			}
			if g.json {
				if results == nil {
					results = []agentbox.AuditVerifyResult{}
				}
				if err := printJSON(out, api.AuditVerifyList{Results: results}); err != nil {
					return err
				}
			} else {
				for _, r := range results {
					state := "ok"
					if !r.OK {
						state = "FAILED: " + r.Problem
					}
					deleted := ""
					if r.Deleted {
						deleted = " (deleted)"
					}
					fmt.Fprintf(out, "%s%s\t%d events, signed through %d\t%s\n", r.SandboxID, deleted, r.Events, r.Signed, state)
				}
			}
			if bad > 0 {
				return fmt.Errorf("%d of %d records do not verify", bad, len(results))
			}
			return nil
		},
	})
	return cmd
}
